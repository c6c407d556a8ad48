#!/usr/bin/env bash
# CUDA backend checks on the GPU machine, in one call: build, the CUDA tests (1 rank, and 2 ranks when
# two GPUs are visible), the per-kernel time of a GPT-2 step, and the training speed benchmark
# (PYTORCH=1: with PyTorch side by side; OFFLOAD=1: with ZeRO-Offload; STEPS=n timed steps).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
log() { printf '\n== %s\n' "$*"; }
gpus=$(nvidia-smi --list-gpus | wc -l)
log "build ($gpus GPU(s))"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release > "$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
echo "build ok"

log "CUDA tests"
(cd build-gpu && ctest -L cuda --output-on-failure --timeout 900 > "$out/ctest-cuda.log" 2>&1; grep -E "Passed|Failed|Skipped|Failure|Expected|Which|error|rror" "$out/ctest-cuda.log" | head -60)

log "kernel time per step (GPT-2 124M, bf16, B16 x 1024)"
build-gpu/bench/shardkit_gpu_kernels_bench | tee "$out/kernels.txt"

log "training speed (bench/gpu_vs_pytorch.py${PYTORCH:+, with PyTorch})"
python3 bench/gpu_vs_pytorch.py --shardkit build-gpu/shardkit --steps "${STEPS:-15}" \
  $([ -z "${PYTORCH:-}" ] && echo --skip-pytorch) ${OFFLOAD:+--offload} 2>&1 | tee "$out/speed.txt" | tail -12
