#!/usr/bin/env bash
# The main job, end to end on CPU ranks, saying what each step does: install and build; tokenize the
# sample text that ships with the repository; train gpt2-tiny on 2 MPI ranks (ZeRO stage 2) with
# periodic sharded checkpoints; reshard the newest checkpoint to 3 ranks at ZeRO stage 3 and resume
# from it on 3 ranks; verify; consolidate to safetensors for Hugging Face transformers; evaluate; and
# write an HTML report of the run. About 6 minutes on 2 cores, most of it the build. RUN_DIR (default
# runs/quickstart) receives everything. The GPU variant is samples/quickstart-gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # mpirun as root (containers)
run=${RUN_DIR:-runs/quickstart}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
say() { printf '   %s\n' "$*"; }

step "1. System packages (Debian 12 / Ubuntu 24.04)"
./scripts/setup-debian.sh

step "2. Build (CMake, build/)"
BUILD_TARGET=shardkit ./scripts/build.sh > /dev/null
sk=build/shardkit
say "built $($sk --version)"

rm -rf "$run"
mkdir -p "$run"
step "3. Tokenize samples/data/checkpoints.txt, byte-level (one uint16 token per byte, vocabulary 256)"
$sk data encode samples/data/checkpoints.txt -o "$run/text.bin"

step "4. Train gpt2-tiny on 2 ranks at ZeRO stage 2: 60 steps, a checkpoint every 20"
say "each rank writes its own shard in parallel; rank 0 commits the manifest last"
mpirun -n 2 --oversubscribe $sk train --config samples/configs/tiny_zero2.json --model gpt2-tiny \
  --data "$run/text.bin" --steps 60 --save-interval 20 --save-dir "$run/ckpt-2x" --metrics "$run/metrics.jsonl"

step "5. The run's checkpoints (* = latest), and a check of every chunk's checksum"
$sk ckpt ls "$run/ckpt-2x"
$sk ckpt verify "$run/ckpt-2x"

step "6. Reshard the newest checkpoint for 3 ranks at ZeRO stage 3 (weights, Adam moments, trainer state)"
$sk convert reshard "$run/ckpt-2x" -o "$run/ckpt-3x" --world-size 3 --stage 3
say "the same numbers in another layout -- every tensor and state compared:"
$sk ckpt diff "$run/ckpt-2x" "$run/ckpt-3x" | tail -n 1

step "7. Resume on 3 ranks at stage 3 and train to step 120 (the metrics file continues)"
mpirun -n 3 --oversubscribe $sk train --config samples/configs/tiny_zero3.json --model gpt2-tiny \
  --data "$run/text.bin" --steps 120 --save-interval 20 --save-dir "$run/ckpt-3x" --metrics "$run/metrics.jsonl"
$sk ckpt ls "$run/ckpt-3x"

step "8. Inspect the newest checkpoint: layout, shards, trainer state"
$sk ckpt inspect "$run/ckpt-3x" | head -n 8
say "each shard is a standard HDF5 file:"
h5ls "$run/ckpt-3x/step-00000120/shard-00000-of-00003.h5"

step "9. Consolidate to safetensors (model.safetensors + config.json: GPT2LMHeadModel.from_pretrained loads it)"
$sk convert consolidate "$run/ckpt-3x" -o "$run/export"
ls -l "$run/export"

step "10. Evaluate: mean next-token cross-entropy after 20 steps and after 120"
$sk eval "$run/ckpt-2x/step-00000020" --data "$run/text.bin"
$sk eval "$run/ckpt-3x" --data "$run/text.bin"

step "11. Report: loss, learning rate, gradient norm, loss scale, tokens/s, checkpoint times"
$sk report "$run/metrics.jsonl" -o "$run/report.html" --title "shardkit quick start"

step "Done"
say "tokens       $run/text.bin"
say "checkpoints  $run/ckpt-2x (2 ranks, stage 2), $run/ckpt-3x (3 ranks, stage 3)"
say "weights      $run/export (safetensors)"
say "metrics      $run/metrics.jsonl"
say "report       $run/report.html (open it in a browser)"
