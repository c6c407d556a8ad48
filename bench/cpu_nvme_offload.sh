#!/usr/bin/env bash
# ZeRO-Infinity on one CPU rank: GPT-2 small (124 M parameters) at stage 3, sequence 64, micro-batch
# MB (default 8), STEPS (default 5) steps, in four settings -- nothing offloaded, `offload_param` nvme,
# `offload_optimizer` nvme, both -- with the swap files in DIR. For each: the process's peak resident
# memory (/usr/bin/time), the median step after the first, and whether its losses equal the first
# setting's bit for bit (they must: the swap moves bytes, not arithmetic). Prints one JSON line per
# setting, then a table.
# Usage: bench/cpu_nvme_offload.sh [DIR] (the disk to swap to: a folder of its own is made in DIR,
# default /tmp, and removed at the end; SK=path/to/shardkit)
set -euo pipefail
cd "$(dirname "$0")/.."
sk=${SK:-build/shardkit}
[ -x "$sk" ] || BUILD_TARGET=shardkit ./scripts/build.sh > /dev/null
mkdir -p "${1:-/tmp}"
dir=$(mktemp -d "${1:-/tmp}/shardkit-nvme-XXXXXX")
results=$(mktemp)
trap 'rm -rf "$dir" "$results"' EXIT
mb=${MB:-8}
steps=${STEPS:-5}
"$sk" data encode samples/data/checkpoints.txt -o "$dir/text.bin" > /dev/null

run() {  # run <name> <offload_param device> <offload_optimizer device>
  local name=$1 swap=$dir/swap-$1
  mkdir "$swap"
  python3 - "$dir/$name.json" "$mb" "$2" "$3" "$swap" <<'PY'
import json, sys
path, mb, param, optimizer, swap = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
zero = {"stage": 3}
if param != "none":
    zero["offload_param"] = {"device": param, "nvme_path": swap}
if optimizer != "none":
    zero["offload_optimizer"] = {"device": optimizer, "nvme_path": swap}
json.dump({"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": 1, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}}}, open(path, "w"))
PY
  /usr/bin/time -f "%M" -o "$dir/$name.rss" "$sk" train --config "$dir/$name.json" --model gpt2 --seq-len 64 \
    --data "$dir/text.bin" --steps "$steps" --metrics "$dir/$name.jsonl" --quiet
  python3 - "$name" "$dir/$name.jsonl" "$dir/$name.rss" "$dir/none.jsonl" <<'PY' | tee -a "$results"
import json, statistics, sys
name, metrics, rss, reference = sys.argv[1:]
steps = [json.loads(line) for line in open(metrics)]
same = [s["loss"] for s in steps] == [json.loads(line)["loss"] for line in open(reference)]
print(json.dumps({"case": name, "peak_rss_gb": int(open(rss).read().split()[-1]) * 1024 / 1e9,
                  "median_step_s": statistics.median(s["step_ms"] for s in steps[1:]) / 1e3,
                  "losses": [s["loss"] for s in steps], "losses_equal_none": same}))
PY
  rm -rf "$swap"  # each run's swap files go before the next run's are made
}

run none none none
run param nvme none
run optimizer none nvme
run both nvme nvme

echo
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"{'offloaded to nvme':20} {'peak RSS (GB)':>14} {'median step (s)':>16} {'losses as none':>15}")
for r in rows:
    print(f"{r['case']:20} {r['peak_rss_gb']:14.2f} {r['median_step_s']:16.2f} {str(r['losses_equal_none']):>15}")
PY
