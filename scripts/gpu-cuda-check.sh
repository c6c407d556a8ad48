#!/usr/bin/env bash
# CUDA backend checks on the GPU machine, in one call: build, the CUDA tests (1 rank, and 2 ranks when
# two GPUs are visible), and short training runs of gpt2-tiny and GPT-2 124M (bf16) on the GPU.
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

log "training runs"
sk=build-gpu/shardkit
python3 -c "
import numpy as np; np.random.default_rng(0).integers(0, 50257, 20_000_000).astype('<u2').tofile('$out/tokens.bin')"
cat > "$out/ds_bf16.json" <<'JSON'
{"train_batch_size": 16, "gradient_clipping": 1.0, "bf16": {"enabled": true}, "steps_per_print": 5,
 "zero_optimization": {"stage": 1}, "wall_clock_breakdown": true,
 "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.1}}}
JSON
timeout 300 $sk train --config "$out/ds_bf16.json" --model gpt2 --data "$out/tokens.bin" --steps 15 --device cuda 2>&1 | tail -8
