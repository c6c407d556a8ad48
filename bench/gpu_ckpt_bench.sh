#!/usr/bin/env bash
# Fast checkpointing on the GPU machine, against the disk's floors measured in the same run:
#  1. gpt2-xl (1.56 B parameters: 18.7 GB of fp32 weights and AdamW moments) trained on RANKS GPUs
#     (default 2) at ZeRO stage STAGE (default 3), micro-batch MB (default 8), with an asynchronous
#     checkpoint every INTERVAL steps (default 160; longer than a save and a dd take), three saves
#     mid-run: durable save time and the training time each save cost (the metrics' checkpoint
#     events), cross-checked against the step times;
#  2. dd of the checkpoint's bytes (conv=fdatasync) in the same folder, the durable-write floor, in
#     three rounds alternating with the saves (before the first, then as each save is done);
#  3. a cold read of the last checkpoint's shards (page cache dropped where allowed): the read floor;
#  4. that checkpoint loaded at another world size or stage (1 GPU at stage 1; from 1 GPU at stage 1,
#     1 GPU at stage 3), cold.
# Prints a table against the bars. Usage: bench/gpu_ckpt_bench.sh [DIR] (SK=path/to/shardkit;
# STAGING=auto|device|host, the train command's --snapshot-staging)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
sk=${SK:-build-gpu/shardkit}
mkdir -p "${1:-/tmp}"  # DIR: where to work; the run makes a folder of its own in it and removes only that
dir=$(mktemp -d "${1:-/tmp}/shardkit-gpu-ckpt-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT  # also when a timeout ends the run: its checkpoints are tens of GB
interval=${INTERVAL:-160}
ranks=${RANKS:-2}
stage=${STAGE:-3}
mb=${MB:-8}
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || echo "(page cache could not be dropped)"; }
now() { date +%s.%N; }

python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, 4_000_000).astype('<u2').tofile('$dir/tokens.bin')"
bytes=$(python3 -c "L, C, V, P = 48, 1600, 50257, 1024; print(12 * (V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C))")
config() {  # config <stage> <file>
  cat > "$2" <<JSON
{"train_micro_batch_size_per_gpu": $mb, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true}, "zero_optimization": {"stage": $1},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}
JSON
}
config "$stage" "$dir/train.json"
if [ "$ranks" -gt 1 ]; then load_stage=1; else load_stage=$([ "$stage" = 1 ] && echo 3 || echo 1); fi
config "$load_stage" "$dir/load.json"

dd_round() {
  local start
  start=$(now)
  dd if=/dev/zero of="$dir/dd.bin" bs=64M count=$((bytes / (64 << 20))) conv=fdatasync status=none
  python3 -c "print($(now) - $start)" >> "$dir/dd.txt"
  rm -f "$dir/dd.bin"
}

# Three saves mid-run (and one at the end, left out of the figures: no step follows it).
drop_caches
dd_round
steps=$((3 * interval + 20))
mpirun -n "$ranks" --bind-to none "$sk" train --config "$dir/train.json" --model gpt2-xl --data "$dir/tokens.bin" \
  --steps "$steps" --save-dir "$dir/run" --save-interval "$interval" --keep-last 1 --device cuda \
  --snapshot-staging "${STAGING:-auto}" --metrics "$dir/m.jsonl" > "$dir/train.txt" 2>&1 &
train=$!
done_saves=0
while kill -0 "$train" 2> /dev/null; do
  n=$(grep -c '"event": *"checkpoint"' "$dir/m.jsonl" 2> /dev/null)
  if [ "${n:-0}" -gt "$done_saves" ]; then
    done_saves=$n
    if [ "$done_saves" -lt 3 ]; then dd_round; fi
  fi
  sleep 0.2
done
wait "$train" || echo "training exited with $?"
grep -E "rank [0-9]:|checkpoint snapshots|error" "$dir/train.txt" | head -10

last=$(cat "$dir/run/latest")
drop_caches
start=$(now)
cat "$dir/run/$last"/*.h5 > /dev/null
read_floor=$(python3 -c "print($(now) - $start)")
drop_caches
"$sk" train --config "$dir/load.json" --model gpt2-xl --data "$dir/tokens.bin" --steps $((steps + 1)) \
  --resume "$dir/run/$last" --device cuda 2>&1 | grep -E "resumed from|error" | tee "$dir/load.txt"

python3 - "$dir" "$bytes" "$read_floor" "$ranks" "$stage" "$steps" "$load_stage" <<'PY'
import json, re, statistics, sys
d, size, read_floor, ranks, stage, last_step, load_stage = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]), sys.argv[7]
dd_rounds = [float(x) for x in open(f"{d}/dd.txt")]
dd_write = statistics.median(dd_rounds)
lines = [json.loads(l) for l in open(f"{d}/m.jsonl")]
events = [e for e in lines if e.get("event") == "checkpoint" and e["step"] != last_step]
steps = {e["step"]: e["step_ms"] for e in lines if "step_ms" in e}
write = statistics.median(e["write_ms"] for e in events) / 1e3
# What each save cost training, as the run measured it (save() holding the loop, then the device
# waiting for the snapshot's copy), and as the step times show it: the step after a save beyond a
# usual one, plus the time save() held the loop (outside any step's time).
usual = statistics.median(steps.values())
after = [max(0.0, steps[e["step"] + 1] - usual) for e in events if e["step"] + 1 in steps]
lost = statistics.median(e["training_lost_ms"] for e in events) / 1e3
blocked = statistics.median(e["loop_blocked_ms"] for e in events) / 1e3
device = statistics.median(e["device_wait_ms"] for e in events) / 1e3
slower = statistics.median(after) / 1e3 if after else 0.0
m = re.search(r"read in ([0-9.]+) s", open(f"{d}/load.txt").read())
load = float(m.group(1)) if m else float("nan")
print(f"\ngpt2-xl state, {size / 1e9:.2f} GB; {len(events)} saves ({ranks} GPU(s), stage {stage}, async)")
rounds = ", ".join("%.2f" % x for x in dd_rounds)
saves = ", ".join("%.2f" % (e["write_ms"] / 1e3) for e in events)
prunes = ", ".join("%.2f" % (e.get("prune_ms", 0) / 1e3) for e in events)
print(f"  dd rounds: {rounds} s; saves: {saves} s; then removing the save before (--keep-last 1): {prunes} s")
print(f"  {'':34} {'seconds':>8} {'GB/s':>6} {'x floor':>8} {'bar':>6}")
print(f"  {'dd conv=fdatasync (median, floor)':34} {dd_write:8.2f} {size / dd_write / 1e9:6.2f}")
print(f"  {'durable save (median)':34} {write:8.2f} {size / write / 1e9:6.2f} {write / dd_write:8.2f} {'1.10':>6}")
print(f"  {'training time lost per save':34} {lost:8.3f} {'':6} {'':8} {'0.02 s':>6}")
print(f"    {'of which save() held the loop':32} {blocked:8.3f}")
print(f"    {'of which the device waited':32} {device:8.3f}")
print(f"    {'cross-check: held + next step slower':32} {blocked + slower:8.3f}   (usual step {usual / 1e3:.3f} s)")
print(f"  {'cold read of the shards (floor)':34} {read_floor:8.2f} {size / read_floor / 1e9:6.2f}")
print(f"  {f'load onto 1 GPU, stage {load_stage}':34} {load:8.2f} {size / load / 1e9:6.2f} {load / read_floor:8.2f} {'1.20':>6}")
PY
