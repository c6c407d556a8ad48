#!/usr/bin/env bash
# Builds and runs every test from a fresh clone: system packages, the release build with the whole
# suite (unit, multi-rank under mpirun, command line, h5py interop, golden numerics against PyTorch),
# the AddressSanitizer + UndefinedBehaviorSanitizer build with the unit, command-line and 1-2 rank
# tests, the parsers' libFuzzer targets for a bounded time, and the clang-format check. Exits non-zero
# on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

echo "== system packages"
./scripts/setup-debian.sh

echo "== format check (.clang-format)"
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror

echo "== release build and full test suite"
BUILD_DIR=build ./scripts/build.sh
(cd build && ctest -j"$jobs" --output-on-failure --timeout 600)

echo "== sanitizer build (ASan + UBSan): unit, command-line and 1-2 rank tests"
# Without the CUDA backend: the sanitizers do not see device code, and its tests need a GPU (the
# release suite above builds it and runs what needs none).
BUILD_DIR=build-asan ./scripts/build.sh -DSHARDKIT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DSHARDKIT_CUDA=OFF
# Left out under the sanitizers, to keep the command near CI's 30 minutes (they ran in the release
# suite above): tests whose worth is not in memory safety -- the help texts, the samples' configs, the
# browser's rendering (the report's C++ is in the unit tests), and the kill at each of the save
# protocol's 7 points (the other fault tests stay) -- and the multi-rank tests' 1-rank runs, whose code
# the 2-rank runs execute too, with partitions that cut through tensors.
(cd build-asan && ctest -j"$jobs" --output-on-failure --timeout 900 -L 'unit|cli|mpi-small' \
  -E '^(Help\.|cli\.report_renders|Cli\.EverySample|Faults\.AKillAtEachPoint)|/np1$')

echo "== fuzzing the parsers of untrusted input (libFuzzer + ASan + UBSan, 10 s per target)"
./scripts/fuzz.sh 10

echo "== all tests passed"
