#!/usr/bin/env bash
# Kernel-level profile of one GPT-2 124M bf16 training step on the GPU machine (Nsight Compute,
# clocks left alone): builds, then prints the summed duration per kernel name.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=${OUT:-/tmp/gpu-profile}
mkdir -p "$out"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release > "$out/cmake.log" 2>&1 || { tail -20 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target shardkit > "$out/build.log" 2>&1 || { grep error "$out/build.log" | head; exit 1; }
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, 2_000_000).astype('<u2').tofile('$out/tokens.bin')"
cat > "$out/ds.json" <<'JSON'
{"train_batch_size": 16, "gradient_clipping": 1.0, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1},
 "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.1}}}
JSON
ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 0 --launch-count 400 \
  build-gpu/shardkit train --config "$out/ds.json" --model gpt2 --data "$out/tokens.bin" --steps 1 --device cuda \
  --quiet > "$out/ncu.csv" 2> "$out/ncu.err"
python3 - "$out/ncu.csv" <<'PY'
import csv, sys, collections, re
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, body = rows[0], rows[1:]
k, u, v = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
total = collections.Counter(); count = collections.Counter()
for r in body:
    name = re.sub(r"<.*", "", r[k]).split("(")[0]
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}.get(r[u], 1.0)
    total[name] += float(r[v].replace(",", "")) * scale; count[name] += 1
all_ms = sum(total.values())
print(f"{'kernel':60} {'calls':>6} {'ms':>9} {'%':>6}")
for name, ms in total.most_common(25):
    print(f"{name[:60]:60} {count[name]:6d} {ms:9.2f} {100*ms/all_ms:6.1f}")
print(f"total {all_ms:.1f} ms over {sum(count.values())} kernels")
PY
