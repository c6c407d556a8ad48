"""GPT-2 exactly as Hugging Face's GPT2LMHeadModel computes it (no dropout), in plain PyTorch over a
dict of tensors named as shardkit's (and Hugging Face's) state dict: the reference for the golden
numerics test and the PyTorch side of bench/train_vs_pytorch.py."""
import math

import torch
import torch.nn.functional as F


def gpt2_loss(p, inputs, targets, cfg):
    """Mean next-token cross-entropy, as GPT2LMHeadModel computes it (no dropout)."""
    L, H, C = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
    B, T = inputs.shape
    hs = C // H
    x = p["transformer.wte.weight"][inputs] + p["transformer.wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        h = f"transformer.h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], 1e-5)
        q, k, v = (a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]).split(C, dim=2)
        q, k, v = (t.view(B, T, H, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], 1e-5)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
    logits = x @ p["transformer.wte.weight"].T  # tied output projection
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def shapes(cfg):
    C, V, P = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    out = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (P, C)}
    for i in range(cfg["n_layer"]):
        h = f"transformer.h.{i}."
        out.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "attn.c_attn.weight": (C, 3 * C),
                    h + "attn.c_attn.bias": (3 * C,), h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                    h + "ln_2.weight": (C,), h + "ln_2.bias": (C,), h + "mlp.c_fc.weight": (C, 4 * C),
                    h + "mlp.c_fc.bias": (4 * C,), h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
    out.update({"transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)})
    return out
