#!/usr/bin/env python3
"""Trains tiny models with real DeepSpeed and saves ZeRO checkpoints, each with the exact values the live
engine held when it saved: the fixtures of tests/convert/deepspeed_real_test.cpp (tests/data/deepspeed/).

Per case (a model, ZeRO stage, dtype, world size, parameter groups, DeepSpeed options, optimizer) the
ranks run `deepspeed.initialize` with `torch.optim.AdamW` (or, for the `-lion` cases, a Lion that keeps
DeepSpeed FusedLion's states), train a few optimizer steps on batches that depend on the step only, call
`engine.save_checkpoint`, and gather their partitions of the fp32 master weights and the optimizer's
moments. OUT/<case>/ then holds:

  latest, global_step<N>/        DeepSpeed's checkpoint (its zero_to_fp32.py copy removed)
  expected.safetensors           fp32/<name>, exp_avg/<name>[, exp_avg_sq/<name>]: F32, full shapes
  expected.json                  counters, parameters (name, shape, group) in module order, the case, the
                                 DeepSpeed config, versions, losses, the command that made it
  model.json                     shardkit's JSON model file (docs/FORMAT.md §7) for GPT-2 / Llama cases

Usage (CPU, torch 1.13 with gloo; DeepSpeed importable):
  DS_ACCELERATOR=cpu PYTHONPATH=<deepspeed site> python3 write_deepspeed_fixtures.py --out DIR [--cases cpu]
  ... --list                     the cases and what they hold
GPU (torch 2.x, NCCL, one GPU; the `gpu` set holds one-rank cases only):
  DS_ACCELERATOR=cuda PYTHONPATH=<deepspeed site> python3 write_deepspeed_fixtures.py --out DIR --device cuda \
      --cases gpu
--cases takes `cpu`, `gpu`, `all` or a comma list of case names. A case whose folder exists is refused
unless --force. The ranks are processes of this script (--rank-worker), on 127.0.0.1.

The roundtrip script tests/interop/deepspeed_roundtrip.py imports this file for its models, batches,
engine set-up and state gathering.
"""

import argparse
import collections
import datetime
import glob
import json
import math
import os
import platform
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import time

SCRIPT = os.path.abspath(__file__)
SEQ_LEN = 8  # tokens per row of the token models

# ---------------------------------------------------------------------------------------------------
# Models. Tiny, with the parameter names, orientations and registration order of Hugging Face's
# GPT2LMHeadModel and LlamaForCausalLM, and one network whose names no model family knows.
# Element counts are small and mostly odd so that ZeRO's padding shows at every world size.

MODEL_FILES = {
    "gpt2": {"family": "gpt2", "name": "ds-fixture-gpt2", "n_layer": 2, "n_head": 3, "n_embd": 15,
             "vocab_size": 53, "n_positions": 16},
    "llama": {"family": "llama", "name": "ds-fixture-llama", "num_hidden_layers": 2, "hidden_size": 20,
              "intermediate_size": 28, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6,
              "vocab_size": 37, "max_position_embeddings": 16, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "rope_scaling": None, "tie_word_embeddings": False},
}
MODEL_FILES["llama-tied"] = dict(MODEL_FILES["llama"], name="ds-fixture-llama-tied", tie_word_embeddings=True)
NET_SHAPE = {"channels": 3, "kernel": 3, "patches": 4, "width": 8, "hidden": 12, "blocks": 2, "classes": 5}


def build_model(name, config=None):
    """The torch module of a model name (gpt2, llama, llama-tied, net), initialised from the current seed;
    `config` replaces the name's MODEL_FILES entry (another shape of the same family)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def norm_f32(x, fn):
        # Norms in fp32 and back: torch 1.13's CPU kernels for bf16 are not all there, and fp32 is what
        # mixed-precision training does anyway.
        return fn(x.float()).to(x.dtype)

    def causal_attention(q, k, v):  # [B, H, T, d] each
        t = q.shape[-2]
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        return (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v.float()).to(q.dtype)

    class Conv1D(nn.Module):
        """GPT-2's projection: weight [in, out]."""

        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
            self.bias = nn.Parameter(torch.zeros(n_out))

        def forward(self, x):
            return x @ self.weight + self.bias

    class LayerNorm(nn.LayerNorm):
        def forward(self, x):
            return norm_f32(x, lambda h: F.layer_norm(h, self.normalized_shape, self.weight.float(),
                                                      self.bias.float(), self.eps))

    class GPT2Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.heads = c["n_head"]
            self.c_attn = Conv1D(c["n_embd"], 3 * c["n_embd"])
            self.c_proj = Conv1D(c["n_embd"], c["n_embd"])

        def forward(self, x):
            b, t, d = x.shape
            split = [h.view(b, t, self.heads, d // self.heads).transpose(1, 2) for h in self.c_attn(x).split(d, 2)]
            return self.c_proj(causal_attention(*split).transpose(1, 2).reshape(b, t, d))

    class GPT2MLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c_fc = Conv1D(c["n_embd"], 4 * c["n_embd"])
            self.c_proj = Conv1D(4 * c["n_embd"], c["n_embd"])

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class GPT2Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.ln_1 = LayerNorm(c["n_embd"])
            self.attn = GPT2Attention(c)
            self.ln_2 = LayerNorm(c["n_embd"])
            self.mlp = GPT2MLP(c)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT2Model(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
            self.wpe = nn.Embedding(c["n_positions"], c["n_embd"])
            self.h = nn.ModuleList(GPT2Block(c) for _ in range(c["n_layer"]))
            self.ln_f = LayerNorm(c["n_embd"])

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))[None]
            for block in self.h:
                x = block(x)
            return self.ln_f(x)

    class GPT2LMHeadModel(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.transformer = GPT2Model(c)
            self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
            self.lm_head.weight = self.transformer.wte.weight  # tied: one Parameter, listed once

        def forward(self, ids):
            return self.lm_head(self.transformer(ids))

    class RMSNorm(nn.Module):
        def __init__(self, d, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.eps = eps

        def forward(self, x):
            return norm_f32(x, lambda h: h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)) * self.weight

    def rotate(x, theta):  # [B, H, T, d], Hugging Face's rotate_half pairing
        t, d = x.shape[-2], x.shape[-1]
        inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device).float() / d)
        angles = torch.outer(torch.arange(t, device=x.device).float(), inv).repeat(1, 2)
        return x * angles.cos().to(x.dtype) + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * angles.sin().to(x.dtype)

    class LlamaAttention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.h, self.kv, self.d, self.theta = (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                                                   c["rope_theta"])
            width = c["hidden_size"]
            self.q_proj = nn.Linear(width, self.h * self.d, bias=False)
            self.k_proj = nn.Linear(width, self.kv * self.d, bias=False)
            self.v_proj = nn.Linear(width, self.kv * self.d, bias=False)
            self.o_proj = nn.Linear(self.h * self.d, width, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q = rotate(self.q_proj(x).view(b, t, self.h, self.d).transpose(1, 2), self.theta)
            k = rotate(self.k_proj(x).view(b, t, self.kv, self.d).transpose(1, 2), self.theta)
            v = self.v_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
            rep = self.h // self.kv
            y = causal_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1))
            return self.o_proj(y.transpose(1, 2).reshape(b, t, self.h * self.d))

    class LlamaMLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.gate_proj = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=False)
            self.up_proj = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=False)
            self.down_proj = nn.Linear(c["intermediate_size"], c["hidden_size"], bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class LlamaDecoderLayer(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.self_attn = LlamaAttention(c)
            self.mlp = LlamaMLP(c)
            self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
            self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

        def forward(self, x):
            x = x + self.self_attn(self.input_layernorm(x))
            return x + self.mlp(self.post_attention_layernorm(x))

    class LlamaModel(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
            self.layers = nn.ModuleList(LlamaDecoderLayer(c) for _ in range(c["num_hidden_layers"]))
            self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

        def forward(self, ids):
            x = self.embed_tokens(ids)
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    class LlamaForCausalLM(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.model = LlamaModel(c)
            self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
            if c["tie_word_embeddings"]:
                self.lm_head.weight = self.model.embed_tokens.weight
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.05)

        def forward(self, ids):
            return self.lm_head(self.model(ids))

    # The network no family knows: a patch "stem" (a 4-D convolution kernel applied to flattened
    # patches), a 3-D position table, residual MLP blocks and a classifier head.
    class PatchStem(nn.Module):
        """A convolution kernel [out, C, K, K] applied to K x K patches (one output position each). ZeRO-3
        gathers a module's parameters around its own forward, so the kernel is used in this one."""

        def __init__(self, s):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(s["width"], s["channels"], s["kernel"], s["kernel"]) * 0.2)
            self.bias = nn.Parameter(torch.zeros(s["width"]))

        def forward(self, patches):  # [B, P, C, K, K] -> [B, P, width]
            return patches.flatten(2) @ self.weight.flatten(1).t() + self.bias

    class Encoder(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.stem = PatchStem(s)
            self.pos = nn.Parameter(torch.randn(1, s["patches"], s["width"]) * 0.1)
            self.norm = LayerNorm(s["width"])

        def forward(self, patches):
            return self.norm(torch.tanh(self.stem(patches)) + self.pos)

    class Block(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.fc1 = nn.Linear(s["width"], s["hidden"])
            self.fc2 = nn.Linear(s["hidden"], s["width"])

        def forward(self, x):
            return x + self.fc2(torch.tanh(self.fc1(x)))

    class Head(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.proj = nn.Linear(s["width"], s["classes"])

        def forward(self, x):
            return self.proj(x.mean(1))

    class PatchNet(nn.Module):
        def __init__(self, s):
            super().__init__()
            self.encoder = Encoder(s)
            self.blocks = nn.ModuleList(Block(s) for _ in range(s["blocks"]))
            self.head = Head(s)

        def forward(self, patches):
            x = self.encoder(patches)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    if name == "net":
        return PatchNet(NET_SHAPE)
    c = config or MODEL_FILES[name]
    if c["family"] == "gpt2":
        model = GPT2LMHeadModel(c)
        for n, p in model.named_parameters():
            if n.endswith("wte.weight") or n.endswith("wpe.weight"):
                nn.init.normal_(p, std=0.05)
        return model
    return LlamaForCausalLM(c)


def no_decay(name):
    """Hugging Face Trainer's split: biases and normalization weights (here also the position table) get
    no weight decay."""
    return name.endswith(".bias") or "norm" in name or ".ln_" in name or name.endswith(".pos")


def global_batch(model, step, rows, device):
    """The inputs and targets of optimizer step `step`: a function of the step only, `rows` rows."""
    import torch
    g = torch.Generator().manual_seed(7919 + step)
    if model == "net":
        s = NET_SHAPE
        x = torch.randn(rows, s["patches"], s["channels"], s["kernel"], s["kernel"], generator=g)
        y = torch.randint(0, s["classes"], (rows,), generator=g)
        return x.to(device), y.to(device)
    ids = torch.randint(0, MODEL_FILES[model]["vocab_size"], (rows, SEQ_LEN + 1), generator=g).to(device)
    return ids[:, :-1], ids[:, 1:]


def micro_loss(engine, model, inputs, targets):
    import torch
    import torch.nn.functional as F
    if model == "net":
        dtype = next(p for p in engine.module.parameters()).dtype
        return F.cross_entropy(engine(inputs.to(dtype)).float(), targets)
    logits = engine(inputs).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---------------------------------------------------------------------------------------------------
# Cases. `batch` is the global batch of one optimizer step: world * grad_accum * micro rows.

def _case(model, stage, dtype, world, groups=2, steps=3, batch=6, zero=None, top=None, device="cpu", note="",
          optimizer="adamw"):
    return dict(model=model, stage=stage, dtype=dtype, world=world, groups=groups, steps=steps, batch=batch,
                zero=zero or {}, top=top or {}, device=device, note=note, optimizer=optimizer)


# The optimizer's moments, as its state keys name them. "fused-lion" is DeepSpeed's own Lion, built from
# the config's "optimizer" section (FusedLion on a GPU; its CPU accelerator has no Lion kernels).
MOMENTS = {"adamw": ("exp_avg", "exp_avg_sq"), "lion": ("exp_avg",), "fused-lion": ("exp_avg",)}
FUSED_LION = {"type": "Lion", "params": {"lr": 2e-4, "betas": [0.9, 0.99]}}


def lion_optimizer(param_groups, lr, betas):
    """Lion as DeepSpeed's FusedLion keeps it (state 'step' and 'exp_avg'; lr, betas, weight_decay): the
    plain-PyTorch Lion of tests/trainer/torch_lion.py with FusedLion's step count. DeepSpeed's own Lion
    kernels are not built for its CPU accelerator, and ZeRO partitions and saves a client optimizer's
    state exactly as it does its own."""
    sys.path.insert(0, os.path.join(os.path.dirname(SCRIPT), os.pardir, "trainer"))
    from torch_lion import Lion as PlainLion

    class Lion(PlainLion):
        def step(self, closure=None):
            super().step()
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self.state[p]["step"] = self.state[p].get("step", 0) + 1

    return Lion(param_groups, lr=lr, betas=betas)


WARMUP = {"gradient_accumulation_steps": 2,
          "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
                                                       "warmup_num_steps": 4}}}
CASES = collections.OrderedDict([
    ("gpt2-s1-fp32-w2", _case("gpt2", 1, "fp32", 2)),
    ("gpt2-s2-bf16-w2", _case("gpt2", 2, "bf16", 2)),
    ("gpt2-s2-fp32-w1-g1", _case("gpt2", 2, "fp32", 1, groups=1, note="one parameter group")),
    ("gpt2-s3-fp32-w3", _case("gpt2", 3, "fp32", 3)),
    ("gpt2-s3-bf16-w2-sub", _case("gpt2", 3, "bf16", 2, zero={"sub_group_size": 1500},
                                  note="stage 3 sub-groups of at most 1500 elements")),
    ("gpt2-s2-bf16-w2-warmup", _case("gpt2", 2, "bf16", 2, batch=12, top=WARMUP,
                                     note="WarmupLR scheduler, gradient accumulation 2")),
    ("llama-s1-bf16-w3", _case("llama", 1, "bf16", 3)),
    ("llama-s2-fp32-w2", _case("llama", 2, "fp32", 2)),
    ("llama-s3-bf16-w1", _case("llama", 3, "bf16", 1)),
    ("llama-s3-fp32-w2-g1", _case("llama", 3, "fp32", 2, groups=1, note="one parameter group")),
    ("llama-tied-s2-fp32-w3", _case("llama-tied", 2, "fp32", 3, note="output projection tied to the embedding")),
    ("llama-tied-s3-bf16-w2", _case("llama-tied", 3, "bf16", 2, note="output projection tied to the embedding")),
    ("net-s2-fp32-w2", _case("net", 2, "fp32", 2, note="a model of no known family")),
    ("net-s3-bf16-w3", _case("net", 3, "bf16", 3, note="a model of no known family")),
    ("gpt2-s2-bf16-w2-lion", _case("gpt2", 2, "bf16", 2, optimizer="lion", note="Lion (FusedLion's states)")),
    ("llama-s3-fp32-w2-lion", _case("llama", 3, "fp32", 2, optimizer="lion", note="Lion (FusedLion's states)")),
    # torch 2.x on one GPU: stage 3 parameters pickle through torch._tensor._rebuild_from_type_v2.
    ("gpt2-s3-bf16-w1-cuda", _case("gpt2", 3, "bf16", 1, device="cuda")),
    ("llama-s3-bf16-w1-cuda", _case("llama", 3, "bf16", 1, device="cuda")),
    ("llama-tied-s2-bf16-w1-cuda", _case("llama-tied", 2, "bf16", 1, device="cuda")),
    ("net-s3-bf16-w1-cuda", _case("net", 3, "bf16", 1, device="cuda")),
    ("gpt2-s2-bf16-w1-fusedlion-cuda", _case("gpt2", 2, "bf16", 1, device="cuda", optimizer="fused-lion",
                                             note="DeepSpeed's FusedLion (the config's optimizer)")),
])


def ds_config(case):
    top = dict(case["top"])
    accum = top.pop("gradient_accumulation_steps", 1)
    if case["batch"] % (case["world"] * accum):
        raise ValueError("batch %d is not a multiple of world %d x accumulation %d" % (case["batch"], case["world"],
                                                                                       accum))
    cfg = {
        "train_batch_size": case["batch"],
        "train_micro_batch_size_per_gpu": case["batch"] // (case["world"] * accum),
        "gradient_accumulation_steps": accum,
        "gradient_clipping": 1.0,
        "zero_optimization": dict({"stage": case["stage"]}, **case["zero"]),
        "bf16": {"enabled": case["dtype"] == "bf16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if case["optimizer"] == "fused-lion":
        cfg["optimizer"] = FUSED_LION
    cfg.update(top)
    return cfg


# ---------------------------------------------------------------------------------------------------
# torch 1.13's Gloo process group has no _allgather_base / _reduce_scatter_base (which ZeRO calls through
# all_gather_into_tensor / reduce_scatter_tensor) and no bfloat16 at all. Before DeepSpeed binds
# torch.distributed's functions, these wrappers put their meaning on what Gloo has: bf16 bytes travel as
# uint8, bf16 sums are taken in fp32 and rounded once, and the flat-tensor collectives become list
# collectives over views. torch 2.x and NCCL need none of it.

class _Finished:
    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True


def patch_gloo_for_torch1():
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    if int(torch.__version__.split(".")[0]) >= 2:
        return False
    orig = {k: getattr(dist, k) for k in ("broadcast", "all_reduce", "reduce", "all_gather")}

    def raw(t):  # bf16 as bytes, for collectives that only move data
        return t.view(torch.uint8) if t.dtype == torch.bfloat16 else t

    def summed(fn, tensor, *args, **kwargs):
        async_op = kwargs.pop("async_op", False)
        if tensor.dtype != torch.bfloat16:
            return fn(tensor, *args, async_op=async_op, **kwargs)
        wide = tensor.float()
        fn(wide, *args, **kwargs)
        tensor.copy_(wide)
        return _Finished() if async_op else None

    def broadcast(tensor, src, group=None, async_op=False):
        return orig["broadcast"](raw(tensor), src, group=group, async_op=async_op)

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return summed(orig["all_reduce"], tensor, op=op, group=group, async_op=async_op)

    def reduce(tensor, dst, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return summed(lambda t, **kw: orig["reduce"](t, dst, **kw), tensor, op=op, group=group, async_op=async_op)

    def all_gather(tensor_list, tensor, group=None, async_op=False):
        return orig["all_gather"]([raw(t) for t in tensor_list], raw(tensor), group=group, async_op=async_op)

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        parts = raw(output_tensor.view(-1)).chunk(dist.get_world_size(group))
        return orig["all_gather"](list(parts), raw(input_tensor.contiguous().view(-1)), group=group,
                                  async_op=async_op)

    def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        wide = input.detach().float().contiguous().view(-1)
        orig["all_reduce"](wide, op=op, group=group)
        output.copy_(wide.chunk(dist.get_world_size(group))[dist.get_rank(group)].view_as(output))
        return _Finished() if async_op else None

    def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
        wide = torch.cat([t.detach().float().reshape(-1) for t in input_list])
        orig["all_reduce"](wide, op=op, group=group)
        rank = dist.get_rank(group)
        start = sum(t.numel() for t in input_list[:rank])
        output.copy_(wide[start:start + input_list[rank].numel()].view_as(output))
        return _Finished() if async_op else None

    def all_reduce_coalesced(tensors, op=dist.ReduceOp.SUM, group=None, async_op=False):
        for t in tensors:
            all_reduce(t, op=op, group=group)
        return _Finished() if async_op else None

    for module in (dist, c10d):
        module.broadcast, module.all_reduce, module.reduce, module.all_gather = (broadcast, all_reduce, reduce,
                                                                                 all_gather)
        module.all_gather_into_tensor = module._all_gather_base = all_gather_into_tensor
        module.reduce_scatter_tensor = module._reduce_scatter_base = reduce_scatter_tensor
        module.reduce_scatter = reduce_scatter
        module.all_reduce_coalesced = all_reduce_coalesced
    return True


def init_distributed(device):
    """Rank set-up from the environment the launcher gives (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    import torch
    import deepspeed
    if device == "cpu":
        patch_gloo_for_torch1()
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="gloo" if device == "cpu" else "nccl", auto_mpi_discovery=False)


def make_engine(case, seed=1234):
    """The model (same initial weights on every rank), AdamW with the case's groups, and DeepSpeed's engine.
    Returns (engine, named parameters in module order, group names)."""
    import torch
    import deepspeed
    torch.manual_seed(seed)
    model = build_model(case["model"])
    named = list(model.named_parameters())
    if case["groups"] == 2:
        groups = [[n for n, _ in named if not no_decay(n)], [n for n, _ in named if no_decay(n)]]
        decay = [0.1, 0.0]
    else:
        groups, decay = [[n for n, _ in named]], [0.1]
    by_name = dict(named)
    param_groups = [{"params": [by_name[n] for n in g], "weight_decay": wd} for g, wd in zip(groups, decay)]
    if case["optimizer"] == "fused-lion":
        # DeepSpeed builds the optimizer from the config over the groups given as model_parameters.
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups, config=ds_config(case))
        return engine, named, groups
    if case["optimizer"] == "lion":
        optimizer = lion_optimizer(param_groups, lr=2e-4, betas=(0.9, 0.99))
    else:
        optimizer = torch.optim.AdamW(param_groups, lr=2e-3, betas=(0.9, 0.95), eps=1e-8)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(case))
    return engine, named, groups


def train(engine, case, first_step, steps):
    """`steps` optimizer steps from `first_step` on the global batches of those steps. Each rank takes its
    rows of each micro-step; returns each step's mean loss over the whole global batch."""
    import torch
    import torch.distributed as dist
    world, rank = dist.get_world_size(), dist.get_rank()
    accum = engine.gradient_accumulation_steps()
    micro = engine.train_micro_batch_size_per_gpu()
    losses = []
    for step in range(first_step, first_step + steps):
        inputs, targets = global_batch(case["model"], step, micro * world * accum, engine.device)
        total = torch.zeros(1, dtype=torch.float32, device=engine.device)
        for m in range(accum):
            rows = slice((m * world + rank) * micro, (m * world + rank + 1) * micro)
            loss = micro_loss(engine, case["model"], inputs[rows], targets[rows])
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        dist.all_reduce(total)
        losses.append(float(total) / (world * accum))
    return losses


def finish_rank():
    """Ends a rank once its files are closed. torch 1.13 + Gloo + DeepSpeed now and then abort in the
    interpreter's teardown ("terminate called without an active exception") after all work is done; leaving
    the process group and exiting at once keeps that from turning a finished rank into a failure."""
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _all_gather_flat(t):
    import torch
    import torch.distributed as dist
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return parts


def gather_state(engine, named, moments=MOMENTS["adamw"]):
    """Every parameter's fp32 master weight and the optimizer's `moments`, full shape, as the live ZeRO
    optimizer holds them: each rank's partitions gathered (a collective: every rank calls). The values are
    moved, never summed, so they are the engine's bits. Returns an OrderedDict 'fp32/<name>' ... -> CPU fp32
    tensor."""
    import torch
    zero = engine.optimizer
    names = {id(p): n for n, p in named}
    out = {}
    state = zero.optimizer.state
    if hasattr(zero, "round_robin_bit16_groups"):
        # Stage 1/2: per group one flat buffer (params in group order, zero-padded to W equal parts).
        for params, part in zip(zero.round_robin_bit16_groups, zero.single_partition_of_fp32_groups):
            for key, t in (("fp32", part),) + tuple((m, state[part][m]) for m in moments):
                flat = torch.cat(_all_gather_flat(t.detach()))
                offset = 0
                for p in params:
                    out[key + "/" + names[id(p)]] = flat[offset:offset + p.numel()].view(p.shape).float().cpu()
                    offset += p.numel()
    else:
        # Stage 3: per sub-group the rank's pieces of its parameters, ceil(n/W) elements each.
        for params, flat_part in zip(zero.fp16_groups, zero.fp32_partitioned_groups_flat):
            for key, t in (("fp32", flat_part),) + tuple((m, state[flat_part][m]) for m in moments):
                ranks = _all_gather_flat(t.detach())
                offset = 0
                for p in params:
                    piece = p.ds_tensor.ds_numel
                    full = torch.cat([r[offset:offset + piece] for r in ranks])[:p.ds_numel]
                    out[key + "/" + names[id(p)]] = full.view(p.ds_shape).float().cpu()
                    offset += piece
    ordered = collections.OrderedDict()
    for key in ("fp32",) + tuple(moments):
        for n, _ in named:
            ordered[key + "/" + n] = out[key + "/" + n].clone()
    return ordered


def check_against_api(engine, named, groups, state, moments=MOMENTS["adamw"]):
    """DeepSpeed's public read-back for every parameter, against `state`: a check of gather_state's cuts.
    Equal as numbers (the API sums the ranks' parts: -0.0 may come back as 0.0). Stage 1/2 with several
    groups: DeepSpeed links the moments to the parameters after the first group's first step, before the
    other groups have state, so the API has no moments for them (and asking for them raises on the ranks
    that hold a piece and sums on the others, a collective out of step); only group 0's are asked."""
    import torch
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    stage3 = not hasattr(engine.optimizer, "round_robin_bit16_groups")
    checked = 0
    for n, p in named:
        fp32 = safe_get_full_fp32_param(p)
        if not torch.equal(fp32.float().cpu().view(p.ds_shape if hasattr(p, "ds_shape") else p.shape),
                           state["fp32/" + n]):
            raise AssertionError("gathered fp32 of %s differs from safe_get_full_fp32_param" % n)
        checked += 1
        if not stage3 and n not in groups[0]:
            continue
        for key in moments:
            api = safe_get_full_optimizer_state(p, key)
            if not torch.equal(api.float().cpu().view_as(state[key + "/" + n]), state[key + "/" + n]):
                raise AssertionError("gathered %s of %s differs from safe_get_full_optimizer_state" % (key, n))
            checked += 1
    return checked


def counters(engine):
    base = engine.optimizer.optimizer
    steps = sorted({int(s["step"]) for s in base.state.values() if "step" in s})
    if len(steps) != 1:
        raise AssertionError("Adam's step differs between groups: %s" % steps)
    scheduler = engine.lr_scheduler
    return {
        "global_steps": engine.global_steps,
        "global_samples": engine.global_samples,
        "skipped_steps": engine.skipped_steps,
        "adam_step": steps[0],
        "last_batch_iteration": getattr(scheduler, "last_batch_iteration", None) if scheduler else None,
    }


# ---------------------------------------------------------------------------------------------------
# safetensors, by the published layout: u64 little-endian header length, JSON header, packed data.

def write_safetensors(path, tensors, metadata=None):
    """`tensors`: ordered name -> torch tensor (written as F32)."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        data = t.detach().float().contiguous().cpu().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    import numpy as np
    import torch
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = collections.OrderedDict()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError("%s: %s is %s, expected F32" % (path, name, info["dtype"]))
        lo, hi = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[lo:hi], dtype="<f4").copy()).view(info["shape"])
    return out


# ---------------------------------------------------------------------------------------------------
# Launching ranks.

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_leftovers(port):
    """DeepSpeed's CPU shared-memory op leaves /dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>
    (about 66 MB each) behind."""
    return glob.glob("/dev/shm/deepspeed_allreduce_buffer_*_%d_*" % port)


def launch(argv, world, device, log_path, timeout):
    """Runs `python3 SCRIPT argv` as `world` ranks; returns the exit codes (None: timed out)."""
    port = free_port()
    codes = []
    with open(log_path, "w") as log:
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank if device == "cuda"
                                                                                        else 0),
                       LOCAL_WORLD_SIZE=str(world), LOCAL_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       OMP_NUM_THREADS="1", DS_ACCELERATOR=device)
            procs.append(subprocess.Popen([sys.executable] + argv, env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + timeout
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.time())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for f in shm_leftovers(port):
        os.remove(f)
    return codes


def log_tail(path, lines=25):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


# ---------------------------------------------------------------------------------------------------
# One case, in each rank.

def write_json(path, obj):
    """An object with one key per line and one list element per line, each value compact: diffs stay short."""
    lines = []
    for key, value in obj.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            inner = ",\n  ".join(json.dumps(v) for v in value)
            lines.append(" %s: [\n  %s\n ]" % (json.dumps(key), inner))
        else:
            lines.append(" %s: %s" % (json.dumps(key), json.dumps(value)))
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


def rank_worker(name, folder):
    import torch
    import torch.distributed as dist
    import deepspeed
    case = CASES[name]
    init_distributed(case["device"])
    if dist.get_world_size() != case["world"]:
        raise SystemExit("%s needs %d ranks, got %d" % (name, case["world"], dist.get_world_size()))
    engine, named, groups = make_engine(case)
    losses = train(engine, case, 0, case["steps"])
    moments = MOMENTS[case["optimizer"]]
    state = gather_state(engine, named, moments)
    api_checked = check_against_api(engine, named, groups, state, moments)
    engine.save_checkpoint(folder)
    dist.barrier()
    if dist.get_rank() != 0:
        return
    group_of = {n: g for g, names in enumerate(groups) for n in names}
    write_safetensors(os.path.join(folder, "expected.safetensors"), state)
    tag = open(os.path.join(folder, "latest")).read()
    expected = {
        "case": name,
        "spec": {k: v for k, v in case.items() if k != "note"},
        "note": case["note"],
        "model": case["model"],
        "model_file": "model.json" if case["model"] in MODEL_FILES else None,
        "stage": case["stage"],
        "world_size": case["world"],
        "dtype": case["dtype"],
        "optimizer": case["optimizer"],
        "tag": tag,
        "counters": counters(engine),
        "params": [{"name": n, "shape": list(p.ds_shape if hasattr(p, "ds_shape") else p.shape),
                    "group": group_of[n]} for n, p in named],
        "groups": groups,
        "ds_config": ds_config(case),
        "losses": losses,
        "api_values_checked": api_checked,
        "deepspeed": deepspeed.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": case["device"] if case["device"] == "cpu" else torch.cuda.get_device_name(),
        "zero_optimizer": type(engine.optimizer).__name__,
        "files": sorted(os.listdir(os.path.join(folder, tag))),
    }
    write_json(os.path.join(folder, "expected.json"), expected)
    if case["model"] in MODEL_FILES:
        with open(os.path.join(folder, "model.json"), "w") as f:
            json.dump(MODEL_FILES[case["model"]], f, indent=1)
            f.write("\n")


def select(spec, device):
    if spec in ("cpu", "gpu"):
        want = "cpu" if spec == "cpu" else "cuda"
        return [n for n, c in CASES.items() if c["device"] == want]
    if spec == "all":
        return [n for n, c in CASES.items() if c["device"] == device]
    names = [n for n in spec.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit("unknown case(s) %s; --list shows them" % ", ".join(unknown))
    return names


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", help="folder to write OUT/<case>/ into")
    p.add_argument("--cases", default="cpu", help="cpu, gpu, all (of --device) or a comma list of names")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--force", action="store_true", help="replace case folders that exist")
    p.add_argument("--timeout", type=float, default=600, help="seconds per case")
    p.add_argument("--list", action="store_true")
    p.add_argument("--rank-worker", nargs=2, metavar=("CASE", "FOLDER"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank_worker:
        rank_worker(*args.rank_worker)
        finish_rank()
    if args.list:
        for n, c in CASES.items():
            print("%-28s %-10s stage %d %s %d rank(s) %d group(s) %s %s" % (n, c["model"], c["stage"], c["dtype"],
                                                                         c["world"], c["groups"], c["device"],
                                                                         c["note"]))
        return
    if not args.out:
        p.error("--out is required")
    names = select(args.cases, args.device)
    wrong = [n for n in names if CASES[n]["device"] != args.device]
    if wrong:
        raise SystemExit("case(s) %s are for the other --device" % ", ".join(wrong))
    os.makedirs(args.out, exist_ok=True)
    failed = []
    command = " ".join(shlex.quote(a) for a in [os.path.relpath(SCRIPT)] + sys.argv[1:])
    for name in names:
        final = os.path.join(args.out, name)
        if os.path.exists(final) and not args.force:
            raise SystemExit("%s exists (--force replaces it)" % final)
        staging = final + ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        log = os.path.join(args.out, name + ".log")
        start = time.time()
        codes = launch([SCRIPT, "--rank-worker", name, staging], CASES[name]["world"], args.device, log,
                       args.timeout)
        if any(c != 0 for c in codes):
            failed.append(name)
            shutil.rmtree(staging, ignore_errors=True)  # the log stays beside it
            print("FAIL %s: exit codes %s; the end of %s:\n%s" % (name, codes, log, log_tail(log)), flush=True)
            continue
        # DeepSpeed copies its zero_to_fp32.py into the folder; it is DeepSpeed's code, not a fixture.
        recovery = os.path.join(staging, "zero_to_fp32.py")
        if os.path.exists(recovery):
            os.remove(recovery)
        expected_json = os.path.join(staging, "expected.json")
        with open(expected_json) as f:
            expected = json.load(f)
        expected["made_by"] = command
        expected["made_on"] = platform.platform()
        expected["made_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        write_json(expected_json, expected)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(staging, final)
        os.remove(log)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(final) for f in fs)
        print("OK %s: %d bytes in %.1f s" % (name, size, time.time() - start), flush=True)
    if failed:
        raise SystemExit("failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()
