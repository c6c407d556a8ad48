#!/usr/bin/env python3
"""`shardkit eval --device cuda` on a 7B model, beside transformers, in one call.

Writes a Llama model of llama-2-7b's shape (6.74 B parameters, untied head) with random weights as a
Hugging Face folder (bf16 safetensors, save_pretrained), then scores the same windows of random
tokens with `shardkit eval FOLDER --device cuda` (bf16 and fp32) and with transformers'
LlamaForCausalLM (SDPA attention, the same dtypes, logits widened to fp32 for the cross-entropy).
Reported: the loss of each and their difference, shardkit's wall time from launch to result (reading
the weights included) and its scoring rate (the difference between --windows and 8 windows),
transformers' load and scoring times.

Usage: bench/gpu_eval_bench.py --shardkit build-gpu/shardkit [--dir /tmp/gpu-eval] [--windows 512]
       [--fp32-windows 32]
       [--seq 1024] [--layers 32] [--width 4096]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
import transformers

VOCAB, MLP = 32000, 11008


def write_model(args, folder):
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=args.width, intermediate_size=MLP,
                                      num_hidden_layers=args.layers, num_attention_heads=args.width // 128,
                                      num_key_value_heads=args.width // 128, max_position_embeddings=4096,
                                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    start = time.monotonic()
    model.save_pretrained(folder, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return n, time.monotonic() - start


def shardkit_eval(args, folder, tokens, dtype, windows):
    cmd = [args.shardkit, "eval", folder, "--data", tokens, "--windows", str(windows), "--seq-len",
           str(args.seq), "--device", "cuda", "--dtype", dtype, "--json", "--quiet"]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    if out.returncode != 0:
        print(f"shardkit eval --dtype {dtype} failed ({out.returncode}): {out.stderr.strip()}")
        return None
    return json.loads(out.stdout)["loss"], wall


def transformers_eval(args, folder, ids, dtype, windows):
    start = time.monotonic()
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa")
    model = model.cuda().eval()
    torch.cuda.synchronize()
    load = time.monotonic() - start
    T, total = args.seq, 0.0
    start = time.monotonic()
    with torch.no_grad():
        for k0 in range(0, windows, 8):
            rows = range(k0, min(k0 + 8, windows))
            x = torch.stack([torch.from_numpy(ids[k * T:k * T + T].astype(np.int64)) for k in rows]).cuda()
            y = torch.stack([torch.from_numpy(ids[k * T + 1:k * T + T + 1].astype(np.int64)) for k in rows]).cuda()
            logits = model(input_ids=x).logits.float()
            total += torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), y.view(-1), reduction="sum").item()
    torch.cuda.synchronize()
    score = time.monotonic() - start
    del model
    torch.cuda.empty_cache()
    return total / (windows * T), load, score


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardkit", default="build-gpu/shardkit")
    ap.add_argument("--dir", default="/tmp/gpu-eval")
    ap.add_argument("--windows", type=int, default=512, help="windows scored in bf16")
    ap.add_argument("--fp32-windows", type=int, default=32, help="windows scored in fp32 (slower: no tensor cores)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--width", type=int, default=4096)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    folder = os.path.join(args.dir, "llama")
    n, saved = write_model(args, folder)
    ids = np.random.default_rng(0).integers(0, VOCAB, max(args.windows, args.fp32_windows) * args.seq + 1,
                                            dtype=np.uint16)
    tokens = os.path.join(args.dir, "tokens.bin")
    ids.tofile(tokens)
    print(f"llama shape {args.layers} x {args.width}: {n / 1e9:.2f} B parameters, bf16 weights written in "
          f"{saved:.1f} s; windows of {args.seq} tokens: {args.windows} in bf16, {args.fp32_windows} in fp32")
    print(f"{'dtype':6} {'shardkit loss':>14} {'transformers':>13} {'|diff|':>9} {'wall (8)':>9} {'wall':>7} "
          f"{'tok/s':>9} {'hf load':>8} {'hf score':>9} {'hf tok/s':>9}")
    for dtype, torch_dtype, windows in (("bf16", torch.bfloat16, args.windows),
                                        ("fp32", torch.float32, args.fp32_windows)):
        few = shardkit_eval(args, folder, tokens, dtype, 8)
        ours = shardkit_eval(args, folder, tokens, dtype, windows)
        theirs, load, score = transformers_eval(args, folder, ids, torch_dtype, windows)
        if ours is None or few is None:
            continue
        loss, wall = ours
        rate = (windows - 8) * args.seq / max(wall - few[1], 1e-9)
        print(f"{dtype:6} {loss:14.7f} {theirs:13.7f} {abs(loss - theirs):9.2e} {few[1]:8.2f}s {wall:6.2f}s "
              f"{rate:9.0f} {load:7.1f}s {score:8.2f}s {windows * args.seq / score:9.0f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
