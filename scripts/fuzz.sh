#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, Clang with ASan + UBSan) in build-fuzz and runs each for a
# bounded time, starting from the seed corpus in fuzz/corpus/ (new inputs go to a scratch copy, not
# into the repository; the shard and token file targets write their seeds there themselves).
# Usage: scripts/fuzz.sh [SECONDS per target, default 30]. A crash, leak, UB or timeout of a target fails the script;
# libFuzzer writes the input that did it to build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DSHARDKIT_FUZZ=ON -DSHARDKIT_CUDA=OFF -DSHARDKIT_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" > /dev/null
cmake --build build-fuzz -j"$(nproc)" > /dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for target in manifest ds_config safetensors_header token_file shard torch_file ds_checkpoint dcp_checkpoint; do
  rm -rf "${work:?}"/*
  if [ -d "fuzz/corpus/$target" ]; then cp -r "fuzz/corpus/$target/." "$work/"; fi
  echo "-- fuzz_$target: ${seconds} s"
  if ! (cd build-fuzz && SHARDKIT_FUZZ_SEEDS="$work" "./fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 "$work" > "fuzz_$target.log" 2>&1); then
    tail -40 "build-fuzz/fuzz_$target.log"
    echo "fuzz_$target failed: the input is in build-fuzz/ (crash-*, leak-*, timeout-*)"
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|cov: .* ft: " "build-fuzz/fuzz_$target.log" | tail -3
done
