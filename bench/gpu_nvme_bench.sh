#!/usr/bin/env bash
# ZeRO-Infinity on one GPU, in one call:
#  1. the disk: O_DIRECT writes and reads (dd, 64 MiB blocks) of a file of the swap's size in DIR, one
#     after the other, then both at once as a step's swap does them: 4 readers and 4 writers of a
#     quarter each, 8 requests in flight like the swap's queue_depth (one dd keeps one); and fio's
#     sequential 1 MiB reads and writes at queue depth 8 where fio is installed;
#  2. gpt2-xl (1.56 B parameters; 18.7 GB of fp32 master weights and AdamW moments) at ZeRO stage 1,
#     bf16, micro-batch MB (8) x 1024, with the optimizer states on the GPU, in host memory
#     (offload_optimizer cpu) and in a swap file in DIR (offload_optimizer nvme, aio block_size
#     BLOCK, default 8 MiB, queue_depth 8): tokens/s, the step time (median after the first), the
#     process's peak resident host memory, and for NVMe the swap traffic of a step (every state read
#     and written once) against the disk's bandwidth;
#     (STAGE1=0 skips this part);
#  3. gpt2-xl at ZeRO stage 3 with the optimizer states on NVMe and stage 3's parameters in host
#     memory (offload_param cpu) and in a swap file of their own (offload_param nvme): the same
#     figures, and the parameters' swap traffic of a step (bf16, read for the forward and the
#     backward pass, written once: 6 bytes per parameter) (PARAMS=0 skips it; PARAM_STEPS steps, 4);
#  4. BIG=1: a GPT-2-shaped model of N_LAYER (20) blocks of width 4096 (4.24 B parameters, 51 GB of
#     states: what the 64 GB disk of the one-GPU machine holds) with its states on NVMe; with
#     HOST_LIMIT (a size, e.g. 128GiB) first what the memory plan says of the same model with its
#     states in host memory (offload_optimizer cpu) on a machine of that much host memory
#     (SHARDKIT_HOST_MEMORY): its host figure, and its refusal where it does not fit.
# Usage: bench/gpu_nvme_bench.sh [DIR] (SK=path/to/shardkit)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sk=${SK:-build-gpu/shardkit}
mkdir -p "${1:-/tmp}"  # DIR: where to work; the run makes a folder of its own in it and removes only that
dir=$(mktemp -d "${1:-/tmp}/shardkit-gpu-nvme-XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT  # also when a timeout ends the run: its swap files are tens of GB
mb=${MB:-8}
block=${BLOCK:-8388608}
mkdir -p "$dir/swap"
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, 4_000_000).astype('<u2').tofile('$dir/tokens.bin')"
states() {  # states <n_layer> <n_embd>: bytes of fp32 master weights and moments of a GPT-2 shape
  python3 -c "L, C, V, P = $1, $2, 50257, 1024; print(12 * (V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C))"
}
xl_bytes=$(states 48 1600)

echo "== the disk under $dir ($(df -h --output=source,fstype,size,avail "$dir" | tail -1))"
count=$((xl_bytes / (64 << 20)))
start=$(date +%s.%N)
dd if=/dev/zero of="$dir/dd.bin" bs=64M count="$count" oflag=direct conv=fsync status=none
dd_write=$(python3 -c "print($count * 64 * 2**20 / ($(date +%s.%N) - $start) / 1e9)")
start=$(date +%s.%N)
dd if="$dir/dd.bin" of=/dev/null bs=64M iflag=direct status=none
dd_read=$(python3 -c "print($count * 64 * 2**20 / ($(date +%s.%N) - $start) / 1e9)")
part=$((count / 4))
start=$(date +%s.%N)
for i in 0 1 2 3; do
  dd if=/dev/zero of="$dir/dd-both.bin" bs=64M count="$part" seek=$((i * part)) oflag=direct conv=notrunc,fsync \
    status=none &
  dd if="$dir/dd.bin" of=/dev/null bs=64M count="$part" skip=$((i * part)) iflag=direct status=none &
done
wait
dd_both=$(python3 -c "print(8 * $part * 64 * 2**20 / ($(date +%s.%N) - $start) / 1e9)")
rm -f "$dir/dd.bin" "$dir/dd-both.bin"
printf 'dd O_DIRECT: write %.2f GB/s, read %.2f GB/s, 4 readers and 4 writers at once %.2f GB/s together (%.1f GB)\n' \
  "$dd_write" "$dd_read" "$dd_both" "$(python3 -c "print($count * 64 * 2**20 / 1e9)")"
if command -v fio > /dev/null; then
  for rw in write read; do
    fio --name="$rw" --filename="$dir/fio.bin" --rw="$rw" --bs=1M --iodepth=8 --ioengine=io_uring --direct=1 \
      --size=8G --output-format=terse --terse-version=3 2> /dev/null |
      awk -F';' -v rw="$rw" '{ printf "fio %s (1 MiB, depth 8, io_uring): %.2f GB/s\n", rw, (rw == "read" ? $7 : $48) * 1024 / 1e9 }'
  done
  rm -f "$dir/fio.bin"
else
  echo "fio: not installed"
fi

config() {  # config <file> <stage> <offload block or empty>
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": $mb, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true}, "zero_optimization": {"stage": $2 $3},
 "aio": {"block_size": $block, "queue_depth": 8},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}
JSON
}
# run <name> <model> <steps> <stage> <offload block>: trains, then prints one row.
run() {
  config "$dir/$1.json" "$4" "$5"
  python3 - "$sk" "$dir" "$1" "$2" "$3" <<'PY'
import json, resource, statistics, subprocess, sys
sk, d, name, model, steps = sys.argv[1:6]
with open(f"{d}/{name}.txt", "w") as out:
    rc = subprocess.run([sk, "train", "--config", f"{d}/{name}.json", "--model", model, "--data", f"{d}/tokens.bin",
                         "--steps", steps, "--device", "cuda", "--metrics", f"{d}/{name}.jsonl"],
                        stdout=out, stderr=subprocess.STDOUT, timeout=900).returncode
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
rows = [json.loads(l) for l in open(f"{d}/{name}.jsonl") if '"step_ms"' in l] if rc == 0 else []
if not rows:
    print(f"{name}: failed (exit {rc}); its log: {d}/{name}.txt")
    print(open(f"{d}/{name}.txt").read()[-3000:])
    sys.exit(0)
later = rows[1:] or rows
step = statistics.median(r["step_ms"] for r in later) / 1e3
tps = statistics.median(r["tokens_per_s"] for r in later)
json.dump({"name": name, "step_s": step, "tokens_per_s": tps, "peak_rss": peak}, open(f"{d}/{name}.row", "w"))
print(f"{name:18} {tps:10.0f} tok/s  step {step:7.3f} s  peak host RSS {peak / 1e9:6.1f} GB")
PY
  grep -E "memory plan|swapped to|note:" "$dir/$1.txt" | head -4 | sed 's/^/    /'
}
swap='"offload_optimizer": {"device": "nvme", "nvme_path": "'$dir/swap'"}'
param_swap='"offload_param": {"device": "nvme", "nvme_path": "'$dir/swap'"}'
# swap_traffic <row> <bytes read> <bytes written> [what]: a step's swap traffic against the disk.
swap_traffic() {
  python3 - "$dir/$1.row" "$2" "$3" "$dd_read" "$dd_write" "$dd_both" "${4:-swap}" <<'PY'
import json, sys
row, rd, wr = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
r, w, both, what = float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
serial = rd / (r * 1e9) + wr / (w * 1e9)
together = (rd + wr) / (both * 1e9)
print(f"    {what} traffic per step: {(rd + wr) / 1e9:.1f} GB in {row['step_s']:.2f} s = {(rd + wr) / row['step_s'] / 1e9:.2f} GB/s; "
      f"dd moves it in {serial:.2f} s one way after the other, {together:.2f} s both at once (8 in flight): "
      f"step / dd both at once = {row['step_s'] / together:.2f}")
PY
}
if [ "${STAGE1:-1}" != 0 ]; then
  echo "== gpt2-xl, stage 1, bf16, micro-batch $mb x 1024, one GPU"
  run gpu gpt2-xl 12 1 ""
  run cpu-offload gpt2-xl 6 1 ', "offload_optimizer": {"device": "cpu", "pin_memory": true}'
  run nvme-offload gpt2-xl 4 1 ", $swap"
  [ -f "$dir/nvme-offload.row" ] && swap_traffic nvme-offload "$xl_bytes" "$xl_bytes"
fi
if [ "${PARAMS:-1}" != 0 ]; then
  echo "== gpt2-xl, stage 3, bf16, micro-batch $mb x 1024, optimizer states on NVMe; parameters in host memory, on NVMe"
  run params-cpu gpt2-xl "${PARAM_STEPS:-4}" 3 ", $swap, \"offload_param\": {\"device\": \"cpu\"}"
  run params-nvme gpt2-xl "${PARAM_STEPS:-4}" 3 ", $swap, $param_swap"
  params=$((xl_bytes / 12))
  [ -f "$dir/params-nvme.row" ] && swap_traffic params-nvme "$((xl_bytes + 4 * params))" "$((xl_bytes + 2 * params))" \
    "states' and parameters' swap"
fi

if [ "${BIG:-0}" != 0 ]; then
  layers=${N_LAYER:-20}
  big_bytes=$(states "$layers" 4096)
  echo "{\"n_layer\": $layers, \"n_head\": 32, \"n_embd\": 4096, \"vocab_size\": 50257, \"n_positions\": 1024}" > "$dir/big-model.json"
  echo "== GPT-2 shape, $layers x 4096 ($(python3 -c "print(f'{$big_bytes / 12 / 1e9:.2f}')") B parameters, $(python3 -c "print(f'{$big_bytes / 1e9:.1f}')") GB of states), stage 1, NVMe"
  mb=${BIG_MB:-4}
  if [ -n "${HOST_LIMIT:-}" ]; then
    echo "-- the same with offload_optimizer cpu, planned for $HOST_LIMIT of host memory:"
    config "$dir/big-cpu.json" 1 ', "offload_optimizer": {"device": "cpu", "pin_memory": true}'
    if SHARDKIT_HOST_MEMORY=$HOST_LIMIT timeout 600 "$sk" train --config "$dir/big-cpu.json" --model "$dir/big-model.json" \
      --data "$dir/tokens.bin" --steps 1 --device cuda > "$dir/big-cpu.txt" 2>&1; then
      echo "    trained: it fits $HOST_LIMIT"
    fi
    grep -m2 -E "memory plan|error" "$dir/big-cpu.txt" | sed 's/^/    /'
  fi
  run big-nvme "$dir/big-model.json" 3 1 ", $swap"
  [ -f "$dir/big-nvme.row" ] && swap_traffic big-nvme "$big_bytes" "$big_bytes"
fi
