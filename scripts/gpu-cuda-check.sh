#!/usr/bin/env bash
# CUDA backend checks on the GPU machine, in one call: build, the CUDA tests (1 rank, and 2 ranks when
# two GPUs are visible), the per-kernel time of a GPT-2 step, and the training speed benchmark
# (PYTORCH=1: with PyTorch side by side; STEPS=n timed steps; with 2 GPUs also the per-stage step
# breakdown and what the gradient reductions cost alone and beside the backward pass), and gpt2-xl
# (1.5 B parameters) at stage 3 on 2 GPUs and at stage 2 with the optimizer offloaded to the CPU on
# 1 GPU (XL=0 skips it), and, with 2 GPUs, checkpoint speed against the disk (CKPT=0 skips it). TESTS=0
# and SPEED=0 skip the tests and the kernel and training-speed benchmarks; BUCKET=n sets the training
# benchmark's reduce_bucket_size. PROFILE=1 adds Nsight Compute's view (occupancy, pipe use, stall
# reasons) of the attention and LayerNorm kernels at the step's shapes. NVME=1 adds ZeRO-Infinity
# against host-memory offload and the disk (bench/gpu_nvme_bench.sh; NVME_BIG=1 with its 4 B model).
# ACTCKPT=1 adds activation checkpointing: llama-2-7b's shape at stage 1 with ACTCKPT_SEQ (default
# 8192) tokens a sample, without it (refused by the memory plan), with it, and with its inputs in host
# memory: tokens/s, MFU, the plan against the measured memory (bench/gpu_scale_bench.py).
# FIGURES=bars,kernels,scale,eval,ckpt,nvme,bigckpt (any of them, in that order) re-measures README's
# one-GPU figures: `kernels` trains GPT-2 and tinyllama-1.1b with either attention implementation
# (SHARDKIT_ATTENTION=mma, then sm90, twice, alternating); `scale` the multi-billion models
# (bench/gpu_scale_bench.py: GPT-2's architecture at 6.65 B and llama-2-7b's shape at stages 1, 2 and 3
# with offload), `eval` 7B evaluation beside transformers (bench/gpu_eval_bench.py), `ckpt`
# checkpointing gpt2-xl at stage 1 (bench/gpu_ckpt_bench.sh), `nvme` the optimizer states on NVMe
# (bench/gpu_nvme_bench.sh) and `bigckpt` a 2.88 B model's checkpoint (bench/gpu_big_ckpt_bench.sh),
# with the commands README quotes; each step's output in $OUT/figures-*.txt. `bars` measures the
# kernels' acceptance set in one go: GPT-2 and tinyllama-1.1b beside PyTorch (eager and torch.compile),
# llama-2-7b's shape at stage 1 with 16 micro-batches a step (131 GB: the memory plan refuses it on a
# smaller card and says so; BARS_7B="1x16 2x8 1x32" adds other micro-batch x accumulation splits, each
# in turn), and the attention at 2k tokens, head size 128, beside SDPA's backends.
# POWER=1 adds what the GPU sustains under its power limit (bench/gpu_power_ceiling.py: cuBLAS's bf16
# products in a burst and held, and the clock and power while tinyllama-1.1b trains).
# STEP_PROFILE=1 adds every kernel of one training step of GPT-2 and tinyllama timed by Nsight Compute,
# beside the step's time (bench/gpu_step_profile.sh).
# ATTENTION=1 adds the attention kernels' TFLOP/s beside PyTorch's SDPA backends at 2k/4k/8k tokens and
# head sizes 64 and 128 (bench/attention_tflops.py). HOPPER=1 does only what the sm_90 kernels need and
# stops: builds the kernel tests and the attention library, runs the building-block probes and the
# attention tests (Sm90Probes, HopperAttention: each ends its process if a kernel hangs), then the
# attention table, the sm_90 kernels' times from Nsight Compute, and the step's kernels at GPT-2's and
# tinyllama's shapes with either attention.
# BEFORE=<tree> (another commit's files: `git archive <commit> | tar -x -C .before`) builds that tree
# while the tests run and, after them, times its kernels and this tree's in the same processes
# (bench/gpu_before_after.sh: the attention at BEFORE_ATTENTION_ARGS, default 2k tokens, then every
# kernel of GPT-2's and tinyllama's steps; BEFORE_ROUNDS=n adds n alternating training runs a model).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
log() { printf '\n== %s\n' "$*"; }
# NVMe offload needs liburing; a machine without its development package may carry a copy in
# build-deps/liburing (scripts/carry-liburing.sh makes it where liburing-dev is installed).
if ! pkg-config --exists liburing && [ -d build-deps/liburing ]; then
  export PKG_CONFIG_PATH=$PWD/build-deps/liburing/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
fi
gpus=$(nvidia-smi --list-gpus | wc -l)
if [ -n "${BEFORE:-}" ] && [ "${HOPPER:-0}" = 0 ]; then
  BUILD_ONLY=before ATTENTION=1 KERNELS=1 nice bench/gpu_before_after.sh "$BEFORE" > "$out/before-build.log" 2>&1 &
  before_build=$!
fi

if [ "${HOPPER:-0}" != 0 ]; then
  log "sm_90 kernels: build"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSHARDKIT_BUILD_TESTS=ON > "$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log"; exit 1; }
  cmake --build build-gpu -j"$(nproc)" --target shardkit_cuda_kernel_tests shardkit_attention_abi \
    shardkit_gpu_kernels_bench > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
  for suite in Sm90Probes HopperAttention; do
    log "$suite"
    timeout 300 build-gpu/tests/shardkit_cuda_kernel_tests --gtest_filter="$suite.*" > "$out/$suite.log" 2>&1
    status=$?
    echo "exit $status"; grep -E "^\[  |Failure|Expected|Which|error|stuck|rror" "$out/$suite.log" | head -40
  done
  # A kernel that failed its test could hang the benchmark: the table only after the tests pass.
  if [ "$status" = 0 ]; then
    log "attention TFLOP/s beside SDPA's backends (bench/attention_tflops.py)"
    timeout 600 python3 bench/attention_tflops.py --lib build-gpu/bench/libshardkit_attention_abi.so 2>&1 |
      tee "$out/attention.txt" | grep -v '^{'
    # How the sm_90 kernels split the time (forward, dq, dk/dv) at 2k tokens, from Nsight Compute.
    for hs in 64 128; do
      log "sm_90 kernel times, 2k tokens, head size $hs (Nsight Compute)"
      for pass in forward d; do  # the forward kernel; then the backward's dq and dk/dv kernels
        timeout 120 ncu --clock-control none --kernel-name "regex:hopper_$pass" --launch-skip 2 --launch-count 2 \
          --metrics gpu__time_duration.sum python3 bench/attention_tflops.py \
          --lib build-gpu/bench/libshardkit_attention_abi.so --seqs 2048 --head-sizes "$hs" 2>&1 |
          grep -E "hopper_[a-z]+_kernel|gpu__time" | sed -E 's/^ *//; s/\(CUtensorMap.*//' | tee -a "$out/ncu-sm90-$hs.txt"
      done
    done
    # Every kernel of a training step at the models' shapes, with each attention implementation.
    for kernels in mma sm90; do
      for shape in "gpt2 16 1024" "tinyllama-1.1b 4 2048"; do
        set -- $shape
        log "step kernels, $1 $2 x $3, SHARDKIT_ATTENTION=$kernels"
        SHARDKIT_ATTENTION=$kernels timeout 300 build-gpu/bench/shardkit_gpu_kernels_bench --model "$1" --batch "$2" \
          --seq "$3" 2>&1 | tee "$out/kernels-$1-$kernels.txt" | grep -iE "attention|sum|total"
      done
    done
  fi
  exit 0
fi

log "build ($gpus GPU(s))"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSHARDKIT_BUILD_TESTS=ON > "$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log"; exit 1; }
# Only what this script runs: the CPU test binaries would double the build.
cmake --build build-gpu -j"$(nproc)" --target shardkit shardkit_cuda_tests shardkit_cuda_kernel_tests \
  shardkit_cuda_cli_tests shardkit_gpu_kernels_bench shardkit_gpu_comm_bench shardkit_attention_abi > "$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
echo "build ok"

if [ "${TESTS:-1}" != 0 ]; then
  log "CUDA tests"
  (cd build-gpu && ctest -L cuda --output-on-failure --timeout 900 > "$out/ctest-cuda.log" 2>&1; grep -E "Passed|Failed|Skipped|Failure|Expected|Which|error|rror" "$out/ctest-cuda.log" | head -60)
fi

if [ -n "${BEFORE:-}" ]; then
  log "this tree against $BEFORE: attention and step kernels (bench/gpu_before_after.sh)"
  if wait "$before_build"; then
    ATTENTION=1 ATTENTION_ARGS="${BEFORE_ATTENTION_ARGS:---seqs 2048}" KERNELS=1 ROUNDS="${BEFORE_ROUNDS:-0}" \
      timeout 900 bench/gpu_before_after.sh "$BEFORE" 2>&1 | tee "$out/before-after.txt"
  else
    tail -5 "$out/before-build.log"
  fi
fi

if [ "${SPEED:-1}" != 0 ]; then
  log "kernel time per step (GPT-2 124M, bf16, B16 x 1024)"
  build-gpu/bench/shardkit_gpu_kernels_bench | tee "$out/kernels.txt"

  if [ "${PROFILE:-0}" != 0 ]; then
    log "Nsight Compute: attention and LayerNorm backward kernels"
    stalls=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier long_scoreboard \
      short_scoreboard mio_throttle math_pipe_throttle wait not_selected lg_throttle no_instruction)
    stalls+=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
    for k in flash_forward flash_dq flash_dkv layernorm_backward_kernel; do
      ncu --clock-control none --kernel-name "regex:$k" --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --metrics "$stalls" \
        build-gpu/bench/shardkit_gpu_kernels_bench > "$out/ncu-$k.txt" 2>&1
      grep -E "^  [a-z_ ]+kernel|Duration|Throughput|Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|smsp__|sm__pipe|l1tex__" "$out/ncu-$k.txt" | head -45
    done
  fi

  if [ "${ATTENTION:-0}" != 0 ]; then
    log "attention TFLOP/s beside SDPA's backends (bench/attention_tflops.py)"
    timeout 600 python3 bench/attention_tflops.py --lib build-gpu/bench/libshardkit_attention_abi.so 2>&1 |
      tee "$out/attention.txt" | grep -v '^{'
  fi

  log "training speed (bench/gpu_vs_pytorch.py${PYTORCH:+, with PyTorch})"
  python3 bench/gpu_vs_pytorch.py --shardkit build-gpu/shardkit --steps "${STEPS:-15}" \
    $([ -z "${PYTORCH:-}" ] && echo --skip-pytorch) ${BUCKET:+--bucket "$BUCKET"} --offload 2>&1 | tee "$out/speed.txt" | tail -14

  if [ "$gpus" -ge 2 ]; then
    log "where a step's time goes per stage and reduction type (bench/gpu_step_breakdown.sh)"
    bench/gpu_step_breakdown.sh build-gpu/shardkit 2>&1 | tee "$out/breakdown.txt"
    log "gradient reductions alone and beside the backward pass's products (shardkit_gpu_comm_bench)"
    for wire in fp32 bf16; do
      mpirun -n "$gpus" --bind-to none -x NCCL_NVLS_ENABLE build-gpu/bench/shardkit_gpu_comm_bench --wire "$wire" --json \
        2>&1 | tee "$out/comm-$wire.txt"
    done
    echo "-- the same with NCCL's Simple protocol only (LL and LL128 keep SMs polling flags)"
    NCCL_PROTO=Simple mpirun -n "$gpus" --bind-to none -x NCCL_NVLS_ENABLE -x NCCL_PROTO \
      build-gpu/bench/shardkit_gpu_comm_bench --json 2>&1 | tee "$out/comm-fp32-simple.txt"
  fi
fi

if [ "${XL:-1}" != 0 ]; then
  log "gpt2-xl: the memory each GPU holds, and a few steps"
  python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, 4_000_000).astype('<u2').tofile('$out/xl.bin')"
  xl() {  # xl <ranks> <stage> <offload: true|false>
    cat > "$out/xl.json" <<JSON
{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true}, "steps_per_print": 1,
 "zero_optimization": {"stage": $2 $([ "$3" = true ] && echo ', "offload_optimizer": {"device": "cpu", "pin_memory": true}')},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}
JSON
    timeout 300 mpirun -n "$1" --bind-to none build-gpu/shardkit train --config "$out/xl.json" --model gpt2-xl \
      --data "$out/xl.bin" --steps 4 --device cuda 2>&1 | grep -E "rank [0-9]|step +[0-9]|error" | head -12
    nvidia-smi --query-gpu=index,memory.total --format=csv,noheader
  }
  if [ "$gpus" -ge 2 ]; then echo "-- stage 3, 2 GPUs"; xl 2 3 false; fi
  echo "-- stage 2 + CPU optimizer offload, 1 GPU"; xl 1 2 true
fi

if [ "${NVME:-0}" != 0 ]; then
  log "ZeRO-Infinity: optimizer states on NVMe against host memory and the disk (bench/gpu_nvme_bench.sh)"
  SK=build-gpu/shardkit BIG=${NVME_BIG:-0} timeout 900 bench/gpu_nvme_bench.sh "${NVME_DIR:-/tmp/gpu-nvme}" 2>&1
fi

if [ "${ACTCKPT:-0}" != 0 ]; then
  log "activation checkpointing: llama-2-7b's shape, stage 1, ${ACTCKPT_SEQ:-8192} tokens a sample (bench/gpu_scale_bench.py)"
  timeout 900 python3 bench/gpu_scale_bench.py --shardkit build-gpu/shardkit --family llama --cases s1,s1-ac,s1-ac-cpu \
    --seq "${ACTCKPT_SEQ:-8192}" --micro-batch 1 --steps 4 --dir "$out/actckpt" 2>&1 | tee "$out/actckpt.txt"
fi

figures=",${FIGURES:-},"
if [[ $figures == *,bars,* ]]; then
  for model in gpt2 tinyllama-1.1b; do
    log "$model beside PyTorch (bench/gpu_vs_pytorch.py --steps 15)"
    timeout 600 python3 bench/gpu_vs_pytorch.py --shardkit build-gpu/shardkit --steps 15 --model "$model" 2>&1 |
      tee "$out/figures-bars-$model.txt" | tail -5
  done
  for shape in ${BARS_7B:-1x16}; do  # <micro-batch>x<micro-batches a step>
    log "llama-2-7b's shape at stage 1, ${shape#*x} micro-batches of ${shape%x*} x 2048 a step (bench/gpu_scale_bench.py)"
    timeout 600 python3 bench/gpu_scale_bench.py --shardkit build-gpu/shardkit --family llama --cases s1 --seq 2048 \
      --micro-batch "${shape%x*}" --accumulation "${shape#*x}" --steps 4 --dir /tmp/gpu-bars-7b 2>&1 |
      tee "$out/figures-bars-7b-$shape.txt" | tail -6
  done
  log "attention at 2k tokens, head size 128, beside SDPA (bench/attention_tflops.py)"
  timeout 300 python3 bench/attention_tflops.py --lib build-gpu/bench/libshardkit_attention_abi.so --seqs 2048 \
    --head-sizes 128 --rounds 3 2>&1 | tee "$out/figures-bars-attention.txt" | grep -v '^{'
fi
if [[ $figures == *,kernels,* ]]; then
  for model in gpt2 tinyllama-1.1b; do
    for kernels in mma sm90 mma sm90; do
      log "$model with SHARDKIT_ATTENTION=$kernels (bench/gpu_vs_pytorch.py --skip-pytorch --steps 15)"
      SHARDKIT_ATTENTION=$kernels timeout 300 python3 bench/gpu_vs_pytorch.py --shardkit build-gpu/shardkit \
        --skip-pytorch --steps 15 --model "$model" 2>&1 | tee -a "$out/figures-kernels-$model-$kernels.txt" | tail -2
    done
  done
fi
if [[ $figures == *,scale,* ]]; then
  scale() {  # scale <name> <gpu_scale_bench.py arguments>
    local name=$1
    shift
    log "multi-billion on one GPU: $name (bench/gpu_scale_bench.py $*)"
    timeout 900 python3 bench/gpu_scale_bench.py --shardkit build-gpu/shardkit --dir "/tmp/gpu-scale-$name" "$@" 2>&1 |
      tee "$out/figures-scale-$name.txt"
  }
  scale gpt2-accumulation --cases s1 --accumulation 8 --steps 4
  scale gpt2 --cases s1,s2-cpu,s3-cpu --steps 4
  scale llama-accumulation --family llama --cases s1 --seq 2048 --micro-batch 1 --accumulation 8 --steps 4
  scale llama --family llama --cases s1,s2-cpu,s3-cpu --seq 2048 --micro-batch 1 --steps 4
fi
if [[ $figures == *,eval,* ]]; then
  log "7B evaluation beside transformers (bench/gpu_eval_bench.py)"
  timeout 900 python3 bench/gpu_eval_bench.py --shardkit build-gpu/shardkit --dir /tmp/gpu-eval 2>&1 |
    tee "$out/figures-eval.txt"
fi
if [[ $figures == *,ckpt,* ]]; then
  log "checkpointing gpt2-xl on one GPU at stage 1 against the disk (bench/gpu_ckpt_bench.sh)"
  RANKS=1 STAGE=1 MB=4 INTERVAL=400 STAGING=auto SK=build-gpu/shardkit timeout 900 bench/gpu_ckpt_bench.sh \
    /tmp/gpu-ckpt 2>&1 | tee "$out/figures-ckpt.txt" | tail -16
fi
if [[ $figures == *,nvme,* ]]; then
  log "ZeRO-Infinity on one GPU (bench/gpu_nvme_bench.sh)"
  SK=build-gpu/shardkit timeout 900 bench/gpu_nvme_bench.sh /tmp/gpu-nvme 2>&1 | tee "$out/figures-nvme.txt" | tail -20
fi
if [[ $figures == *,bigckpt,* ]]; then
  log "a 2.88 B model's checkpoint on one GPU (bench/gpu_big_ckpt_bench.sh)"
  SK=build-gpu/shardkit timeout 900 bench/gpu_big_ckpt_bench.sh /tmp/gpu-big-ckpt 2>&1 |
    tee "$out/figures-bigckpt.txt" | tail -20
fi

if [ "${POWER:-0}" != 0 ]; then
  log "what the GPU sustains under its power limit (bench/gpu_power_ceiling.py)"
  timeout 180 python3 bench/gpu_power_ceiling.py 2>&1 | tee "$out/power.txt"
  timeout 300 python3 bench/gpu_power_ceiling.py --during "python3 bench/gpu_vs_pytorch.py --shardkit build-gpu/shardkit \
    --skip-pytorch --steps 30 --model tinyllama-1.1b" 2>&1 | tail -3 | tee -a "$out/power.txt"
fi

if [ "${STEP_PROFILE:-0}" != 0 ]; then
  for shape in "gpt2 16 1024" "tinyllama-1.1b 4 2048"; do
    set -- $shape
    log "every kernel of one step, $1 $2 x $3 (bench/gpu_step_profile.sh, Nsight Compute)"
    MODEL=$1 BATCH=$2 SEQ=$3 OUT_DIR="$out" timeout 900 bench/gpu_step_profile.sh build-gpu/shardkit 2>&1 |
      tee "$out/step-profile-$1.txt" | grep -v '^{'
  done
fi

if [ "$gpus" -ge 2 ] && [ "${CKPT:-1}" != 0 ]; then
  log "checkpointing gpt2-xl on 2 GPUs against the disk (bench/gpu_ckpt_bench.sh)"
  SK=build-gpu/shardkit timeout 500 bench/gpu_ckpt_bench.sh "${CKPT_DIR:-/tmp/gpu-ckpt}" 2>&1 | tail -16
fi
