#!/usr/bin/env bash
# The main job on NVIDIA GPUs (the CUDA toolkit, NCCL and an MPI must be installed; nvcc on PATH): GPT-2
# 124M in bf16 trained on every visible GPU (one MPI rank each, ZeRO stage 2, overlapped reduction)
# with asynchronous checkpoints; resharded to 1 rank at ZeRO stage 3 and resumed on one GPU;
# consolidated to bf16 safetensors; evaluated; a report of the run; and, where Python has transformers,
# a line of text generated from the export. A few minutes, most of it the build. RUN_DIR (default
# runs/quickstart-gpu) receives everything.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # mpirun as root (containers)
export NCCL_NVLS_ENABLE=0                                          # see docs/ARCHITECTURE.md
run=${RUN_DIR:-runs/quickstart-gpu}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say() { printf '   %s\n' "$*"; }
gpus=$(nvidia-smi --list-gpus | wc -l)
[ "$gpus" -ge 1 ] || { echo "quickstart-gpu: no GPU visible (nvidia-smi)" >&2; exit 1; }

step "1. Build with CUDA (build/; SHARDKIT_CUDA is on where nvcc is found)"
command -v nvcc > /dev/null || { echo "quickstart-gpu: nvcc not on PATH" >&2; exit 1; }
BUILD_TARGET=shardkit ./scripts/build.sh > /dev/null
sk=build/shardkit
say "built $($sk --version); $gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs)"

rm -rf "$run"
mkdir -p "$run"
step "2. Tokenize the sample text and the documentation, byte-level (GPT-2's windows are 1025 tokens)"
cat samples/data/checkpoints.txt README.md docs/*.md > "$run/text.txt"
$sk data encode "$run/text.txt" -o "$run/text.bin"

step "3. Train GPT-2 124M (bf16) on $gpus GPU(s) at ZeRO stage 2: 200 steps, an asynchronous checkpoint every 50"
mpirun -n "$gpus" --bind-to none $sk train --device cuda --config samples/configs/gpu_bf16_zero2.json --model gpt2 \
  --data "$run/text.bin" --steps 200 --save-interval 50 --save-dir "$run/ckpt" --metrics "$run/metrics.jsonl"
$sk ckpt ls "$run/ckpt"

step "4. Reshard the newest checkpoint to 1 rank at ZeRO stage 3, then resume on one GPU to step 240"
$sk convert reshard "$run/ckpt" -o "$run/ckpt-1x" --world-size 1 --stage 3
say "(the global batch is kept: 16 x $gpus per step, as gradient accumulation on one GPU)"
sed "s/\"gradient_accumulation_steps\": 1/\"gradient_accumulation_steps\": $gpus/; s/\"stage\": 2/\"stage\": 3/" \
  samples/configs/gpu_bf16_zero2.json > "$run/one_gpu_zero3.json"
$sk train --device cuda --config "$run/one_gpu_zero3.json" --model gpt2 --data "$run/text.bin" --steps 240 \
  --save-dir "$run/ckpt-1x" --metrics "$run/metrics.jsonl"
$sk ckpt verify "$run/ckpt-1x"

step "5. Consolidate to bf16 safetensors, and evaluate (on a GPU: eval's default --device auto takes one)"
$sk convert consolidate "$run/ckpt-1x" -o "$run/export" --dtype bf16
ls -l "$run/export"
$sk eval "$run/ckpt-1x" --data "$run/text.bin" --windows 16

step "6. Report: $run/report.html"
$sk report "$run/metrics.jsonl" -o "$run/report.html" --title "shardkit GPU quick start"

if python3 -c "import torch, transformers" 2> /dev/null; then
  step "7. Hugging Face transformers loads the export and continues a prompt (greedy, byte tokens)"
  python3 - "$run/export" <<'PY'
import sys, torch, transformers
model = transformers.GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
prompt = "A checkpoint is"
ids = torch.tensor([list(prompt.encode())])
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=60, do_sample=False, pad_token_id=0)
text = bytes(int(t) if int(t) < 256 else ord("?") for t in out[0])  # ids past 255 are not bytes
print("   " + text.decode("utf-8", "replace").replace("\n", " "))
PY
fi

step "Done: everything is in $run"
