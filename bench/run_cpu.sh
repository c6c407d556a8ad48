#!/usr/bin/env bash
# CPU checkpoint benchmarks of issue 2, in one run: XXH64 speed, a 1 GiB shard written into the page
# cache and durably (1 rank), durably from 2 ranks, compressed, and dd's writes of the same size in the
# same folder for scale. Prints one JSON line per measurement, then a table.
# Usage: bench/run_cpu.sh [DIR] (a folder of its own is made in DIR, default /tmp, and removed after).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sk=build/shardkit
[ -x "$sk" ] || ./scripts/build.sh >/dev/null
mkdir -p "${1:-/tmp}"  # DIR: where to work; the run makes a folder of its own in it and removes only that
dir=$(mktemp -d "${1:-/tmp}/shardkit-bench-XXXXXX") || exit 1
results=$(mktemp)
trap 'rm -rf "$dir" "$results"' EXIT

record() { echo "{\"case\": \"$1\", \"result\": $2}" | tee -a "$results"; }

record "xxh64 checksum, 1 core" "$($sk bench checksum --size 1GiB --json)"
record "1 GiB shard, page cache, 1 rank" "$($sk bench ckpt --size 1GiB --dir "$dir/pc" --no-fsync --repeat 5 --json)"
record "1 GiB shard, durable, 1 rank" "$($sk bench ckpt --size 1GiB --dir "$dir/d1" --repeat 3 --json)"
record "1 GiB checkpoint, durable, 2 ranks" \
  "$(mpirun -n 2 --oversubscribe $sk bench ckpt --size 1GiB --dir "$dir/d2" --repeat 3 --json)"
record "1 GiB shard, zstd 1, page cache, 1 rank" \
  "$($sk bench ckpt --size 1GiB --dir "$dir/z1" --no-fsync --compress 1 --repeat 3 --json)"
# dd's 1 GiB the three ways the cases above write: into the page cache, buffered then flushed, and
# with direct I/O then flushed (how shardkit writes durable uncompressed shards: on a virtual disk
# whose host caches writes, direct I/O alone returns before the data is durable). Each the median of
# 3, after a sync, into a fresh file, as the cases above.
dd_case() {
  local name=$1
  shift
  local times=()
  for _ in 1 2 3; do
    rm -f "$dir/dd.bin"
    sync
    local start end
    start=$(date +%s.%N)
    dd if=/dev/zero of="$dir/dd.bin" bs=4M count=256 status=none "$@"
    end=$(date +%s.%N)
    times+=("$(python3 -c "print($end - $start)")")
  done
  record "$name" "$(python3 -c "import statistics, sys; s = statistics.median(map(float, sys.argv[1:])); print('{\"bytes\": 1073741824, \"seconds\": %.3f, \"gb_per_s\": %.3f}' % (s, 1073741824/s/1e9))" "${times[@]}")"
}
dd_case "dd 1 GiB, page cache (median of 3)"
dd_case "dd 1 GiB conv=fdatasync (median of 3)" conv=fdatasync
dd_case "dd 1 GiB oflag=direct,fdatasync (median of 3)" oflag=direct conv=fdatasync

echo
python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'case':45} {'GB/s':>8} {'seconds':>9}")
for r in rows:
    res = r["result"]
    gbps = res.get("gb_per_s", res.get("xxh64_gb_per_s"))
    print(f"{r['case']:45} {gbps:8.2f} {res.get('seconds', float('nan')):9.3f}")
PY
