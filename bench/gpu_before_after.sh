#!/usr/bin/env bash
# Training speed of two builds on one GPU in one call: this tree and another source tree (an older
# commit's files, e.g. `git archive <commit> | tar -x -C .before`), so that a change meant to leave the
# speed alone is measured against the code before it, not against a figure from another day. Builds
# both (Release, the shardkit target), then runs bench/gpu_vs_pytorch.py --skip-pytorch for each model,
# alternating the two binaries ROUNDS times (default 3) so that clock and thermal drift fall on both,
# and prints each run's tokens/s and the medians' ratio (after / before). ATTENTION=1 first times both
# builds' attention kernels in one process, alternating (bench/attention_tflops.py --before), and prints
# the table with this build's speed over the other's; ATTENTION_ARGS adds arguments to that script
# (e.g. tinyllama's attention: "--tokens 8192 --seqs 2048 --head-sizes 64 --hidden 2048
# --kv-heads-ratio 8").
# Usage: bench/gpu_before_after.sh BEFORE_SRC [MODEL...]   (models default: gpt2 tinyllama-1.1b)
set -uo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: bench/gpu_before_after.sh BEFORE_SRC [MODEL...]}
shift
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(gpt2 tinyllama-1.1b)
rounds=${ROUNDS:-3}
for tree in . "$before"; do
  cmake -S "$tree" -B "$tree/build-gpu" -DCMAKE_BUILD_TYPE=Release -DSHARDKIT_BUILD_TESTS=OFF > /dev/null ||
    { echo "configure failed: $tree"; exit 1; }
  cmake --build "$tree/build-gpu" -j"$(nproc)" --target shardkit shardkit_cuda_module \
    $([ "${ATTENTION:-0}" != 0 ] && echo shardkit_attention_abi) > /dev/null || { echo "build failed: $tree"; exit 1; }
done
if [ "${ATTENTION:-0}" != 0 ]; then
  python3 bench/attention_tflops.py --lib build-gpu/bench/libshardkit_attention_abi.so \
    --before "$before/build-gpu/bench/libshardkit_attention_abi.so" ${ATTENTION_ARGS:-} 2>&1 | grep -v '^{'
fi
for model in "${models[@]}"; do
  for round in $(seq "$rounds"); do
    for side in after before; do
      binary=build-gpu/shardkit
      [ "$side" = before ] && binary=$before/build-gpu/shardkit
      tps=$(python3 bench/gpu_vs_pytorch.py --shardkit "$binary" --model "$model" --skip-pytorch \
              --steps "${STEPS:-15}" 2>/dev/null | grep '^{' | head -1 |
            python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["tokens_per_s"])')
      echo "$model $side round $round: ${tps:-failed} tokens/s"
    done
  done
done | tee /dev/stderr | python3 -c '
import statistics, sys
runs = {}
for line in sys.stdin:
    model, side, _, _, tps, *_ = line.split()
    if tps != "failed:" and tps.isdigit():
        runs.setdefault(model, {}).setdefault(side, []).append(int(tps))
for model, sides in runs.items():
    if len(sides) == 2:
        a, b = statistics.median(sides["after"]), statistics.median(sides["before"])
        print(f"{model}: before {b:.0f}, after {a:.0f} tokens/s (medians), after / before {a / b:.4f}")'
