#!/usr/bin/env python3
"""A large model across GPU counts, end to end, in one call (issue 19's two-GPU run):
  1. MODEL (llama-2-7b) at ZeRO stage 3 on RANKS (2) GPUs, bf16, micro-batch 1 x SEQ (2048), global
     batch RANKS, STEPS - 1 (3) steps and a checkpoint saved from every rank at the last;
  2. that checkpoint resumed on one GPU with offload_optimizer and offload_param cpu (the same global
     batch through gradient accumulation) up to step STEPS (4), and on RANKS GPUs as it was saved
     (what the uninterrupted run gives: the disk holds one such checkpoint, so the first run cannot
     go on and save again): the one GPU's losses against the RANKS GPUs' (to rounding: another
     world size and reduction order);
  3. the checkpoint consolidated to safetensors in bf16, loaded by transformers' LlamaForCausalLM
     (GPT2LMHeadModel for GPT-2) and scored over WINDOWS windows of the token file, against `shardkit
     eval --device cuda --dtype bf16` of the checkpoint itself (bf16 rounds the weights: about 1e-2).
Each phase's wall time (launch to exit), the median step times, and the largest process's peak host
memory are printed, then one JSON object. Disk: the checkpoint takes 12 bytes a parameter (81 GB for
llama-2-7b), the bf16 export 2. Host memory: the one-GPU resume holds the optimizer states (81 GB for
llama-2-7b); on a virtual machine that reports less memory than its limit until it is used, export
SHARDKIT_HOST_MEMORY (e.g. 250GiB) first, or the memory plan refuses the resume.
Usage: bench/gpu_across_gpu_counts.py --shardkit build-gpu/shardkit [--model llama-2-7b] [--ranks 2]
       [--dir /tmp/gpu-across] [--steps 4] [--seq 2048] [--windows 8] [--vocab 32000]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import transformers


def run(cmd, log):
    start = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - start
    if rc != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        sys.exit(f"{' '.join(cmd[:6])} ... failed (exit {rc}); the end of {log}:\n{tail}")
    return wall


def steps_of(metrics):
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r for r in rows if "loss" in r and "step" in r}


def config(path, batch, zero):
    with open(path, "w") as f:
        json.dump({"train_batch_size": batch, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
                   "bf16": {"enabled": True}, "steps_per_print": 1, "zero_optimization": {"stage": 3, **zero},
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}, f)


def hf_loss(folder, ids, seq, windows, vocab):
    family = json.load(open(os.path.join(folder, "config.json")))["model_type"]
    cls = transformers.LlamaForCausalLM if family == "llama" else transformers.GPT2LMHeadModel
    start = time.monotonic()
    model = cls.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
    load = time.monotonic() - start
    total = 0.0
    with torch.no_grad():
        for k in range(windows):
            x = torch.from_numpy(ids[k * seq:k * seq + seq].astype(np.int64))[None].cuda()
            y = torch.from_numpy(ids[k * seq + 1:k * seq + seq + 1].astype(np.int64))[None].cuda()
            logits = model(input_ids=x).logits.float()
            total += torch.nn.functional.cross_entropy(logits.view(-1, vocab), y.view(-1), reduction="sum").item()
    del model
    torch.cuda.empty_cache()
    return total / (windows * seq), load


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardkit", default="build-gpu/shardkit")
    ap.add_argument("--model", default="llama-2-7b")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/gpu-across")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below it (the model's vocabulary)")
    args = ap.parse_args()
    # A folder of its own inside --dir, removed at the end: --dir's other contents are left alone.
    os.makedirs(args.dir, exist_ok=True)
    sk, save_at = os.path.abspath(args.shardkit), args.steps - 1
    d = tempfile.mkdtemp(prefix="shardkit-across-", dir=args.dir)
    ids = np.random.default_rng(0).integers(0, args.vocab, 4_000_000, dtype=np.uint16)
    tokens = os.path.join(d, "tokens.bin")
    ids.tofile(tokens)
    common = ["--model", args.model, "--data", tokens, "--seq-len", str(args.seq), "--device", "cuda"]
    report = {"model": args.model, "ranks": args.ranks, "seq": args.seq, "saved_at": save_at}

    config(f"{d}/many.json", args.ranks, {})
    mpi = ["mpirun", "-n", str(args.ranks), "--bind-to", "none", "-x", "NCCL_NVLS_ENABLE"]
    report["train_s"] = run(mpi + [sk, "train", "--config", f"{d}/many.json", *common, "--steps", str(save_at),
                                   "--save-dir", f"{d}/run", "--save-interval", str(save_at), "--metrics",
                                   f"{d}/many.jsonl"], f"{d}/many.txt")
    step_dir = f"{d}/run/step-{save_at:08d}"
    report["checkpoint_gb"] = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(step_dir)
                                  for f in fs) / 1e9

    resume = [*common, "--steps", str(args.steps), "--resume", step_dir]
    report["resume_ranks_s"] = run(mpi + [sk, "train", "--config", f"{d}/many.json", *resume, "--metrics",
                                          f"{d}/again.jsonl"], f"{d}/again.txt")
    config(f"{d}/one.json", args.ranks, {"offload_optimizer": {"device": "cpu", "pin_memory": True},
                                         "offload_param": {"device": "cpu", "pin_memory": True}})
    report["resume_one_s"] = run([sk, "train", "--config", f"{d}/one.json", *resume, "--metrics", f"{d}/one.jsonl"],
                                 f"{d}/one.txt")
    many, again, one = steps_of(f"{d}/many.jsonl"), steps_of(f"{d}/again.jsonl"), steps_of(f"{d}/one.jsonl")
    report["losses"] = {s: [again[s]["loss"], one[s]["loss"]] for s in sorted(one) if s in again}
    report["worst_relative_loss_diff"] = max(abs(a - b) / abs(a) for a, b in report["losses"].values())
    later = list(many.values())[1:] or list(many.values())
    report["step_s"] = {"ranks": statistics.median(r["step_ms"] for r in later) / 1e3,
                        "one_gpu_offloaded": statistics.median(r["step_ms"] for r in one.values()) / 1e3}

    report["consolidate_s"] = run([sk, "convert", "consolidate", step_dir, "-o", f"{d}/export", "--dtype", "bf16"],
                                  f"{d}/consolidate.txt")
    start = time.monotonic()
    out = subprocess.run([sk, "eval", step_dir, "--data", tokens, "--windows", str(args.windows), "--seq-len",
                          str(args.seq), "--device", "cuda", "--dtype", "bf16", "--json", "--quiet"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"shardkit eval failed ({out.returncode}): {out.stderr.strip()}")
    report["eval_s"] = time.monotonic() - start
    report["shardkit_eval_loss"] = json.loads(out.stdout)["loss"]
    report["transformers_loss"], report["transformers_load_s"] = hf_loss(f"{d}/export", ids, args.seq, args.windows,
                                                                         args.vocab)
    report["eval_relative_diff"] = abs(report["shardkit_eval_loss"] - report["transformers_loss"]) / abs(
        report["transformers_loss"])
    # The largest child's: the one-GPU run, which holds the offloaded states.
    report["peak_host_rss_gb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9

    print(f"{args.model}, stage 3, bf16, 1 x {args.seq} a rank:")
    print(f"  {args.ranks} GPU(s): {save_at} steps in {report['train_s']:.1f} s (step {report['step_s']['ranks']:.2f} s),"
          f" checkpoint at step {save_at}: {report['checkpoint_gb']:.1f} GB")
    print(f"  resumed on {args.ranks} GPU(s) in {report['resume_ranks_s']:.1f} s; on 1 GPU with offload_optimizer + "
          f"offload_param cpu in {report['resume_one_s']:.1f} s, step {report['step_s']['one_gpu_offloaded']:.2f} s; "
          f"losses after the save ({args.ranks} GPUs, 1 GPU): {report['losses']}, worst relative difference "
          f"{report['worst_relative_loss_diff']:.2e}")
    print(f"  consolidated (bf16 safetensors) in {report['consolidate_s']:.1f} s; loss over {args.windows} windows: "
          f"shardkit eval {report['shardkit_eval_loss']:.6f}, transformers {report['transformers_loss']:.6f} "
          f"(relative {report['eval_relative_diff']:.2e}; transformers loaded it in {report['transformers_load_s']:.1f} s)")
    print(json.dumps(report))
    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
