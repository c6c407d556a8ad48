#!/usr/bin/env bash
# Scaling on one host of N GPUs (issue 9: N = 8, or 4 where only 4 are lent) against 2 GPUs, in one
# call of the GPU machine:
#  1. gpt2-xl throughput at ZeRO stage 3, and at stage 2 with the optimizer offloaded to the CPU, on 2
#     and on N GPUs, each GPU with the same micro-batch (8 x 1024 tokens): scaling efficiency is
#     tokens/s on N over N/2 times tokens/s on 2. Each rank's memory report is printed.
#  2. Resharding across GPU counts: train N ranks (stage 3) uninterrupted to step 2K with a checkpoint
#     at K; reshard that checkpoint N -> 2 (`convert reshard`) and resume on 2 GPUs, saving at 3K/2;
#     reshard that one 2 -> N and resume on N to 2K; consolidate the result to safetensors. The global
#     batch is the same at every world size, so the resumed runs' losses must follow the uninterrupted
#     run's (bf16: to rounding, bar 1 % relative).
#  3. (CKPT=1) checkpoint speed: bench/gpu_ckpt_bench.sh with N ranks (dd floor, durable save, training time lost).
# THROUGHPUT=0, RESHARD=0 skip parts; CKPT=1 adds part 3. Try the script on CPU ranks with
# MODEL=gpt2-tiny DEVICE=cpu GPUS=4 MPIRUN_ARGS=--oversubscribe. Usage: bench/gpu_scaling.sh [DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
sk=${SK:-build-gpu/shardkit}
mkdir -p "${1:-/tmp}"  # DIR: where to work; the run makes a folder of its own in it and removes only that
dir=$(mktemp -d "${1:-/tmp}/shardkit-gpu-scaling-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
model=${MODEL:-gpt2-xl}
device=${DEVICE:-cuda}
n=${GPUS:-$(nvidia-smi --list-gpus | wc -l)}
micro=${MICRO:-8}
k=${K:-6}
log() { printf '\n== %s\n' "$*"; }
launch() {  # launch <ranks> <args...>
  local ranks=$1
  shift
  mpirun -n "$ranks" --bind-to none ${MPIRUN_ARGS:-} "$sk" train --model "$model" --device "$device" "$@"
}
config() {  # config <file> <stage> <offload: true|false> [global batch]
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": $micro, $([ -n "${4:-}" ] && echo "\"train_batch_size\": $4," || echo '"gradient_accumulation_steps": 1,')
 "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "zero_optimization": {"stage": $2 $([ "$3" = true ] && echo ', "offload_optimizer": {"device": "cpu", "pin_memory": true}')},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}}}
JSON
}
# Text the model can learn from (byte-level ids of the repository's documentation, repeated).
for _ in 1 2 3 4; do cat README.md docs/*.md; done > "$dir/text.txt"
"$sk" data encode "$dir/text.txt" -o "$dir/text.bin" > /dev/null || exit 1
echo "$n GPUs; model $model; $(date -u +%FT%TZ)"

if [ "${THROUGHPUT:-1}" != 0 ]; then
  log "1. throughput, $micro x 1024 tokens per GPU per step"
  for mode in "3 false" "2 true"; do
    set -- $mode
    config "$dir/t$1.json" "$1" "$2"
    for ranks in 2 "$n"; do
      echo "-- stage $1$([ "$2" = true ] && echo ' + CPU optimizer offload'), $ranks GPUs"
      launch "$ranks" --config "$dir/t$1.json" --data "$dir/text.bin" --steps "${STEPS:-12}" \
        --metrics "$dir/t$1-$ranks.jsonl" 2>&1 | grep -E "^ *rank [0-9]+:|error" | head -"$n"
    done
  done
  python3 - "$dir" "$n" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
def rate(f):  # median tokens/s of the steps after the first three (start-up, allocation)
    steps = [json.loads(l) for l in open(f) if '"tokens_per_s"' in l]
    return statistics.median(s["tokens_per_s"] for s in steps[3:]) if len(steps) > 3 else float("nan")
print(f"\n  {'':36} {'2 GPUs tok/s':>13} {f'{n} GPUs tok/s':>13} {'efficiency':>10}")
for stage, name in (("3", "stage 3"), ("2", "stage 2 + CPU optimizer offload")):
    two, many = rate(f"{d}/t{stage}-2.jsonl"), rate(f"{d}/t{stage}-{n}.jsonl")
    print(f"  {name:36} {two:13,.0f} {many:13,.0f} {many / (two * n / 2):10.1%}")
PY
fi

if [ "${RESHARD:-1}" != 0 ]; then
  log "2. reshard $n -> 2 -> $n and resume, against the uninterrupted run (stage 3, global batch $((micro * n)))"
  config "$dir/r.json" 3 false $((micro * n))
  common=(--config "$dir/r.json" --data "$dir/text.bin" --steps $((2 * k)) --save-mode sync)
  launch "$n" "${common[@]}" --save-dir "$dir/a" --save-interval "$k" --metrics "$dir/a.jsonl" 2>&1 | grep -E "error" | head -4
  start=$(date +%s.%N)
  "$sk" convert reshard "$dir/a/step-$(printf %08d "$k")" -o "$dir/b" --world-size 2 --quiet || exit 1
  echo "reshard $n -> 2: $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s"
  launch 2 "${common[@]}" --save-dir "$dir/b" --save-interval $((k / 2)) --metrics "$dir/b.jsonl" 2>&1 |
    grep -E "resumed from|error" | head -4
  start=$(date +%s.%N)
  "$sk" convert reshard "$dir/b/step-$(printf %08d $((3 * k / 2)))" -o "$dir/c" --world-size "$n" --quiet || exit 1
  echo "reshard 2 -> $n: $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s"
  launch "$n" "${common[@]}" --save-dir "$dir/c" --metrics "$dir/c.jsonl" 2>&1 | grep -E "resumed from|error" | head -4
  start=$(date +%s.%N)
  "$sk" convert consolidate "$dir/c" -o "$dir/export" --dtype bf16 --quiet || exit 1
  echo "consolidate to safetensors (bf16): $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s;" \
    "$(du -sh "$dir/export" | cut -f1)"
  python3 - "$dir" "$n" "$k" <<'PY'
import json, sys
d, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def losses(f):
    return {s["step"]: s["loss"] for s in map(json.loads, open(f)) if "loss" in s}
a, b, c = losses(f"{d}/a.jsonl"), losses(f"{d}/b.jsonl"), losses(f"{d}/c.jsonl")
print(f"\n  {'step':>4} {f'uninterrupted ({n})':>18} {'resumed on 2':>13} {f'resumed on {n}':>14}")
worst = 0.0
for step in sorted(a):
    row = [f"{a[step]:18.4f}"]
    for other in (b, c):
        if step in other:
            worst = max(worst, abs(other[step] - a[step]) / a[step])
            row.append(f"{other[step]:13.4f}")
        else:
            row.append(f"{'':13}")
    print(f"  {step:4} " + " ".join(row))
expected = k + k // 2  # steps K+1..2K resumed on 2, 3K/2+1..2K resumed on N
print(f"  resumed steps compared: {sum(s in a for s in b) + sum(s in a for s in c)} of {expected}; "
      f"largest relative difference {worst:.2e} (bar 1e-2)")
try:
    from safetensors import safe_open
    with safe_open(f"{d}/export/model.safetensors", "np") as f:
        print(f"  export: {len(list(f.keys()))} tensors in model.safetensors")
    import torch, transformers
    m = transformers.GPT2LMHeadModel.from_pretrained(f"{d}/export", torch_dtype=torch.bfloat16)
    print(f"  transformers loads it: {sum(p.numel() for p in m.parameters()) / 1e9:.2f} B parameters")
except Exception as e:  # a single-file export is what a model of this size gives below 5 GB
    print(f"  export check: {type(e).__name__}: {e}")
PY
fi

if [ "${CKPT:-0}" != 0 ]; then
  log "3. checkpointing gpt2-xl on $n GPUs against the disk"
  RANKS=$n SK=$sk bench/gpu_ckpt_bench.sh "$dir/ckpt" 2>&1 | tail -14
fi
