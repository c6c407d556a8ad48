#!/usr/bin/env bash
# The checkpoint of a model of about 3 B parameters on one GPU, end to end, against the disk in the
# same call. GPT-2's architecture at LAYERS x WIDTH (default 24 x 3072: 2.88 B parameters, 34.6 GB of
# fp32 weights and AdamW moments), bf16, stage 1, micro-batch MB (4) x 1024. The one-GPU machine's
# 64 GB disk holds one such checkpoint, not two (a save keeps the previous checkpoint until it
# commits), so the run saves once, at its last step:
#  1. dd conv=fdatasync of the checkpoint's bytes (removed after): the durable-write floor;
#  2. 10 steps of training and an asynchronous save at the last: the durable save time and what the
#     snapshot cost the training stream (the checkpoint event's training_lost_ms);
#  3. a cold read of the shards (page cache dropped): the read floor; the checkpoint resumed on the
#     GPU at stage 3, cold: the load time;
#  4. the checkpoint resharded to 4 ranks at stage 2, and consolidated to safetensors in bf16, both
#     into /dev/shm (memory): each command's time and the rate at which it read the checkpoint.
# OFFLOAD=1 instead trains at stage 2 with offload_optimizer cpu (the states in host memory) and saves
# at step 6 of 8 twice, with --snapshot-staging none (the save reads the live states, the next
# optimizer step waits for it: no second host copy) and host (a copy, written behind training): each
# save's durable time and what it cost training, beside the median step.
# Usage: bench/gpu_big_ckpt_bench.sh [DIR] (SK=path/to/shardkit)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sk=${SK:-build-gpu/shardkit}
mkdir -p "${1:-/tmp}"  # DIR: where to work; the run makes a folder of its own in it and removes only that
dir=$(mktemp -d "${1:-/tmp}/shardkit-big-ckpt-XXXXXX") || exit 1
layers=${LAYERS:-24}
width=${WIDTH:-3072}
mb=${MB:-4}
shm=/dev/shm/shardkit-big-ckpt
trap 'rm -rf "$dir" "$shm"' EXIT  # also when a timeout ends the run: 35 GB on disk, more in memory
rm -rf "$shm"
mkdir -p "$shm"
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || echo "(page cache could not be dropped)"; }
seconds() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$(date +%s.%N)"; }

python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, 2_000_000).astype('<u2').tofile('$dir/tokens.bin')"
echo "{\"n_layer\": $layers, \"n_head\": $((width / 128)), \"n_embd\": $width, \"vocab_size\": 50257, \"n_positions\": 1024}" > "$dir/model.json"
bytes=$(python3 -c "L, C, V, P = $layers, $width, 50257, 1024; print(12 * (V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C))")
config() {  # config <stage> <file>
  cat > "$2" <<JSON
{"train_micro_batch_size_per_gpu": $mb, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true}, "zero_optimization": {"stage": $1}, "steps_per_print": 5,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}
JSON
}
if [ "${OFFLOAD:-0}" != 0 ]; then
  cat > "$dir/train.json" <<JSON
{"train_micro_batch_size_per_gpu": $mb, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true}, "steps_per_print": 1,
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}
JSON
else
  config 1 "$dir/train.json"
fi
config 3 "$dir/load.json"
echo "GPT-2 shape $layers x $width: $(python3 -c "print(f'{$bytes / 12e9:.2f}')") B parameters, $(python3 -c "print(f'{$bytes / 1e9:.1f}')") GB of state"

drop_caches
start=$(date +%s.%N)
dd if=/dev/zero of="$dir/dd.bin" bs=64M count=$((bytes / (64 << 20))) conv=fdatasync status=none
echo "dd conv=fdatasync: $(seconds "$start") s"
rm -f "$dir/dd.bin"

report() {  # report <metrics file>: each save, and the steps
  python3 - "$1" "$bytes" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
saves = [e for e in lines if e.get("event") == "checkpoint"]
steps = [(e["step"], e["step_ms"]) for e in lines if "step_ms" in e]
for e in saves:
    print(f"save of step {e['step']}: durable in {e['write_ms'] / 1e3:.2f} s ({int(sys.argv[2]) / e['write_ms'] / 1e6:.2f} GB/s), "
          f"training lost {e['training_lost_ms']:.1f} ms (loop held {e['loop_blocked_ms']:.1f}, device waited {e['device_wait_ms']:.1f})")
print(f"median step {statistics.median(ms for _, ms in steps):.1f} ms over {len(steps)} steps; each: "
      + ", ".join(f"{s}: {ms:.0f}" for s, ms in steps))
PY
}
if [ "${OFFLOAD:-0}" != 0 ]; then
  for staging in none host; do
    rm -rf "$dir/run"
    "$sk" train --config "$dir/train.json" --model "$dir/model.json" --data "$dir/tokens.bin" --steps 8 \
      --save-dir "$dir/run" --save-interval 6 --keep-last 1 --device cuda --snapshot-staging "$staging" \
      --metrics "$dir/m-$staging.jsonl" > "$dir/train-$staging.txt" 2>&1 ||
      { echo "training failed:"; tail -5 "$dir/train-$staging.txt"; }
    echo "-- --snapshot-staging $staging: $(grep -E "checkpoint snapshots" "$dir/train-$staging.txt" | head -1 | sed 's/^.*checkpoint snapshots: //')"
    grep -E "error" "$dir/train-$staging.txt" | head -3
    report "$dir/m-$staging.jsonl"
  done
  exit 0
fi

"$sk" train --config "$dir/train.json" --model "$dir/model.json" --data "$dir/tokens.bin" --steps 10 \
  --save-dir "$dir/run" --save-interval 10 --keep-last 1 --device cuda --metrics "$dir/m.jsonl" > "$dir/train.txt" 2>&1 ||
  { echo "training failed:"; tail -5 "$dir/train.txt"; }
grep -E "checkpoint snapshots|error" "$dir/train.txt" | head -3
report "$dir/m.jsonl"

last=$(cat "$dir/run/latest")
drop_caches
start=$(date +%s.%N)
cat "$dir/run/$last"/*.h5 > /dev/null
echo "cold read of the shards: $(seconds "$start") s"
drop_caches
"$sk" train --config "$dir/load.json" --model "$dir/model.json" --data "$dir/tokens.bin" --steps 11 \
  --resume "$dir/run/$last" --device cuda 2>&1 | grep -E "resumed from|error"

drop_caches
start=$(date +%s.%N)
"$sk" convert reshard "$dir/run/$last" -o "$shm/resharded" --world-size 4 --stage 2 -q | tail -1
echo "reshard to 4 ranks at stage 2 (into memory): $(seconds "$start") s"
rm -rf "$shm/resharded"
drop_caches
start=$(date +%s.%N)
"$sk" convert consolidate "$dir/run/$last" -o "$shm/export" --dtype bf16 -q | tail -1
echo "consolidate to safetensors bf16 (into memory): $(seconds "$start") s"
du -sh "$shm/export" | cut -f1
