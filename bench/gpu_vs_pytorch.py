#!/usr/bin/env python3
"""GPU training speed of `shardkit train --device cuda` against PyTorch on the same GPU(s), side by side.

GPT-2 (default: 124M, sequence 1024, batch 16 per GPU) or a Llama preset (sequence 2048), bf16, AdamW
(lr 6e-4, weight decay 0.1 on the matrices and embeddings, none on biases and norms: two parameter
groups on PyTorch's side), gradient clipping 1.0. PyTorch: GPT-2 as an nn.Module written here, Llama
as transformers' LlamaForCausalLM, both with scaled_dot_product_attention, bf16 autocast, fused AdamW,
eager and torch.compile. shardkit: 1 GPU (ZeRO stage 1), and with two visible GPUs stage 2 and stage 3
on 2 GPUs (and ZeRO-Offload on 1 GPU, when --offload). The figure is the median tokens/s over the
timed steps after warm-up, with the model FLOP utilisation against the H200's dense bf16 peak (989
TFLOP/s): 6 N + 12 L d T FLOPs a token (N the parameters but the input embedding, d the attention
width, T the sequence). Prints one JSON line per case and a table.

The PyTorch side is a reference for the benchmark only; it is not part of shardkit.

Usage: bench/gpu_vs_pytorch.py [--shardkit build-gpu/shardkit] [--model gpt2|tinyllama-1.1b|...] [--steps 20]
       [--batch B] [--seq T] [--skip-pytorch] [--bucket N]
"""
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
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "trainer"))
from torch_decay import adamw_groups  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--shardkit", default=os.path.join(os.path.dirname(__file__), "..", "build-gpu", "shardkit"))
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--batch", type=int, default=None, help="per GPU (default 16 for GPT-2, 4 for Llama)")
ap.add_argument("--seq", type=int, default=None, help="tokens per sample (default 1024 for GPT-2, 2048 for Llama)")
ap.add_argument("--model", default="gpt2")
ap.add_argument("--skip-pytorch", action="store_true")
ap.add_argument("--offload", action="store_true", help="also run stage 2 with the optimizer on the CPU")
ap.add_argument("--bucket", type=int, default=25_000_000,
                help="reduce_bucket_size and allgather_bucket_size of shardkit's runs, in elements")
args = ap.parse_args()

PRESETS = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280), "gpt2-xl": (48, 25, 1600)}
# Llama presets: layers, hidden, intermediate, heads, kv heads, vocabulary, tied, rope_theta, llama3 scaling.
LLAMA = {"smollm-135m": (30, 576, 1536, 9, 3, 49152, True, 10000.0, None),
         "tinyllama-1.1b": (22, 2048, 5632, 32, 4, 32000, False, 10000.0, None),
         "llama-3.2-1b": (16, 2048, 8192, 32, 8, 128256, True, 500000.0,
                          {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192})}
LLAMA_FAMILY = args.model in LLAMA
SEQ = args.seq or (2048 if LLAMA_FAMILY else 1024)
BATCH = args.batch or (4 if LLAMA_FAMILY else 16)
VOCAB = LLAMA[args.model][5] if LLAMA_FAMILY else 50257
PEAK_FLOPS = 989e12  # H200 SXM, dense bf16


def flops_per_token():
    if LLAMA_FAMILY:
        L, H, I, NH, NKV, V, tied, _, _ = LLAMA[args.model]
        D = H // NH
        per_layer = H * (NH + 2 * NKV) * D + NH * D * H + 3 * H * I
        n = L * per_layer + V * H  # the output projection (tied or not) is a product; the lookup is not
        return 6 * n + 12 * L * NH * D * SEQ
    L, NH, C = PRESETS[args.model]
    n = L * 12 * C * C + VOCAB * C
    return 6 * n + 12 * L * C * SEQ


def llama_module():
    from transformers import LlamaConfig, LlamaForCausalLM
    L, H, I, NH, NKV, V, tied, theta, scaling = LLAMA[args.model]
    config = LlamaConfig(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                         num_key_value_heads=NKV, vocab_size=V, max_position_embeddings=max(SEQ, 2048),
                         rms_norm_eps=1e-5, rope_theta=theta, rope_scaling=scaling, tie_word_embeddings=tied,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)

    class Loss(nn.Module):  # the same loss as shardkit's: mean cross-entropy of the given targets
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, idx, targets):
            logits = self.model(input_ids=idx).logits
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))

    return Loss()


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.c_fc, self.c_fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.c_fc_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, NH, C, V=50257):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(SEQ, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.ln_f = nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output projection
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def pytorch_tokens_per_s(compiled, tokens):
    torch.manual_seed(0)
    model = (llama_module() if LLAMA_FAMILY else GPT2(*PRESETS[args.model])).cuda()
    # decay and no_decay, as shardkit forms them
    opt = torch.optim.AdamW(adamw_groups(model.parameters(), 0.1), lr=6e-4, fused=True)
    step_fn = torch.compile(model) if compiled else model
    windows = (len(tokens) - 1) // SEQ
    rng = np.random.default_rng(0)
    rates = []
    for step in range(args.warmup + args.steps):
        idx = rng.integers(0, windows, BATCH)
        x = torch.from_numpy(np.stack([tokens[i * SEQ:(i + 1) * SEQ] for i in idx]).astype(np.int64)).cuda()
        y = torch.from_numpy(np.stack([tokens[i * SEQ + 1:(i + 1) * SEQ + 1] for i in idx]).astype(np.int64)).cuda()
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the loss reaches the host every step, as shardkit's metrics need it
        if step >= args.warmup:
            rates.append(BATCH * SEQ / (time.perf_counter() - start))
    del model, opt
    torch.cuda.empty_cache()
    return statistics.median(rates)


def shardkit_tokens_per_s(tmp, data, ranks, stage, offload=False, wire=None):
    config = {"train_batch_size": BATCH * ranks, "gradient_clipping": 1.0, "bf16": {"enabled": True},
              "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                                    "reduce_bucket_size": args.bucket, "allgather_bucket_size": args.bucket},
              "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.1}}}
    if offload:
        config["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if wire:
        config["communication_data_type"] = wire
    name = f"np{ranks}-stage{stage}{'-offload' if offload else ''}{'-' + wire if wire else ''}"
    config_file = os.path.join(tmp, name + ".json")
    with open(config_file, "w") as f:
        json.dump(config, f)
    metrics = os.path.join(tmp, name + ".jsonl")
    command = [args.shardkit, "train", "--config", config_file, "--model", args.model, "--seq-len", str(SEQ), "--data",
               data, "--steps", str(args.warmup + args.steps), "--metrics", metrics, "--device", "cuda", "--quiet"]
    if ranks > 1:
        command = ["mpirun", "-n", str(ranks), "--oversubscribe", "--bind-to", "none"] + command
    subprocess.run(command, check=True, env=dict(os.environ, NCCL_NVLS_ENABLE="0"))
    steps = [json.loads(line) for line in open(metrics)][args.warmup:]
    return statistics.median(s["tokens_per_s"] for s in steps)


gpus = torch.cuda.device_count()
rows = []


def report(case, tokens_per_s, gpus_used):
    mfu = tokens_per_s / gpus_used * flops_per_token() / PEAK_FLOPS
    row = {"case": case, "model": args.model, "batch_per_gpu": BATCH, "seq": SEQ, "gpus": gpus_used,
           "tokens_per_s": round(tokens_per_s), "mfu": round(mfu, 4), "device": torch.cuda.get_device_name(0),
           "torch": torch.__version__}
    print(json.dumps(row), flush=True)
    rows.append(row)


with tempfile.TemporaryDirectory() as tmp:
    # 32-bit ids past a vocabulary of 65,536 (a NumPy file, which shardkit reads as it is).
    tokens = np.random.default_rng(1).integers(0, VOCAB, 8_000_000).astype("<u2" if VOCAB <= 65536 else "<u4")
    data = os.path.join(tmp, "tokens.npy")
    np.save(data, tokens)
    report("shardkit 1 GPU, stage 1", shardkit_tokens_per_s(tmp, data, 1, 1), 1)
    if args.offload:
        report("shardkit 1 GPU, stage 2 + CPU optimizer offload", shardkit_tokens_per_s(tmp, data, 1, 2, True), 1)
    if gpus >= 2:
        report("shardkit 2 GPUs, stage 2", shardkit_tokens_per_s(tmp, data, 2, 2), 2)
        report("shardkit 2 GPUs, stage 3", shardkit_tokens_per_s(tmp, data, 2, 3), 2)
        report("shardkit 2 GPUs, stage 2, gradients reduced in bf16", shardkit_tokens_per_s(tmp, data, 2, 2, wire="bf16"),
               2)
        report("shardkit 2 GPUs, stage 3, gradients reduced in bf16", shardkit_tokens_per_s(tmp, data, 2, 3, wire="bf16"),
               2)
    if not args.skip_pytorch:
        report("PyTorch eager, SDPA", pytorch_tokens_per_s(False, tokens), 1)
        report("PyTorch torch.compile, SDPA", pytorch_tokens_per_s(True, tokens), 1)

base = rows[0]["tokens_per_s"]
print(f"\n{'case':52} {'GPUs':>4} {'tokens/s':>10} {'MFU':>6} {'vs shardkit 1 GPU':>18}")
for r in rows:
    print(f"{r['case']:52} {r['gpus']:4d} {r['tokens_per_s']:10d} {r['mfu']:6.1%} {r['tokens_per_s'] / base:18.2f}")
