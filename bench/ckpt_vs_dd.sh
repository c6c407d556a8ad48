#!/usr/bin/env bash
# Fast periodic checkpointing on CPU ranks (issue 6), in one run:
#  1. `mpirun -n 2 shardkit bench ckpt --size 1GiB` (durable: committed and fsynced) against
#     `dd bs=4M count=256 conv=fdatasync` of the same bytes in the same folder, alternately, ROUNDS
#     rounds; the medians and their ratio;
#  2. training on 2 ranks (a 6-layer, 384-wide GPT-2, 130 MB of state) with a checkpoint every 2 steps,
#     asynchronous and synchronous: the median training time lost per save against the median time
#     until the save was committed and durable (the metrics' checkpoint events).
# Prints one JSON line per measurement, then a table. Usage: bench/ckpt_vs_dd.sh [DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
sk=$PWD/build/shardkit
[ -x "$sk" ] || ./scripts/build.sh > /dev/null
mkdir -p "${1:-/tmp}"  # DIR: where to work; the run makes a folder of its own in it and removes only that
dir=$(mktemp -d "${1:-/tmp}/shardkit-ckpt-vs-dd-XXXXXX")
trap 'rm -rf "$dir"' EXIT
rounds=${2:-3}
results=$(mktemp)
mpi() { mpirun -n 2 --oversubscribe --bind-to none "$@"; }

for round in $(seq "$rounds"); do
  sync
  start=$(date +%s.%N)
  dd if=/dev/zero of="$dir/dd.bin" bs=4M count=256 conv=fdatasync status=none
  end=$(date +%s.%N)
  rm -f "$dir/dd.bin"
  echo "{\"case\": \"dd\", \"round\": $round, \"seconds\": $(python3 -c "print(round($end - $start, 4))")}" | tee -a "$results"
  sync
  json=$(mpi "$sk" bench ckpt --size 1GiB --dir "$dir/bench" --json)
  rm -rf "$dir/bench"
  echo "{\"case\": \"shardkit\", \"round\": $round, \"result\": $json}" | tee -a "$results"
done

python3 -c "
import random, struct
random.seed(0)
open('$dir/tokens.bin', 'wb').write(struct.pack('<400000H', *(random.randrange(256) for _ in range(400000))))"
echo '{"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab_size": 256, "n_positions": 256}' > "$dir/model.json"
echo '{"train_batch_size": 4, "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}' \
  > "$dir/ds.json"
for mode in async sync; do
  rm -f "$dir/$mode.jsonl"  # the trainer appends to its metrics file
  mpi "$sk" train --config "$dir/ds.json" --model "$dir/model.json" --data "$dir/tokens.bin" --steps 20 \
    --save-dir "$dir/run-$mode" --save-interval 2 --keep-last 2 --save-mode "$mode" --threads 1 --quiet \
    --metrics "$dir/$mode.jsonl"
  rm -rf "$dir/run-$mode"
  grep '"checkpoint"' "$dir/$mode.jsonl" | sed "s/^/{\"case\": \"train $mode\", \"event\": /; s/\$/}/" | tee -a "$results"
done

echo
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
dd = [r["seconds"] for r in rows if r["case"] == "dd"]
ours = [r["result"]["seconds"] for r in rows if r["case"] == "shardkit"]
size = rows[[r["case"] for r in rows].index("shardkit")]["result"]["bytes"]
print(f"1 GiB durable, 2 ranks vs dd, {len(dd)} alternating rounds")
print(f"  {'':10} {'median s':>9} {'GB/s':>7}   (each round: {', '.join(f'{x:.2f}' for x in ours)} vs {', '.join(f'{x:.2f}' for x in dd)})")
for name, times in (("shardkit", ours), ("dd", dd)):
    print(f"  {name:10} {statistics.median(times):9.3f} {size / statistics.median(times) / 1e9:7.2f}")
print(f"  shardkit / dd speed: {statistics.median(dd) / statistics.median(ours):.2f} (bar: >= 0.85)")
print("\ntraining, a checkpoint every 2 steps (2 ranks, 130 MB of state)")
print(f"  {'mode':6} {'saves':>5} {'median lost ms':>15} {'median write ms':>16} {'lost / write':>13}")
for mode in ("async", "sync"):
    ev = [r["event"] for r in rows if r["case"] == f"train {mode}"]
    lost = statistics.median(e["training_lost_ms"] for e in ev)
    write = statistics.median(e["write_ms"] for e in ev)
    print(f"  {mode:6} {len(ev):5d} {lost:15.1f} {write:16.1f} {lost / write:13.3f}")
print("  (bar for async: lost / write <= 0.25)")
PY
rm -f "$results"
