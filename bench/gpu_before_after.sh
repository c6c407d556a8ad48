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
# --kv-heads-ratio 8"). KERNELS=1 then times each model's step kernels with both builds'
# shardkit_gpu_kernels_bench (GPT-2 at 16 x 1024, Llama presets at 4 x 2048, the training runs' shapes),
# twice each, alternating, and prints every kernel's ms a step side by side with after / before.
# BUILD_ONLY=before builds the other tree alone and stops (scripts/gpu-cuda-check.sh does it while its
# tests run, so that its later call here finds both builds made).
# Usage: bench/gpu_before_after.sh BEFORE_SRC [MODEL...]   (models default: gpt2 tinyllama-1.1b)
set -uo pipefail
cd "$(dirname "$0")/.."
before=${1:?usage: bench/gpu_before_after.sh BEFORE_SRC [MODEL...]}
shift
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(gpt2 tinyllama-1.1b)
rounds=${ROUNDS:-3}
build() {  # build <tree>: the two trees build at once (their compilers share the cores)
  local log=$1/build-gpu/before-after-build.log
  mkdir -p "$1/build-gpu"
  { cmake -S "$1" -B "$1/build-gpu" -DCMAKE_BUILD_TYPE=Release -DSHARDKIT_BUILD_TESTS=OFF &&
    cmake --build "$1/build-gpu" -j"$(nproc)" --target shardkit shardkit_cuda_module \
      $([ "${ATTENTION:-0}" != 0 ] && echo shardkit_attention_abi) \
      $([ "${KERNELS:-0}" != 0 ] && echo shardkit_gpu_kernels_bench); } > "$log" 2>&1 ||
    { echo "build failed: $1 (see $log)"; return 1; }
}
if [ "${BUILD_ONLY:-}" = before ]; then
  build "$before"
  exit
fi
build . &
after_build=$!
build "$before" &
before_build=$!
wait "$after_build" || { kill "$before_build" 2>/dev/null; exit 1; }
wait "$before_build" || exit 1
if [ "${ATTENTION:-0}" != 0 ]; then
  python3 bench/attention_tflops.py --lib build-gpu/bench/libshardkit_attention_abi.so \
    --before "$before/build-gpu/bench/libshardkit_attention_abi.so" ${ATTENTION_ARGS:-} 2>&1 | grep -v '^{'
fi
if [ "${KERNELS:-0}" != 0 ]; then
  for model in "${models[@]}"; do
    shape="--batch 16 --seq 1024"
    [[ $model != gpt2* ]] && shape="--batch 4 --seq 2048"
    for round in 1 2; do
      for side in after before; do
        tree=.
        [ "$side" = before ] && tree=$before
        "$tree/build-gpu/bench/shardkit_gpu_kernels_bench" --model "$model" $shape --json 2>&1 | grep '^{' |
          sed "s/^/$side /"
      done
    done | python3 -c '
import json, statistics, sys
runs = {"after": [], "before": []}
for line in sys.stdin:
    side, text = line.split(" ", 1)
    runs[side].append({k["name"]: k["ms_per_call"] * k["calls"] for k in json.loads(text)["kernels"]})
if not runs["after"] or not runs["before"]:
    sys.exit("kernel benchmark failed")
# Rows one build lacks (a kernel added or removed) print a dash there; each sum is of that build alone.
med = {side: {n: statistics.median(r[n] for r in rs) for n in rs[0]} for side, rs in runs.items()}
names = list(med["after"]) + [n for n in med["before"] if n not in med["after"]]
print(f"{sys.argv[1]}: ms a step, after / before (medians of 2)")
rows = [(n, med["after"].get(n), med["before"].get(n)) for n in names]
rows.append(("sum", sum(med["after"].values()), sum(med["before"].values())))
for n, a, b in rows:
    ratio = "%7.3f" % (a / b) if a is not None and b else "      -"
    print("  %-38s %9s %9s %s" % (n, "-" if a is None else "%.3f" % a, "-" if b is None else "%.3f" % b, ratio))' "$model"
  done
fi
for model in "${models[@]}"; do
  for round in $(seq "$rounds"); do
    for side in after before; do
      binary=build-gpu/shardkit
      [ "$side" = before ] && binary=$before/build-gpu/shardkit
      run=$(python3 bench/gpu_vs_pytorch.py --shardkit "$binary" --model "$model" --skip-pytorch \
              --steps "${STEPS:-15}" 2>&1)
      tps=$(grep '^{' <<< "$run" | head -1 | python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["tokens_per_s"])' 2>/dev/null)
      echo "$model $side round $round: ${tps:-failed: $(tail -1 <<< "$run")} tokens/s"
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
