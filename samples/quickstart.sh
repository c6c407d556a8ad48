#!/usr/bin/env bash
# The main job, end to end on CPU ranks, printing what each step does: build; tokenize a text that
# ships with the repository; train gpt2-tiny on 2 MPI ranks (ZeRO stage 2) with periodic sharded
# checkpoints; resume the run on 3 ranks at ZeRO stage 3 (the checkpoint is resharded as it loads);
# list, inspect and verify the checkpoints; compare layouts; evaluate the final weights.
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
mkdir -p "$run"
step "3. Tokenize the repository's documentation, byte-level (vocabulary 256)"
cat README.md docs/*.md > "$run/text.txt"
$sk data encode "$run/text.txt" -o "$run/text.bin"

step "4. Train gpt2-tiny on 2 ranks, ZeRO stage 2, 60 steps, a checkpoint every 20 (each rank writes its shard)"
mpirun -n 2 --oversubscribe $sk train --config samples/configs/tiny_zero2.json --model gpt2-tiny \
  --data "$run/text.bin" --steps 60 --save-interval 20 --save-dir "$run/ckpt" --metrics "$run/metrics.jsonl"

step "5. The checkpoints of the run (* = latest)"
$sk ckpt ls "$run/ckpt"

step "6. Resume on 3 ranks at ZeRO stage 3 to step 100: each rank reads only its new partition's ranges"
mpirun -n 3 --oversubscribe $sk train --config samples/configs/tiny_zero3.json --model gpt2-tiny \
  --data "$run/text.bin" --steps 100 --save-interval 20 --save-dir "$run/ckpt" --metrics "$run/metrics.jsonl"
$sk ckpt ls "$run/ckpt"

step "7. Inspect and verify the newest checkpoint (written by 3 ranks, stage 3)"
$sk ckpt inspect "$run/ckpt" | head -n 10
$sk ckpt verify "$run/ckpt"

step "8. Evaluate: mean next-token cross-entropy before (step 20) and after (step 100) training"
$sk eval "$run/ckpt/step-00000020" --data "$run/text.bin" --windows 32
$sk eval "$run/ckpt" --data "$run/text.bin" --windows 32

step "9. Layout independence: a synthetic state written by 2 ranks (stage 1) and 3 ranks (stage 3, zstd)"
mpirun -n 2 --oversubscribe $sk bench ckpt --size 64MiB --dir "$run/synthetic1" --stage 1 >/dev/null
mpirun -n 3 --oversubscribe $sk bench ckpt --size 64MiB --dir "$run/synthetic3" --stage 3 --compress 3 >/dev/null
$sk ckpt diff "$run/synthetic1" "$run/synthetic3"

step "10. Standard HDF5 tools read a compressed shard through shardkit's zstd plugin"
HDF5_PLUGIN_PATH="$PWD/build" h5dump -d /state/fp32 -s 16 -c 4 "$run/synthetic3/step-00000001/shard-00002-of-00003.h5" |
  sed -n '/DATA {/,/}/p'

step "Done: everything is in $run (metrics: $run/metrics.jsonl)"
