#!/usr/bin/python3
"""Golden numerics: shardkit's Llama against a PyTorch computation of the same model (Hugging Face's
LlamaForCausalLM math, written out in torch_llama.py), in float64 from the same fp32 weights.

First, properties of the reference itself (no shardkit involved): causal masking, the tied head, the
grouping of query heads onto key/value heads, the llama3 rescaling. Then, for four model files that
between them cover grouped-query, multi-query and multi-head attention, tied and untied heads, a
head_dim other than hidden_size / num_attention_heads and llama3 rope scaling:
  1. golden_dump's forward loss and every gradient, element-wise to 1e-5 relative
     (per tensor: max |ours - torch| <= 1e-5 * max |torch|), and the model it reports being the file's;
  2. for one of them, three training steps of `shardkit train` and the checkpoint after them, as in
     the GPT-2 test (golden_common.check_training)."""
import argparse
import json
import math
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as gc  # noqa: E402
from torch_llama import llama_logits, llama_loss, rope_cos_sin, rope_inv_freq, rotate, shapes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--dump", required=True)
ap.add_argument("--shardkit", required=True)
args = ap.parse_args()


def llama(name, hidden, intermediate, heads, kv_heads, head_dim, eps, tied, theta=10000.0, scaling=None):
    return {"family": "llama", "name": name, "num_hidden_layers": 2, "hidden_size": hidden,
            "intermediate_size": intermediate, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "vocab_size": 256, "max_position_embeddings": 64, "rms_norm_eps": eps,
            "rope_theta": theta, "rope_scaling": scaling, "tie_word_embeddings": tied}


# Llama 3's band edges (low_freq_factor 1, high_freq_factor 4) with an original context of 48 (below
# max_position_embeddings, as Hugging Face expects) instead of 8192: head_dim 32 at theta 500000 has
# wavelengths 6.3 | 14.3, 32.4 | 73.6, 167, ..., so one frequency is kept, two are interpolated and
# thirteen stretched, none near an edge (12 and 48).
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 48}
CONFIGS = [
    llama("gqa", 128, 320, 4, 2, 32, 1e-5, tied=False),
    llama("tied", 64, 176, 4, 2, 16, 1e-6, tied=True),
    llama("mha", 64, 160, 2, 2, 48, 1e-5, tied=False),  # head_dim 48, not 64 / 2
    llama("llama3", 128, 256, 4, 1, 32, 1e-5, tied=False, theta=500000.0, scaling=LLAMA3),
]
TRAINED = "gqa"


def random_params(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    return {n: (1.0 if len(s) == 1 else 0.0) + 0.1 * torch.randn(s, generator=g, dtype=torch.float64)
            for n, s in shapes(cfg).items()}


def require(ok, what):
    if not ok:
        sys.exit("reference self-check failed: " + what)


def self_checks():
    """Properties the reference must have, each independent of how it is written."""
    gqa = CONFIGS[0]
    p = random_params(gqa, 1)
    x = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(2))
    logits = llama_logits(p, x, gqa)

    # Causal: a token changes no earlier position's logits, and does change its own.
    y = x.clone()
    y[:, 40] = (y[:, 40] + 1) % 256
    changed = llama_logits(p, y, gqa)
    require(torch.equal(changed[:, :40], logits[:, :40]), "a later token changed earlier logits")
    require(not torch.allclose(changed[:, 40], logits[:, 40]), "a token did not change its own logits")

    # Tied: the untied model with lm_head = embed_tokens; untied, lm_head is the output projection.
    tied = dict(gqa, tie_word_embeddings=True)
    pt = {n: v for n, v in p.items() if n != "lm_head.weight"}
    require(torch.allclose(llama_logits(pt, x, tied), llama_logits(dict(p, **{"lm_head.weight": pt[
        "model.embed_tokens.weight"]}), x, gqa), rtol=0, atol=1e-12), "tied head differs from lm_head = embed")
    require(torch.allclose(llama_logits(dict(p, **{"lm_head.weight": 2 * p["lm_head.weight"]}), x, gqa), 2 * logits,
                           rtol=1e-12, atol=0), "the untied head is not lm_head")

    # Grouping: query heads 2g and 2g+1 read key/value head g, so the multi-head model whose key and
    # value heads are those copies computes the same function.
    mha = dict(gqa, num_key_value_heads=gqa["num_attention_heads"])
    rep = gqa["num_attention_heads"] // gqa["num_key_value_heads"]
    pm = dict(p)
    for n in p:
        if n.endswith(("k_proj.weight", "v_proj.weight")):
            pm[n] = p[n].view(gqa["num_key_value_heads"], gqa["head_dim"], -1).repeat_interleave(rep, dim=0).reshape(
                -1, gqa["hidden_size"])
    require(torch.allclose(llama_logits(pm, x, mha), logits, rtol=0, atol=1e-12), "GQA differs from repeated MHA")

    # Rotary: channel i turns towards channel i + D/2 (rotate_half's direction), and attention scores
    # depend on positions only through their difference.
    D = gqa["head_dim"]
    cos, sin = rope_cos_sin(gqa, 64, torch.float64)
    e0 = torch.zeros(D, dtype=torch.float64)
    e0[0] = 1
    turned = rotate(e0, cos[1], sin[1])
    expected = torch.zeros(D, dtype=torch.float64)
    expected[0], expected[D // 2] = math.cos(1), math.sin(1)
    require(torch.allclose(turned, expected, rtol=0, atol=1e-15), "rotary direction is not rotate_half's")
    q, k = torch.randn(2, 1, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    scores = rotate(q, cos, sin) @ rotate(k, cos, sin).T
    require(torch.allclose(scores[5:, 5:], scores[:-5, :-5], rtol=0, atol=1e-12),
            "rotary scores depend on absolute positions")

    # llama3: factor 1 changes nothing (beyond fp32 rounding); the configured one has all three bands.
    plain = rope_inv_freq(dict(gqa, rope_theta=500000.0))
    unit = rope_inv_freq(dict(gqa, rope_theta=500000.0, rope_scaling=dict(LLAMA3, factor=1.0)))
    require(torch.allclose(unit, plain, rtol=1e-6, atol=0), "llama3 scaling with factor 1 changes frequencies")
    scaled = rope_inv_freq(CONFIGS[3])
    wavelen = 2 * math.pi / plain
    orig = LLAMA3["original_max_position_embeddings"]
    kept = wavelen < orig / LLAMA3["high_freq_factor"]
    stretched = wavelen > orig / LLAMA3["low_freq_factor"]
    between = ~kept & ~stretched
    require(kept.any() and stretched.any() and between.any(), "the llama3 configuration misses a band")
    require(torch.equal(scaled[kept], plain[kept]), "llama3 changed a kept frequency")
    require(torch.allclose(scaled[stretched], plain[stretched] / LLAMA3["factor"], rtol=1e-6, atol=0),
            "llama3 did not divide a low frequency by factor")
    require(bool(((scaled[between] < plain[between]) & (scaled[between] > plain[between] / LLAMA3["factor"])).all()),
            "llama3 did not interpolate a middle frequency")


self_checks()
with tempfile.TemporaryDirectory() as tmp:
    tokens, data = gc.write_tokens(tmp)
    for cfg in CONFIGS:
        label = cfg["name"]
        model = os.path.join(tmp, label + ".json")
        with open(model, "w") as f:
            json.dump(cfg, f)
        reported, init, inputs, targets = gc.check_dump(args.dump, model, tokens, data, os.path.join(tmp, label),
                                                        llama_loss, shapes, label)
        # The dump computed the model it reports; that must be the file's.
        same = all(reported.get(k) == v for k, v in cfg.items() if k != "name")
        if not same:
            gc.failures.append(f"[{label}] model")
        print(f"{'ok  ' if same else 'FAIL'} [{label}] model reported: {json.dumps(reported)}")
        if label == TRAINED:
            gc.check_training(args.shardkit, model, cfg, init, inputs, targets, data, tmp, llama_loss,
                              label)
gc.finish()
