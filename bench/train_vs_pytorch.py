#!/usr/bin/python3
"""Training speed of `shardkit train` on one CPU rank against PyTorch (Debian's python3-torch, CPU)
training the same GPT-2 with the same batch, optimizer and thread count, measured in one run.

Cases: gpt2-tiny at batch 12 x sequence 64; a 6-layer, 384-wide, 6-head model with a 256-token
vocabulary at batch 4 x sequence 256, and the same model at 2 x 1,024 (where the attention is most of
the work; PyTorch's side forms the whole T x T score matrix). Both sides run fp32 AdamW (weight decay on the matrices
and embeddings only: two parameter groups on PyTorch's side) with gradient clipping; the
figure is the median tokens/s over the timed steps (after warm-up steps). Prints one JSON line per case
and a table.

Usage: bench/train_vs_pytorch.py [--shardkit build/shardkit] [--threads 2] [--steps 30]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "trainer"))
from torch_decay import adamw_groups  # noqa: E402
from torch_gpt2 import gpt2_loss, shapes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--shardkit", default=os.path.join(os.path.dirname(__file__), "..", "build", "shardkit"))
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--warmup", type=int, default=5)
args = ap.parse_args()

CASES = [
    ("gpt2-tiny", {"n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 256, "n_positions": 64}, 12),
    ("6L-384", {"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab_size": 256, "n_positions": 256}, 4),
    ("6L-384", {"n_layer": 6, "n_head": 6, "n_embd": 384, "vocab_size": 256, "n_positions": 1024}, 2),
]


def shardkit_tokens_per_s(tmp, model, cfg, batch, data):
    model_file = os.path.join(tmp, f"{model}-{cfg['n_positions']}.json")
    with open(model_file, "w") as f:
        json.dump(cfg, f)
    config = os.path.join(tmp, "ds.json")
    with open(config, "w") as f:
        json.dump({"train_batch_size": batch, "gradient_clipping": 1.0,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}, f)
    metrics = os.path.join(tmp, f"{model}-{cfg['n_positions']}.jsonl")
    subprocess.run([args.shardkit, "train", "--config", config, "--model", model_file, "--data", data,
                    "--steps", str(args.warmup + args.steps), "--metrics", metrics, "--threads", str(args.threads),
                    "--quiet"], check=True, env=dict(os.environ, OMP_PROC_BIND="false"))
    steps = [json.loads(l) for l in open(metrics)][args.warmup:]
    return statistics.median(s["tokens_per_s"] for s in steps)


def pytorch_tokens_per_s(cfg, batch, tokens):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    params = {n: (torch.randn(s) * 0.02).requires_grad_() for n, s in shapes(cfg).items()}
    opt = torch.optim.AdamW(adamw_groups(params.values(), 0.01), lr=1e-3)  # decay and no_decay, as shardkit
    T = cfg["n_positions"]
    windows = (len(tokens) - 1) // T
    rng = np.random.default_rng(0)
    rates = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        idx = rng.integers(0, windows, batch)
        x = torch.tensor(np.stack([tokens[i * T:(i + 1) * T] for i in idx]).astype(np.int64))
        y = torch.tensor(np.stack([tokens[i * T + 1:(i + 1) * T + 1] for i in idx]).astype(np.int64))
        opt.zero_grad()
        gpt2_loss(params, x, y, cfg).backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        if step >= args.warmup:
            rates.append(batch * T / (time.perf_counter() - start))
    return statistics.median(rates)


# Debian's torch calls the system BLAS (libblas.so.3); name what it resolves to, so that a slow
# reference BLAS (which makes PyTorch ~10x slower) would be visible in the results.
BLAS = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
rows = []
with tempfile.TemporaryDirectory() as tmp:
    tokens = np.random.default_rng(1).integers(0, 256, 400_000).astype("<u2")
    data = os.path.join(tmp, "tokens.bin")
    tokens.tofile(data)
    for model, cfg, batch in CASES:
        ours = shardkit_tokens_per_s(tmp, model, cfg, batch, data)
        theirs = pytorch_tokens_per_s(cfg, batch, tokens)
        result = {"model": model, "batch": batch, "seq_len": cfg["n_positions"], "threads": args.threads,
                  "shardkit_tokens_per_s": round(ours, 1), "pytorch_tokens_per_s": round(theirs, 1),
                  "speedup": round(ours / theirs, 3), "torch": torch.__version__, "torch_blas": BLAS}
        print(json.dumps(result), flush=True)
        rows.append(result)

print(f"\n{'model':10} {'batch x seq':>12} {'shardkit tok/s':>15} {'PyTorch tok/s':>14} {'ratio':>6}")
for r in rows:
    print(f"{r['model']:10} {str(r['batch']) + ' x ' + str(r['seq_len']):>12} {r['shardkit_tokens_per_s']:15.0f} "
          f"{r['pytorch_tokens_per_s']:14.0f} {r['speedup']:6.2f}")
