#!/usr/bin/env bash
# Converter speed and memory (issue 4): a checkpoint of about 3 GB (a 253M-parameter GPT-2: fp32
# weights + 2 Adam moments) is resharded (2 ranks -> 3 ranks, stage 3) and consolidated to fp32
# safetensors, each timed until durable, against `dd conv=fdatasync` of the same number of bytes in the
# same folder, measured alternately (each conversion right after its own dd, three rounds; the disk of a
# VM varies by 2-3x from minute to minute, so the ratio of medians is the figure); peak memory (max
# RSS) from GNU time. Prints JSON lines and a table.
# Usage: bench/convert_bench.sh [DIR] [MAX_MEMORY]   (defaults: /tmp, where a folder of its own is made; 2GiB)
set -euo pipefail
cd "$(dirname "$0")/.."
sk=${SK:-build/shardkit}
[ -x "$sk" ] || ./scripts/build.sh >/dev/null
mkdir -p "${1:-/tmp}"  # DIR: where to work; the run makes a folder of its own in it and removes only that
dir=$(mktemp -d "${1:-/tmp}/shardkit-convert-bench-XXXXXX") || exit 1
max_memory=${2:-2GiB}
trap 'rm -rf "$dir"' EXIT

"${PYTHON:-/usr/bin/python3}" bench/make_gpt2_weights.py "$dir/hf" 16 1024 16 50257 1024
"$sk" convert import "$dir/hf" -o "$dir/ckpt" --world-size 2 --stage 2 --quiet

dd_seconds() {  # bytes -> seconds for a durable sequential write of that many bytes
  local start end
  sync
  start=$(date +%s.%N)
  dd if=/dev/zero of="$dir/dd.bin" bs=4M count=$(( ($1 + 4194303) / 4194304 )) conv=fdatasync status=none
  end=$(date +%s.%N)
  rm -f "$dir/dd.bin"
  python3 -c "print($end - $start)"
}

measure() {  # name, output dir, command... -> JSON line
  local name=$1 out=$2
  shift 2
  rm -rf "$out"
  sync
  local log start end
  log=$(mktemp)
  start=$(date +%s.%N)
  /usr/bin/time -v "$@" --quiet --max-memory "$max_memory" 2> "$log" >/dev/null
  end=$(date +%s.%N)
  local rss bytes floor
  rss=$(awk '/Maximum resident set size/ {print $6}' "$log")
  bytes=$(du -sb "$out" | cut -f1)
  floor=$(dd_seconds "$bytes")
  rm -f "$log"
  python3 -c "
s = $end - $start
print('{\"case\": \"$name\", \"bytes\": $bytes, \"seconds\": %.3f, \"gb_per_s\": %.3f, \"dd_seconds\": %.3f, \"of_dd\": %.3f, \"max_rss_mb\": %.0f, \"max_memory\": \"$max_memory\"}' % (s, $bytes / s / 1e9, $floor, $floor / s, $rss / 1024))"
}

results=$(mktemp)
for round in 1 2 3; do
  measure "reshard 2->3 ranks, stage 3" "$dir/resharded" \
    "$sk" convert reshard "$dir/ckpt" -o "$dir/resharded" --world-size 3 --stage 3 | tee -a "$results"
  measure "consolidate to fp32 safetensors" "$dir/export" \
    "$sk" convert consolidate "$dir/ckpt" -o "$dir/export" | tee -a "$results"
done
echo
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'case (median of rounds)':34} {'GB':>6} {'s':>7} {'GB/s':>6} {'dd s':>7} {'of dd':>6} {'max RSS MB':>11}")
for case in dict.fromkeys(r["case"] for r in rows):
    rs = [r for r in rows if r["case"] == case]
    s = statistics.median(r["seconds"] for r in rs)
    d = statistics.median(r["dd_seconds"] for r in rs)
    b = rs[0]["bytes"]
    print(f"{case:34} {b/1e9:6.2f} {s:7.2f} {b/s/1e9:6.2f} {d:7.2f} {d/s:6.2f} {max(r['max_rss_mb'] for r in rs):11.0f}")
PY
rm -f "$results"
