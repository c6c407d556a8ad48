#!/usr/bin/env bash
# The main job, end to end on CPU ranks, printing what each step does. It grows with the project;
# today: build, write a sharded checkpoint from 2 MPI ranks, list, inspect and verify it, write the
# same state laid out for 3 ranks and ZeRO stage 3 (compressed), and prove both hold the same numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # mpirun as root (containers)
run=${RUN_DIR:-runs/quickstart}
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "1. System packages (Debian 12 / Ubuntu 24.04)"
./scripts/setup-debian.sh

step "2. Build (CMake, build/)"
./scripts/build.sh >/dev/null
sk=build/shardkit
echo "built $($sk --version)"

rm -rf "$run"
step "3. Two MPI ranks each write their shard of a 256 MiB checkpoint (ZeRO stage 1 layout), durably"
mpirun -n 2 --oversubscribe $sk bench ckpt --size 256MiB --dir "$run/stage1" --stage 1

step "4. List the run directory (* = latest)"
$sk ckpt ls "$run/stage1"

step "5. Inspect: layout, tensors, shards"
$sk ckpt inspect "$run/stage1" | head -n 20

step "6. Verify every chunk against its XXH64 checksum"
$sk ckpt verify "$run/stage1"

step "7. The same state from 3 ranks, ZeRO stage 3 layout, zstd-compressed chunks"
mpirun -n 3 --oversubscribe $sk bench ckpt --size 256MiB --dir "$run/stage3" --stage 3 --compress 3
$sk ckpt ls "$run/stage3"

step "8. Compare the two checkpoints tensor by tensor: different layouts, identical numbers"
$sk ckpt diff "$run/stage1" "$run/stage3"

step "9. Read a compressed shard with standard HDF5 tools through shardkit's zstd plugin"
HDF5_PLUGIN_PATH="$PWD/build" h5dump -d /state/fp32 -s 16 -c 4 "$run/stage3/step-00000001/shard-00002-of-00003.h5" |
  sed -n '/DATA {/,/}/p'

step "Done: checkpoints in $run"
