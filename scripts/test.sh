#!/usr/bin/env bash
# Builds and runs every test from a fresh clone: system packages, the release build with the whole
# suite (unit, multi-rank under mpirun, command line, h5py interop), the AddressSanitizer +
# UndefinedBehaviorSanitizer build with the single-process and command-line tests, and the
# clang-format check. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)

echo "== system packages"
./scripts/setup-debian.sh

echo "== format check (.clang-format)"
git ls-files '*.cpp' '*.hpp' | xargs clang-format --dry-run --Werror

echo "== release build and full test suite"
BUILD_DIR=build ./scripts/build.sh
(cd build && ctest -j"$jobs" --output-on-failure --timeout 600)

echo "== sanitizer build (ASan + UBSan) and its tests"
BUILD_DIR=build-asan ./scripts/build.sh -DSHARDKIT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
(cd build-asan && ctest -j"$jobs" --output-on-failure --timeout 600)

echo "== all tests passed"
