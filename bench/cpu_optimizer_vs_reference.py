#!/usr/bin/env python3
"""shardkit's CPU AdamW beside the CPU AdamW a PyTorch or DeepSpeed user would run, in one process tree.

The update ZeRO-Offload runs each step on the host: shardkit_cpu_optimizer_bench (with and without the
bf16 copy of the weights that shardkit writes in the same pass), torch.optim.AdamW on CPU tensors
(each implementation the installed torch has: single-tensor, foreach, fused) and, where the
`deepspeed` package imports and can build its CPU op, DeepSpeed's DeepSpeedCPUAdam (ZeRO-Offload's
optimizer; AdamW mode). One parameter of --elements fp32 values, the same thread count for all, best
and median of --rounds steps after one untimed step. Prints a table and one `RESULT {json}` line.

  python3 bench/cpu_optimizer_vs_reference.py --bench build/bench/shardkit_cpu_optimizer_bench \
      [--elements 67108864] [--threads N] [--rounds 6]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def time_steps(step, rounds):
    step()  # untimed: first touch of the states, one-time set-up
    seconds = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t0)
    return min(seconds), statistics.median(seconds)


def shardkit_rows(bench, elements, threads, rounds):
    rows = []
    for narrow in ("fp32", "bf16"):
        out = subprocess.run([bench, "--optimizer", "adamw", "--elements", str(elements), "--narrow", narrow,
                              "--rounds", str(rounds), "--json"], check=True, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(threads)}).stdout
        r = json.loads(out)
        name = "shardkit cpu_adamw" + (" + bf16 copy" if narrow == "bf16" else "")
        rows.append({"name": name, "best_ms": r["best_ms"], "median_ms": r["median_ms"]})
    return rows


def torch_rows(elements, threads, rounds):
    import torch
    torch.set_num_threads(threads)
    rows = []
    for kind, options in (("single-tensor", {"foreach": False}), ("foreach", {"foreach": True}),
                          ("fused", {"fused": True})):
        p = torch.nn.Parameter(torch.randn(elements))
        p.grad = torch.randn(elements)
        try:
            opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, **options)
            best, median = time_steps(opt.step, rounds)
        except (TypeError, RuntimeError) as e:  # an implementation this torch has not got for the CPU
            print(f"torch.optim.AdamW {kind}: not available here ({str(e).splitlines()[0][:80]})")
            continue
        rows.append({"name": f"torch {torch.__version__} AdamW {kind}", "best_ms": best * 1e3,
                     "median_ms": median * 1e3})
        del opt, p
    return rows


def deepspeed_rows(elements, threads, rounds):
    try:
        import torch
        import deepspeed
        if int(torch.__version__.split(".")[0]) < 2:
            # torch 1.x builds extensions as C++14; DeepSpeed's CPU op needs C++17 (its CUDA builders
            # ask for it, its CPU builder leaves it to torch 2's default).
            from deepspeed.ops.op_builder.cpu import builder
            cxx_args = builder.CPUOpBuilder.cxx_args
            builder.CPUOpBuilder.cxx_args = lambda self: cxx_args(self) + ["-std=c++17"]
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception as e:  # not installed, or its op does not build here
        print(f"DeepSpeedCPUAdam: not available here ({str(e).splitlines()[0][:100]})")
        return []
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(elements))
    p.grad = torch.randn(elements)
    try:
        opt = DeepSpeedCPUAdam([p], lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, adamw_mode=True)
        best, median = time_steps(opt.step, rounds)
        del opt
    except Exception as e:
        print(f"DeepSpeedCPUAdam: its op did not build or run ({str(e).splitlines()[0][:100]})")
        return []
    return [{"name": f"DeepSpeed {deepspeed.__version__} DeepSpeedCPUAdam", "best_ms": best * 1e3,
             "median_ms": median * 1e3}]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="the shardkit_cpu_optimizer_bench binary")
    ap.add_argument("--elements", type=int, default=1 << 26)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--skip-deepspeed", action="store_true")
    a = ap.parse_args()
    rows = shardkit_rows(a.bench, a.elements, a.threads, a.rounds)
    rows += torch_rows(a.elements, a.threads, a.rounds)
    if not a.skip_deepspeed:
        rows += deepspeed_rows(a.elements, a.threads, a.rounds)
    base = rows[0]["best_ms"]
    print(f"\nAdamW over {a.elements:,} fp32 elements, {a.threads} threads, best / median of {a.rounds} steps")
    print(f"| implementation | best ms | median ms | G elements/s | vs shardkit (no copy) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['best_ms']:.1f} | {r['median_ms']:.1f} | {a.elements / r['best_ms'] / 1e6:.2f} | "
              f"{r['best_ms'] / base:.2f}x |")
    print("RESULT " + json.dumps({"elements": a.elements, "threads": a.threads, "rounds": a.rounds, "rows": rows}))


if __name__ == "__main__":
    sys.exit(main())
