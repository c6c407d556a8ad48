#!/usr/bin/env bash
# Fast checkpointing on the GPU machine (issue 6), against the disk's floors measured in the same run:
#  1. dd of the checkpoint's bytes (conv=fdatasync) in the same folder: the durable-write floor;
#  2. gpt2-xl (1.56 B parameters: 18.7 GB of fp32 weights and AdamW moments) trained on RANKS GPUs
#     (default 2) at ZeRO
#     stage 3 with an asynchronous checkpoint every INTERVAL steps (default 80, about 18 s: longer than
#     a save takes, so no save waits for the one before): durable save time and the training time
#     each save cost (the metrics' checkpoint events), cross-checked against the step times;
#  3. a cold read of the last checkpoint's shards (page cache dropped where allowed): the read floor;
#  4. that checkpoint loaded onto 1 GPU at stage 1 (resharded from RANKS ranks at stage 3), cold.
# Prints a table against the bars. Usage: bench/gpu_ckpt_bench.sh [DIR] (SK=path/to/shardkit)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
sk=${SK:-build-gpu/shardkit}
dir=${1:-/tmp/gpu-ckpt}
interval=${INTERVAL:-80}
ranks=${RANKS:-2}
rm -rf "$dir"
mkdir -p "$dir"
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || echo "(page cache could not be dropped)"; }
now() { date +%s.%N; }

python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, 2_000_000).astype('<u2').tofile('$dir/tokens.bin')"
bytes=$(python3 -c "L, C, V, P = 48, 1600, 50257, 1024; print(12 * (V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C))")
config() {  # config <stage> <file>
  cat > "$2" <<JSON
{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true}, "zero_optimization": {"stage": $1},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}
JSON
}
config 3 "$dir/s3.json"
config 1 "$dir/s1.json"

drop_caches
start=$(now)
dd if=/dev/zero of="$dir/dd.bin" bs=64M count=$((bytes / (64 << 20))) conv=fdatasync status=none
dd_write=$(python3 -c "print($(now) - $start)")
rm -f "$dir/dd.bin"

mpirun -n "$ranks" --bind-to none "$sk" train --config "$dir/s3.json" --model gpt2-xl --data "$dir/tokens.bin" --steps $((3 * interval)) \
  --save-dir "$dir/run" --save-interval "$interval" --keep-last 1 --device cuda --metrics "$dir/m.jsonl" 2>&1 |
  grep -E "rank [0-9]:|checkpoint|error" | head -10

last=$(cat "$dir/run/latest")
drop_caches
start=$(now)
cat "$dir/run/$last"/*.h5 > /dev/null
read_floor=$(python3 -c "print($(now) - $start)")
drop_caches
"$sk" train --config "$dir/s1.json" --model gpt2-xl --data "$dir/tokens.bin" --steps $((3 * interval + 1)) --resume "$dir/run/$last" \
  --device cuda 2>&1 | grep -E "resumed from|error" | tee "$dir/load.txt"

python3 - "$dir" "$bytes" "$dd_write" "$read_floor" "$ranks" <<'PY'
import json, re, statistics, sys
d, size, dd_write, read_floor, ranks = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
lines = [json.loads(l) for l in open(f"{d}/m.jsonl")]
events = [e for e in lines if e.get("event") == "checkpoint"]
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
print(f"\ngpt2-xl state, {size / 1e9:.2f} GB; {len(events)} saves ({ranks} GPUs, stage 3, async)")
print(f"  {'':34} {'seconds':>8} {'GB/s':>6} {'x floor':>8} {'bar':>6}")
print(f"  {'dd conv=fdatasync (write floor)':34} {dd_write:8.2f} {size / dd_write / 1e9:6.2f}")
print(f"  {'durable save (median)':34} {write:8.2f} {size / write / 1e9:6.2f} {write / dd_write:8.2f} {'1.10':>6}")
print(f"  {'training time lost per save':34} {lost:8.3f} {'':6} {'':8} {'0.02 s':>6}")
print(f"    {'of which save() held the loop':32} {blocked:8.3f}")
print(f"    {'of which the device waited':32} {device:8.3f}")
print(f"    {'cross-check: held + next step slower':32} {blocked + slower:8.3f}   (usual step {usual / 1e3:.3f} s)")
print(f"  {'cold read of the shards (floor)':34} {read_floor:8.2f} {size / read_floor / 1e9:6.2f}")
print(f"  {'load onto 1 GPU, resharded':34} {load:8.2f} {size / load / 1e9:6.2f} {load / read_floor:8.2f} {'1.20':>6}")
PY
rm -rf "$dir"
