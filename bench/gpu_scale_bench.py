#!/usr/bin/env python3
"""A multi-billion-parameter model on one GPU, in one call: for each ZeRO setting asked for, the time
from launch to the line of the first step (its end), the step time and
tokens/s (median after the first step), the model FLOP utilisation against the GPU's dense bf16 peak,
the peak GPU memory (nvidia-smi, polled; shardkit's own plan and measure beside it) and the process's
peak resident host memory; and what the run printed before its first step, with the time of each line.

The model is GPT-2's architecture at the given shape (default 32 x 4096: 6.65 B parameters) or, with
--family llama, Llama's (default llama-2-7b's: 32 x 4096, MLP 11008, 32000 ids, untied head), bf16.
Settings: s1 (stage 1), s2 (stage 2), s2-cpu (stage 2, offload_optimizer cpu), s3-cpu (stage 3,
offload_optimizer and offload_param cpu), s1-nvme (stage 1, offload_optimizer nvme in --swap-dir),
s1-ac (stage 1 with --activation-checkpointing), s1-ac-cpu (stage 1, the config's activation_checkpointing
section with cpu_checkpointing: the block inputs in host memory). A run the memory plan refuses is
reported with its refusal line. MFU counts the model's FLOPs (6 per parameter and token, plus
attention's); with activation checkpointing the GPU also reruns every block's forward pass, which
HFU (hardware FLOP utilisation) adds. Llama's model file gets positions for --seq where it exceeds
Llama 2's 4,096.

Usage: bench/gpu_scale_bench.py --shardkit build-gpu/shardkit [--family gpt2|llama] [--cases s1,s2-cpu]
       [--layers 32] [--width 4096] [--seq 1024] [--micro-batch 2] [--accumulation 1] [--steps 4]
       [--dir /tmp/gpu-scale]
"""
import argparse
import json
import os
import re
import random
import statistics
import struct
import subprocess
import sys
import threading
import time

# H200 SXM dense bf16 (no sparsity), NVIDIA's data sheet.
PEAK_BF16 = 989.4e12
GPT2_VOCAB = 50257
LLAMA_VOCAB, LLAMA_MLP = 32000, 11008


def vocab_of(args):
    return LLAMA_VOCAB if args.family == "llama" else GPT2_VOCAB


def params_of(args):
    L, H = args.layers, args.width
    if args.family == "llama":
        return 2 * LLAMA_VOCAB * H + L * (4 * H * H + 3 * H * LLAMA_MLP + 2 * H) + H
    return GPT2_VOCAB * H + args.seq * H + L * (12 * H * H + 13 * H) + 2 * H


def block_forward_flops_per_token(args):
    # The blocks' forward pass alone (what activation checkpointing runs a second time): 2 per block
    # parameter and token, plus attention's forward products, 4 * layers * width * sequence.
    L, H = args.layers, args.width
    per_block = 4 * H * H + 3 * H * LLAMA_MLP if args.family == "llama" else 12 * H * H
    return 2 * L * per_block + 4 * L * H * args.seq


def flops_per_token(args):
    # 6 per parameter and token that takes part in a matrix product (forward and backward; not the
    # input embedding's lookup, nor GPT-2's position table: the tied GPT-2 embedding is the head),
    # plus attention's two products (QK^T and AV), forward and backward: 12 * layers * width * sequence.
    lookup = LLAMA_VOCAB * args.width if args.family == "llama" else args.seq * args.width
    return 6 * (params_of(args) - lookup) + 12 * args.layers * args.width * args.seq


def model_file(args):
    if args.family == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": args.width,
                "intermediate_size": LLAMA_MLP, "num_hidden_layers": args.layers,
                "num_attention_heads": args.width // 128, "num_key_value_heads": args.width // 128,
                "vocab_size": LLAMA_VOCAB, "max_position_embeddings": max(4096, args.seq), "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
    return {"n_layer": args.layers, "n_head": args.width // 128, "n_embd": args.width, "vocab_size": GPT2_VOCAB,
            "n_positions": args.seq}


def config(case, args, swap_dir):
    stage = {"s1": 1, "s2": 2, "s2-cpu": 2, "s3-cpu": 3, "s1-nvme": 1, "s1-ac": 1, "s1-ac-cpu": 1}[case]
    zero = {"stage": stage}
    if case in ("s2-cpu", "s3-cpu"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if case == "s3-cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if case == "s1-nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": swap_dir}
    out = {"train_micro_batch_size_per_gpu": args.micro_batch, "gradient_accumulation_steps": args.accumulation,
           "gradient_clipping": 1.0, "steps_per_print": 1, "bf16": {"enabled": True}, "zero_optimization": zero,
           "aio": {"block_size": 8 << 20, "queue_depth": 8},
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}
    if case == "s1-ac-cpu":
        out["activation_checkpointing"] = {"cpu_checkpointing": True}
    return out


class GpuPeak(threading.Thread):
    """The largest memory.used nvidia-smi reports while the run lives (polled every 0.5 s)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak = 0
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10).stdout
                self.peak = max([self.peak] + [int(x) for x in out.split()])
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
            self.done.wait(0.5)


def run_case(args, case, model):
    path = os.path.join(args.dir, case)
    with open(path + ".json", "w") as f:
        json.dump(config(case, args, os.path.join(args.dir, "swap")), f)
    cmd = [args.shardkit, "train", "--config", path + ".json", "--model", model, "--data",
           os.path.join(args.dir, "tokens.bin"), "--steps", str(args.steps), "--device", "cuda", "--seq-len", str(args.seq),
           "--metrics", path + ".jsonl"] + (["--activation-checkpointing"] if case == "s1-ac" else [])
    gpu = GpuPeak()
    gpu.start()
    start = time.monotonic()
    first_step = None
    phases = []
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    with open(path + ".txt", "w") as log:
        for line in p.stdout:
            t = time.monotonic() - start
            log.write(f"{t:8.2f} {line}")
            if first_step is None and re.search(r"step +1/", line):
                first_step = t
            elif first_step is None:
                phases.append(f"{t:6.1f} s  {line.strip()[:160]}")
            if "GPU memory after the first step" in line:
                phases.append(f"{t:6.1f} s  {line.strip()[:160]}")
    # This child's own peak resident memory (RUSAGE_CHILDREN would be the largest of every run so far).
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    gpu.done.set()
    gpu.join()
    rss = usage.ru_maxrss * 1024
    rows = [json.loads(l) for l in open(path + ".jsonl") if '"step_ms"' in l] if p.returncode == 0 else []
    refusal = [l for l in open(path + ".txt") if "would fit:" in l or "use more GPUs" in l]
    if not rows and refusal:
        return {"case": case, "refused": refusal[-1].strip().split(" ", 1)[-1]}
    if not rows:
        print(f"{case}: failed (exit {p.returncode}); the end of its output:")
        print("".join(open(path + ".txt").readlines()[-15:]))
        return None
    later = rows[1:] or rows
    step = statistics.median(r["step_ms"] for r in later) / 1e3
    tps = statistics.median(r["tokens_per_s"] for r in later)
    mfu = tps * flops_per_token(args) / PEAK_BF16
    recomputed = block_forward_flops_per_token(args) if case.startswith("s1-ac") else 0
    hfu = tps * (flops_per_token(args) + recomputed) / PEAK_BF16
    text = open(path + ".txt").read()
    planned = re.search(r"memory plan per rank: .*; GPU ([0-9.]+ [kMGT]?B) of ", text)
    measured = re.search(r"GPU memory after the first step: ([0-9.]+ [kMGT]?B) in use", text)
    return {"case": case, "launch_to_step1_s": first_step, "step_s": step, "tokens_per_s": tps, "mfu": mfu,
            "hfu": hfu, "gpu_planned": planned.group(1) if planned else "n/a",
            "gpu_measured": measured.group(1) if measured else "n/a", "gpu_peak_gb": gpu.peak * 2**20 / 1e9,
            "host_peak_rss_gb": rss / 1e9, "phases": phases}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardkit", default="build-gpu/shardkit")
    ap.add_argument("--cases", default="s1,s2-cpu,s3-cpu")
    ap.add_argument("--family", choices=["gpt2", "llama"], default="gpt2")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--accumulation", type=int, default=1)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--dir", default="/tmp/gpu-scale")
    args = ap.parse_args()
    os.makedirs(os.path.join(args.dir, "swap"), exist_ok=True)
    rng = random.Random(0)
    with open(os.path.join(args.dir, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<2000000H", *(rng.randrange(vocab_of(args)) for _ in range(2_000_000))))
    model = os.path.join(args.dir, "config.json" if args.family == "llama" else "model.json")
    with open(model, "w") as f:
        json.dump(model_file(args), f)
    n = params_of(args)
    print(f"{args.family} shape {args.layers} x {args.width}: {n / 1e9:.2f} B parameters, bf16, micro-batch "
          f"{args.micro_batch} x {args.seq}, {args.accumulation} accumulation, {args.steps} steps")
    print(f"{'case':9} {'to step 1':>10} {'step':>8} {'tok/s':>8} {'MFU':>6} {'HFU':>6} {'GPU planned':>12} "
          f"{'measured':>10} {'GPU peak':>9} {'host peak':>10}")
    results = []
    for case in args.cases.split(","):
        r = run_case(args, case, model)
        if r is None:
            continue
        results.append(r)
        if "refused" in r:
            print(f"{case:9} refused: {r['refused']}", flush=True)
            continue
        first = "n/a" if r["launch_to_step1_s"] is None else f"{r['launch_to_step1_s']:.1f} s"
        print(f"{case:9} {first:>10} {r['step_s']:7.3f}s {r['tokens_per_s']:8.0f} {100 * r['mfu']:5.1f}% "
              f"{100 * r['hfu']:5.1f}% {r['gpu_planned']:>12} {r['gpu_measured']:>10} {r['gpu_peak_gb']:7.1f}GB "
              f"{r['host_peak_rss_gb']:8.1f}GB", flush=True)
        for line in r["phases"]:
            print(f"    {line}")
    json.dump(results, open(os.path.join(args.dir, "results.json"), "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
