#!/usr/bin/env bash
# Configures and builds shardkit into build/ (or $BUILD_DIR). Extra arguments go to CMake. With
# BUILD_TARGET (e.g. shardkit) only that target and what it needs: the samples need no test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build "$build_dir" -j"$(nproc)" ${BUILD_TARGET:+--target "$BUILD_TARGET"}
