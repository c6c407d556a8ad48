#!/usr/bin/env python3
"""Causal attention, forward and backward TFLOP/s: shardkit's kernels beside each of PyTorch's SDPA
backends (FlashAttention-2, cuDNN, memory-efficient), in one process, on the same tensors and stream.
The backends run twice: as PyTorch runs them by default, and under torch.use_deterministic_algorithms
(the `-det` cells), where flash and memory-efficient take their deterministic backward passes and
cuDNN's backward, which adds into dQ in no fixed order, is refused. shardkit's backward pass is
deterministic, so the `-det` cells are its like-for-like references.

shardkit's kernels come from libshardkit_attention_abi.so (bench/attention_abi.cpp, built with the CUDA
backend), loaded with ctypes: the mma.sync kernels of every GPU ("mma") and the sm_90 kernels ("sm90",
which training runs where it can). For each sequence length and head size: B = --tokens / S sequences
of --hidden / HS heads (llama-2-7b's 4096 by default), bf16; times are CUDA-event medians of 15 runs
after 2 warm-ups; the backward pass is timed alone (SDPA's through autograd.grad on a kept graph).
FLOPs as FlashAttention counts them: forward 4 B NH S^2 HS / 2 (causal), backward 2.5 times that. Every
row also says how far shardkit's outputs and gradients are from SDPA's (the first backend that runs),
so a fast wrong kernel cannot pass unnoticed.

--before LIB adds another build's kernels (another tree's library, e.g. main's beside a branch's) to the
same process: their cells are named `<kernel>@before`, each row ends with this build's speed over that
one's, and the shardkit kernels are timed --rounds times (3 by default with --before), the two builds
alternating, each reporting the median of its rounds. Two builds timed in separate processes, let
alone on separate machines, differ by up to 10 % at the same code; alternating in one process they
do not drift apart.

Usage: bench/attention_tflops.py [--lib build/bench/libshardkit_attention_abi.so] [--before LIB]
       [--rounds N] [--tokens 16384] [--seqs 2048,4096,8192] [--head-sizes 64,128] [--hidden 4096]
       [--kv-heads-ratio 1]
Prints a table and, last, one JSON line.
"""
import argparse
import ctypes
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from torch_timing import time_ms  # bench/torch_timing.py, beside this script

ap = argparse.ArgumentParser()
ap.add_argument("--lib", default="build/bench/libshardkit_attention_abi.so")
ap.add_argument("--tokens", type=int, default=16384)
ap.add_argument("--seqs", default="2048,4096,8192")
ap.add_argument("--head-sizes", default="64,128")
ap.add_argument("--hidden", type=int, default=4096)
ap.add_argument("--kv-heads-ratio", type=int, default=1, help="query heads per kv head (grouped-query attention)")
ap.add_argument("--before", help="another build's library, timed in the same process, alternating with --lib's")
ap.add_argument("--rounds", type=int, help="timings of each shardkit kernel, medians reported (1; 3 with --before)")
args = ap.parse_args()
rounds = args.rounds or (3 if args.before else 1)
if rounds < 1:
    ap.error("--rounds must be at least 1")

P, I, I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64


def load(path):
    lib = ctypes.CDLL(path)
    lib.shardkit_attention_forward.argtypes = [I, I, P, P, P, P, P, I, I, I, I, I, I64, I64, P]
    lib.shardkit_attention_backward.argtypes = [I, I, P, P, P, P, P, P, P, P, P, P, I, I, I, I, I, I64, I64, P]
    lib.shardkit_attention_error.restype = ctypes.c_char_p
    # Libraries built before the scratch query took one float a query row (delta).
    if hasattr(lib, "shardkit_attention_scratch_floats"):
        lib.shardkit_attention_scratch_floats.argtypes = [I, I, I, I, I, I]
        lib.shardkit_attention_scratch_floats.restype = I64
    return lib


dev, dt = "cuda", torch.bfloat16
# Deterministic mode would also fill every new tensor (the gradients, the backends' workspaces) with NaN
# inside the timed passes: a cost of the mode's debugging aid, not of the backends' algorithms.
torch.utils.deterministic.fill_uninitialized_memory = False
# (name, backend, deterministic): each backend as PyTorch runs it by default, then in its deterministic mode.
BACKENDS = tuple((name + ("-det" if det else ""), backend, det) for det in (False, True)
                 for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                                       ("efficient", SDPBackend.EFFICIENT_ATTENTION)))
# shardkit's kernels through the library's `kernel` argument: the mma.sync kernels, and the sm_90 kernels
# (model/cuda/hopper_attention.hpp; refused on other devices and head sizes); with --before, each also
# from the other build.
LIBS = (("", load(args.lib)),) + ((("@before", load(args.before)),) if args.before else ())
KERNELS = tuple((name + suffix, lib, kernel) for suffix, lib in LIBS for name, kernel in (("mma", 0), ("sm90", 1)))


def check(lib, status):
    if status != 0:
        raise RuntimeError(lib.shardkit_attention_error().decode())


def scratch_floats(lib, kernel, B, S, NH, NKV, HS):
    if hasattr(lib, "shardkit_attention_scratch_floats"):
        return lib.shardkit_attention_scratch_floats(kernel, B, S, NH, NKV, HS)
    return B * NH * S



def relative(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def measure(S, HS):
    B, NH = args.tokens // S, args.hidden // HS
    NKV = NH // args.kv_heads_ratio
    torch.manual_seed(0)
    # Rows of tokens, heads side by side: shardkit's layout; SDPA reads them as (B, NH, S, HS) views.
    q = torch.randn(B, S, NH, HS, device=dev, dtype=dt)
    k = torch.randn(B, S, NKV, HS, device=dev, dtype=dt)
    v = torch.randn(B, S, NKV, HS, device=dev, dtype=dt)
    dout = torch.randn(B, S, NH, HS, device=dev, dtype=dt)
    fwd_flops = 4 * B * NH * S * S * HS / 2
    bwd_flops = 2.5 * fwd_flops
    row = {"seq": S, "head_size": HS, "batch": B, "heads": NH, "kv_heads": NKV}

    results = {}
    for name, backend, deterministic in BACKENDS:
        qs, ks, vs = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
        go = dout.transpose(1, 2)
        torch.use_deterministic_algorithms(deterministic)
        try:
            with sdpa_kernel([backend]):
                def forward():
                    return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=NKV != NH)
                fwd = time_ms(forward)
                out = forward()
                bwd = time_ms(lambda: torch.autograd.grad(out, (qs, ks, vs), go, retain_graph=True))
                grads = torch.autograd.grad(out, (qs, ks, vs), go)
        except RuntimeError as e:  # the backend does not take this shape, is not built, or is not deterministic
            row[name] = {"error": str(e).splitlines()[0][:120]}
            continue
        finally:
            torch.use_deterministic_algorithms(False)
        row[name] = {"forward_tflops": fwd_flops / fwd / 1e9, "backward_tflops": bwd_flops / bwd / 1e9,
                     "forward_ms": fwd, "backward_ms": bwd}
        results.setdefault("reference", (name, out.transpose(1, 2), [g.transpose(1, 2) for g in grads]))

    out = torch.empty(B, S, NH, HS, device=dev, dtype=dt)
    lse = torch.empty(B, NH, S, device=dev, dtype=torch.float32)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    stream = torch.cuda.current_stream().cuda_stream
    shape = (B, S, NH, NKV, HS, NH * HS, NKV * HS, stream)
    passes = {}  # name: (forward, backward) of the kernels that run this shape
    for name, lib, kernel in KERNELS:
        scratch = torch.empty(scratch_floats(lib, kernel, B, S, NH, NKV, HS), device=dev, dtype=torch.float32)

        def forward(lib=lib, kernel=kernel):
            check(lib, lib.shardkit_attention_forward(kernel, 0, out.data_ptr(), lse.data_ptr(), q.data_ptr(),
                                                      k.data_ptr(), v.data_ptr(), *shape))

        def backward(lib=lib, kernel=kernel, scratch=scratch):
            check(lib, lib.shardkit_attention_backward(kernel, 0, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                                       scratch.data_ptr(), dout.data_ptr(), out.data_ptr(),
                                                       q.data_ptr(), k.data_ptr(), v.data_ptr(), lse.data_ptr(),
                                                       *shape))
        try:
            forward()
            backward()
        except RuntimeError as e:  # the sm_90 kernels on another device or head size
            row[name] = {"error": str(e).splitlines()[0][:120]}
            continue
        row[name] = {}
        if "reference" in results:  # the outputs of this kernel's run, before the next overwrites them
            ref, ref_out, ref_grads = results["reference"]
            row[name]["against"] = ref
            row[name]["out_relative_error"] = relative(out, ref_out)
            for g, r, n in zip((dq, dk, dv), ref_grads, ("dq", "dk", "dv")):
                row[name][f"{n}_relative_error"] = relative(g, r)
        passes[name] = (forward, backward)
    times = {name: ([], []) for name in passes}
    for _ in range(rounds):  # the builds alternate, so that clock and heat drift fall on both
        for name, (forward, backward) in passes.items():
            times[name][0].append(time_ms(forward))
            forward()  # the backward reads this kernel's out and lse
            times[name][1].append(time_ms(backward))
    for name, (fwds, bwds) in times.items():
        fwd, bwd = statistics.median(fwds), statistics.median(bwds)
        row[name].update(forward_tflops=fwd_flops / fwd / 1e9, backward_tflops=bwd_flops / bwd / 1e9,
                         forward_ms=fwd, backward_ms=bwd)
    return row


rows = []
for S in (int(s) for s in args.seqs.split(",")):
    for HS in (int(h) for h in args.head_sizes.split(",")):
        rows.append(measure(S, HS))
        r = rows[-1]
        cells = []
        for name in tuple(n for n, _, _ in KERNELS) + tuple(n for n, _, _ in BACKENDS):
            x = r[name]
            cells.append(f"{name} " + ("n/a" if "error" in x else f"{x['forward_tflops']:5.0f}/{x['backward_tflops']:5.0f}"))
        errors = [f"{n} out/dq err {r[n]['out_relative_error']:.1e}/{r[n]['dq_relative_error']:.1e}"
                  for n, _, _ in KERNELS if "out_relative_error" in r[n]]
        ratios = []
        for n, _, _ in KERNELS:
            b = r.get(n + "@before", {})
            if "@" not in n and "forward_tflops" in r[n] and "forward_tflops" in b:
                ratios.append(f"{n}/before {r[n]['forward_tflops'] / b['forward_tflops']:.3f}/"
                              f"{r[n]['backward_tflops'] / b['backward_tflops']:.3f}")
        print(f"S {r['seq']:5d} HS {r['head_size']:3d} B {r['batch']:2d} NH {r['heads']:2d} | fwd/bwd TFLOP/s: " +
              " | ".join(cells + ratios + errors))
print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": args.tokens,
                  "lib": args.lib, "before": args.before, "rounds": rounds, "rows": rows}))
