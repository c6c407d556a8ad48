#!/usr/bin/env python3
"""What one GPU sustains under its power limit: the ceiling a training step's MFU is measured against.

A short burst of bf16 matrix products runs at the boost clock; held for seconds, the same products draw
the board's power limit and the clock falls. For each shape (M x N x K; default 8192^3 and llama-2-7b's
MLP products at 2,048 tokens) this prints cuBLAS's TFLOP/s (torch.matmul) in a burst of 20 products
and after --seconds of products back to back, with the clock and power nvidia-smi reports then.

--during 'COMMAND' instead samples the clock, power and throttle reasons every 200 ms while COMMAND
runs (a training run, say) and prints their medians over the samples drawing more than half the
power limit: how far below the boost clock the step's kernels ran.

Usage: bench/gpu_power_ceiling.py [--shapes 8192x8192x8192,2048x11008x4096] [--seconds 8]
       bench/gpu_power_ceiling.py --during 'build-gpu/shardkit train ...'
"""
import argparse
import statistics
import subprocess
import sys
import threading
import time

QUERY = "clocks.sm,power.draw,power.limit,clocks_throttle_reasons.active"


def smi():
    out = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout.splitlines()[0]
    clock, power, limit, reasons = [f.strip() for f in out.split(",")]
    return float(clock), float(power), float(limit), reasons


def products(shapes, seconds):
    import torch
    for shape in shapes:
        m, n, k = (int(x) for x in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def timed(count):
            start.record()
            for _ in range(count):
                a @ b
            end.record()
            end.synchronize()
            return flops * count / (start.elapsed_time(end) / 1e3) / 1e12

        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        burst = timed(20)
        t0 = time.time()
        while time.time() - t0 < seconds:
            timed(50)
        clock, power, limit, _ = smi()
        sustained = timed(100)
        print(f"{m}x{n}x{k}: burst {burst:.0f} TFLOP/s, sustained {sustained:.0f} TFLOP/s "
              f"(after {seconds:g} s: {clock:.0f} MHz, {power:.0f} of {limit:.0f} W)", flush=True)


def during(command):
    samples, done = [], threading.Event()

    def sample():
        while not done.is_set():
            samples.append(smi())
            time.sleep(0.2)

    thread = threading.Thread(target=sample)
    thread.start()
    rc = subprocess.call(command, shell=True)
    done.set()
    thread.join()
    busy = [s for s in samples if s[1] > s[2] / 2]
    if not busy:
        print(f"no sample drew more than half the power limit ({len(samples)} samples)")
        return rc
    reasons = sorted({s[3] for s in busy})
    print(f"{len(busy)} of {len(samples)} samples above half the power limit: clock median "
          f"{statistics.median(s[0] for s in busy):.0f} MHz (min {min(s[0] for s in busy):.0f}), power median "
          f"{statistics.median(s[1] for s in busy):.0f} of {busy[0][2]:.0f} W, throttle reasons {', '.join(reasons)}")
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8192x8192x8192,2048x11008x4096,2048x4096x11008")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--during", help="a command to run while the clock and power are sampled")
    args = ap.parse_args()
    if args.during:
        return during(args.during)
    products(args.shapes.split(","), args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
