#!/usr/bin/env bash
# Everything to run on the GPU machine in one call: machine facts, the native build, the CPU test
# suite, the Hugging Face interop check and the converter benchmark. Writes logs to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
log() { printf '\n== %s\n' "$*"; }

log "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nproc; free -g | head -2; df -h . | tail -1
for p in libhdf5-dev libzstd-dev libopenmpi-dev libcli11-dev nlohmann-json3-dev libgtest-dev libopenblas-dev hdf5-tools; do
  printf '%s: %s\n' "$p" "$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo missing)"
done
cmake --version | head -1; nvcc --version | tail -1; which mpirun h5dump python3
python3 -c 'import torch, transformers, safetensors, h5py; print("torch", torch.__version__, "transformers", transformers.__version__)'

log "build"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release > "$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
grep -E "shardkit:" "$out/cmake.log"
cmake --build build-gpu -j"$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
echo "build ok"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  log "CPU test suite"
  (cd build-gpu && ctest -j8 --timeout 600 -LE interop > "$out/ctest.log" 2>&1; tail -5 "$out/ctest.log"; grep -E "\(Failed\)|\*\*\*" "$out/ctest.log" | head -20)
fi

log "Hugging Face check"
python3 scripts/hf_check.py --shardkit build-gpu/shardkit 2>&1 | tee "$out/hf_check.json" | tail -30

log "converter benchmark"
SK=build-gpu/shardkit PYTHON=python3 ./bench/convert_bench.sh 2>&1 | tee "$out/convert_bench.log" | tail -4
