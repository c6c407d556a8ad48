#!/usr/bin/env bash
# Every kernel of one GPU training step, timed inside the step: `shardkit train --profile-step` under
# Nsight Compute (kernels run one at a time, caches as the kernel before left them, clocks not locked),
# summed by kernel (bench/ncu_step_summary.py) beside the median step of the same configuration without
# the profiler. What the kernels do not explain is memsets, copies, launch gaps and host waits.
# MODEL (gpt2; tinyllama-1.1b, ...), BATCH x SEQ tokens a step (16 x 1024), bf16, ZeRO stage 1 on one GPU,
# AdamW with gradient clipping: bench/gpu_vs_pytorch.py's configuration. STEPS (12) steps, the median
# over those after WARMUP (4); the profiled step PROFILE_AT (8). Writes ncu's output under OUT_DIR
# (default a temporary folder). Usage: bench/gpu_step_profile.sh [SHARDKIT] (default build-gpu/shardkit)
set -euo pipefail
cd "$(dirname "$0")/.."
sk=${1:-build-gpu/shardkit}
model=${MODEL:-gpt2} batch=${BATCH:-16} seq=${SEQ:-1024} steps=${STEPS:-12} warmup=${WARMUP:-4}
profiled=${PROFILE_AT:-8}
case "$model" in
  gpt2*) vocab=${VOCAB:-50257} ;;
  *) vocab=${VOCAB:-32000} ;;
esac
ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
export NCCL_NVLS_ENABLE=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${OUT_DIR:-$work}
mkdir -p "$out"
[ "$vocab" -le 65536 ] || { echo "VOCAB $vocab: this script writes 16-bit token files" >&2; exit 2; }
python3 -c "
import array, random, sys
r = random.Random(1)
tokens = array.array('H', (r.randrange($vocab) for _ in range(4_000_000)))
if sys.byteorder != 'little': tokens.byteswap()
open('$work/tokens.bin', 'wb').write(tokens.tobytes())"
cat > "$work/config.json" <<JSON
{"train_batch_size": $batch, "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "zero_optimization": {"stage": 1, "overlap_comm": true, "contiguous_gradients": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.1}}}
JSON
train=("$sk" train --config "$work/config.json" --model "$model" --seq-len "$seq" --data "$work/tokens.bin"
  --steps "$steps" --device cuda --quiet)
"${train[@]}" --metrics "$work/plain.jsonl"
step_ms=$(python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$work/plain.jsonl') if '\"step_ms\"' in l][$warmup:]
print(statistics.median(r['step_ms'] for r in rows))")
"$ncu" --profile-from-start off --clock-control none --cache-control none --print-kernel-base function --csv \
  --metrics gpu__time_duration.sum "${train[@]}" --profile-step "$profiled" > "$out/ncu-$model.csv" 2>&1
echo "== $model, $batch x $seq tokens a step, step $profiled of $steps"
python3 bench/ncu_step_summary.py "$out/ncu-$model.csv" --step-ms "$step_ms"
