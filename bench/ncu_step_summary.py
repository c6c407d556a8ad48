#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel times of one training step by kernel, beside the step's own time.

Reads what `ncu --csv --metrics gpu__time_duration.sum` printed (other lines, the run's own and ncu's
"==PROF==" ones, are skipped until the CSV header) for the kernels of the step bench/gpu_step_profile.sh
marks with `shardkit train --profile-step`. Nsight Compute runs the kernels one at a time, so the sum is
the step's kernel time with nothing overlapped; memsets and copies are not profiled. Given the median
step time of the same run without the profiler (--step-ms), says how much of the step the kernels do
not explain.

Usage: bench/ncu_step_summary.py NCU_OUTPUT [--step-ms MS] [--top 40]
Prints a table and, last, one JSON line.
"""
import argparse
import collections
import csv
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("ncu_output")
ap.add_argument("--step-ms", type=float, help="median step time of the same run without the profiler")
ap.add_argument("--top", type=int, default=40, help="kernels listed (the rest summed in one row)")
args = ap.parse_args()

TO_MS = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3,
         "second": 1e3}

with open(args.ncu_output, newline="") as f:
    lines = f.read().splitlines()
start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
if start is None:
    sys.exit(f"{args.ncu_output}: no CSV header (a line starting with \"ID\",) in Nsight Compute's output")
reader = csv.DictReader(line for line in lines[start:] if not line.startswith("=="))
missing = {"Kernel Name", "Metric Name", "Metric Unit", "Metric Value"} - set(reader.fieldnames or ())
if missing:
    sys.exit(f"{args.ncu_output}: the CSV has no column {', '.join(sorted(missing))}")

calls, total = collections.Counter(), collections.Counter()
for row in reader:
    if row["Metric Name"] != "gpu__time_duration.sum":
        continue
    unit = row["Metric Unit"].strip()
    if unit not in TO_MS:
        sys.exit(f"{args.ncu_output}: gpu__time_duration.sum in unit {unit!r}, expected one of {sorted(TO_MS)}")
    name = row["Kernel Name"]
    calls[name] += 1
    total[name] += float(row["Metric Value"].replace(",", "")) * TO_MS[unit]
if not calls:
    sys.exit(f"{args.ncu_output}: no kernel with gpu__time_duration.sum (was the step inside the profiled range?)")

kernel_ms = sum(total.values())
ranked = total.most_common()
print(f"{'kernel':60s} {'calls':>6s} {'ms':>9s} {'us/call':>9s} {'%':>6s}")
for name, ms in ranked[:args.top]:
    print(f"{name[:60]:60s} {calls[name]:6d} {ms:9.3f} {1e3 * ms / calls[name]:9.1f} {100 * ms / kernel_ms:6.1f}")
rest = ranked[args.top:]
if rest:
    rest_ms = sum(ms for _, ms in rest)
    print(f"{f'({len(rest)} more kernels)':60s} {sum(calls[n] for n, _ in rest):6d} {rest_ms:9.3f} {'':9s} "
          f"{100 * rest_ms / kernel_ms:6.1f}")
print(f"kernels of the step, one at a time: {kernel_ms:.2f} ms in {sum(calls.values())} launches")
summary = {"kernel_ms": kernel_ms, "launches": sum(calls.values()),
           "kernels": [{"name": n, "calls": calls[n], "ms": ms} for n, ms in ranked]}
if args.step_ms:
    print(f"the step without the profiler: {args.step_ms:.2f} ms; not in the kernels' time: "
          f"{args.step_ms - kernel_ms:.2f} ms ({100 * (args.step_ms - kernel_ms) / args.step_ms:.1f} %: memsets, "
          "copies, launch gaps, host waits; less any overlap the profiler removed)")
    summary["step_ms"] = args.step_ms
print(json.dumps(summary))
