#!/usr/bin/env bash
# Builds and runs every test from a fresh clone, each test in one of two passes: system packages, the
# clang-format check and the include graph's layers; the release build (with the CUDA backend where nvcc is installed, so that its
# code is compiled), running the tests the sanitizer pass leaves out -- multi-rank runs at 1, 3 and 4
# ranks, h5py and PyTorch interop, the CUDA tests (those that need a GPU skip), the help texts, the
# samples' configs, the browser rendering of the report and the kill at each point of the save
# protocol; the AddressSanitizer + UndefinedBehaviorSanitizer build (no CUDA) with the unit,
# command-line and 2-rank tests; the parsers' libFuzzer targets for a bounded time. Exits non-zero on
# the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

# The sanitizer pass runs the tests with these labels except those named by $release_only, which run
# in the release pass instead, with every test of the other labels. Their worth is not in memory
# safety: the help texts and progress lines (the commands they run are the other CLI tests' too), the
# samples' configs, the browser's rendering (the report's C++ is in the unit tests), the kill at each of the save protocol's 7 points (the other fault tests stay), Lion's
# runs through the engines (its update's memory safety is the unit tests'), and the
# multi-rank tests' 1-rank runs, whose code the 2-rank runs execute too, with partitions that cut
# through tensors. No test runs twice but the numerics tests (both_labels).
sanitized_labels='^(unit|cli|mpi-small)$'
# The numerics tests (the optimizers' updates, the type conversions) run in both passes: their bits
# depend on the code the compiler generated, which only the release build vectorises.
both_labels='numerics'
release_only='^(Help\.|Progress\.|cli\.report_renders|Cli\.EverySample|Faults\.AKillAtEachPoint|TrainMpi\.Lion)|/np1$'

echo "== system packages"
./scripts/setup-debian.sh

echo "== format check (.clang-format)"
git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror

echo "== include graph (docs/ARCHITECTURE.md's layers)"
python3 scripts/check_includes.py

# Both builds carry line tables only (-g1): backtraces and sanitizer reports keep their file:line, and
# the C++ compiles take about a quarter less time (release) than with full debug information.
echo "== release build (without the unit tests, which only the sanitizer pass runs)"
BUILD_DIR=build ./scripts/build.sh "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DSHARDKIT_UNIT_TESTS=OFF
echo "== release tests: 3-4 rank, interop, CUDA, and what the sanitizer pass leaves out"
(cd build && ctest -j"$jobs" --output-on-failure --timeout 600 -LE "$sanitized_labels")
(cd build && ctest -j"$jobs" --output-on-failure --timeout 600 -L "$sanitized_labels" -R "$release_only")

echo "== sanitizer build (ASan + UBSan): unit, command-line and 2-rank tests"
# Without the CUDA backend: the sanitizers do not see device code, and its tests need a GPU (the
# release pass above builds it and runs what needs none). At -O0: -O1 runs the tests faster, but took
# about as much longer to compile (24.6 CPU-minutes against about 16) as that saves.
# Executables linked without PIE: an instrumented -O0 test binary carries about a million relative
# relocations, which the loader applies page by page at every start: 0.25-0.34 s against 0.17-0.21 s
# for `shardkit --help`, in a pass that starts hundreds of processes. For the same reason the unit
# tests run as 4 processes (GoogleTest shards), not one per test.
BUILD_DIR=build-asan ./scripts/build.sh -DSHARDKIT_SANITIZE=ON -DSHARDKIT_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1 -DCMAKE_EXE_LINKER_FLAGS=-no-pie -DSHARDKIT_UNIT_TEST_SHARDS=4
(cd build-asan && ctest -j"$jobs" --output-on-failure --timeout 900 -L "$sanitized_labels" -E "$release_only")
(cd build-asan && ctest -j"$jobs" --output-on-failure --timeout 900 -L "^($both_labels)$")

echo "== fuzzing the parsers of untrusted input (libFuzzer + ASan + UBSan, 10 s per target)"
./scripts/fuzz.sh 10

echo "== all tests passed"
