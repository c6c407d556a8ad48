#!/usr/bin/env python3
"""PyTorch's side of shardkit_gpu_kernels_bench's attention and elementwise rows, at the same shapes.

Times, with CUDA events (median of 15 after 2 warm-ups), torch.nn.functional.scaled_dot_product_attention
(causal, grouped-query heads, bf16) forward and forward+backward, and torch.compile'd RMSNorm, RoPE and
SwiGLU forward and backward, for a Llama preset's shapes. A reference for the benchmark only.

Usage: bench/attention_vs_sdpa.py [--model tinyllama-1.1b] [--batch 4] [--seq 2048]
"""
import argparse
import json

import torch
import torch.nn.functional as F

from torch_timing import time_ms  # bench/torch_timing.py, beside this script

SHAPES = {"tinyllama-1.1b": (2048, 5632, 32, 4), "llama-3.2-1b": (2048, 8192, 32, 8), "smollm-135m": (576, 1536, 9, 3),
          "llama-2-7b": (4096, 11008, 32, 32)}
ap = argparse.ArgumentParser()
ap.add_argument("--model", default="tinyllama-1.1b", choices=sorted(SHAPES))
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=2048)
args = ap.parse_args()
H, I, NH, NKV = SHAPES[args.model]
D, B, S = H // NH, args.batch, args.seq
dev, dt = "cuda", torch.bfloat16



rows = {}
q = torch.randn(B, NH, S, D, device=dev, dtype=dt, requires_grad=True)
k = torch.randn(B, NKV, S, D, device=dev, dtype=dt, requires_grad=True)
v = torch.randn(B, NKV, S, D, device=dev, dtype=dt, requires_grad=True)
dout = torch.randn(B, NH, S, D, device=dev, dtype=dt)
rows["sdpa forward"] = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
fwd_bwd = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(dout))
rows["sdpa backward (forward+backward - forward)"] = fwd_bwd - rows["sdpa forward"]


def rmsnorm(x, w):
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5))).to(x.dtype)


def swiglu(g, u):
    return F.silu(g) * u


def rope(x, cos, sin):
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


N = B * S
x = torch.randn(N, H, device=dev, dtype=dt, requires_grad=True)
w = torch.ones(H, device=dev, dtype=dt, requires_grad=True)
g = torch.randn(N, I, device=dev, dtype=dt, requires_grad=True)
u = torch.randn(N, I, device=dev, dtype=dt, requires_grad=True)
qr = torch.randn(B, S, NH, D, device=dev, dtype=dt, requires_grad=True)
ang = torch.randn(S, 1, D, device=dev)
cos, sin = ang.cos(), ang.sin()
for name, fn, inputs, out_shape in (("rmsnorm", rmsnorm, (x, w), (N, H)), ("swiglu", swiglu, (g, u), (N, I)),
                                    ("rope q", rope, (qr, cos, sin), (B, S, NH, D))):
    c = torch.compile(fn)
    grad = torch.randn(*out_shape, device=dev, dtype=dt)
    rows[f"compiled {name} forward"] = f = time_ms(lambda: c(*inputs))
    rows[f"compiled {name} backward (forward+backward - forward)"] = time_ms(lambda: c(*inputs).backward(grad)) - f
for name, ms in rows.items():
    print(f"{name:52s} {ms:9.4f} ms")
print(json.dumps({"model": args.model, "batch": B, "seq": S, "ms": rows}))
