#!/usr/bin/env bash
# Where a GPU training step's time goes, per ZeRO stage: GPT-2 124M (MODEL), bf16, 16 x 1024 tokens per
# GPU, `wall_clock_breakdown` on, on 1 GPU (stage 1) and on every visible GPU at stages 1, 2 and 3 with
# gradients reduced in fp32 and in bf16 (communication_data_type), and stage 2 without overlap_comm.
# Prints each case's median step and tokens/s over the steps after the warm-up, and its last step line
# (forward / backward / reduce / optimizer times as the host sees them: the backward pass ends with the
# step's synchronisation, so it also holds the GPU work queued before it; and timing the passes apart
# turns off stages 0-1's CUDA-graph replay, which is worth about 1 %). The probe behind the stage-2
# figures in bench/RESULTS.md. Usage: bench/gpu_step_breakdown.sh [SHARDKIT] (default build-gpu/shardkit);
# a dry run of the script on CPU ranks: MODEL=gpt2-tiny VOCAB=256 DEVICE=cpu GPUS=2 bench/gpu_step_breakdown.sh
# build/shardkit
set -euo pipefail
cd "$(dirname "$0")/.."
sk=${1:-build-gpu/shardkit}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -c "
import array, random, sys
r = random.Random(1)
tokens = array.array('H', (r.randrange(${VOCAB:-50257}) for _ in range(4_000_000)))
if sys.byteorder != 'little': tokens.byteswap()
open('$work/tokens.bin', 'wb').write(tokens.tobytes())"
gpus=${GPUS:-$(nvidia-smi --list-gpus | wc -l)}
steps=${STEPS:-16} warmup=${WARMUP:-5}
case_run() {  # case_run <ranks> <stage> [communication_data_type [overlap_comm]]
  cat > "$work/config.json" <<JSON
{"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "communication_data_type": "${3:-fp32}",
 "bf16": {"enabled": true}, "steps_per_print": 1, "wall_clock_breakdown": true,
 "zero_optimization": {"stage": $2, "overlap_comm": ${4:-true}, "contiguous_gradients": true,
                       "reduce_bucket_size": 25000000, "allgather_bucket_size": 25000000},
 "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.1}}}
JSON
  rm -f "$work/m.jsonl"  # the trainer appends to a metrics file
  mpirun -n "$1" --bind-to none --oversubscribe -x NCCL_NVLS_ENABLE "$sk" train --config "$work/config.json" --model "${MODEL:-gpt2}" \
    --data "$work/tokens.bin" --steps "$steps" --device "${DEVICE:-cuda}" --metrics "$work/m.jsonl" > "$work/log.txt" 2>&1 ||
    { grep -E "error|Error" "$work/log.txt" | head -3; return 1; }
  python3 - "$work/m.jsonl" "$warmup" "$1" "$2" "${3:-fp32}" "${4:-true}" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step_ms"' in l][int(sys.argv[2]):]
ms = statistics.median(r["step_ms"] for r in rows)
print(f"{sys.argv[3]} GPU(s), stage {sys.argv[4]}, gradients reduced in {sys.argv[5]}, overlap_comm {sys.argv[6]}: "
      f"median step {ms:.1f} ms, "
      f"{statistics.median(r['tokens_per_s'] for r in rows):,.0f} tokens/s")
PY
  grep -E "^step" "$work/log.txt" | tail -1
}
case_run 1 1
if [ "$gpus" -ge 2 ]; then
  for wire in fp32 bf16; do
    for stage in 1 2 3; do case_run "$gpus" "$stage" "$wire"; done
    case_run "$gpus" 2 "$wire" false  # stage 2's reductions on the compute stream, between the layers
  done
fi
