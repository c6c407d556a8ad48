#!/usr/bin/env python3
"""Hugging Face check of the safetensors export and import, for a machine with transformers installed
(the H200 machine), for every family: train each model briefly on CPU ranks, export fp32 and bf16
safetensors, load each with AutoModelForCausalLM.from_pretrained (GPT2LMHeadModel, LlamaForCausalLM)
and compare its mean next-token loss on the same windows with `shardkit eval` (fp32: 1e-5 relative
for GPT-2, 1e-4 for Llama, whose rotary tables transformers computes its own way; bf16: the weights
are rounded, so 1e-2). Also checks that a model saved by transformers' save_pretrained, imported into
shardkit and exported again gives back identical tensors (and bytes). Prints JSON.

Usage: scripts/hf_check.py --shardkit build/shardkit"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--shardkit", required=True)
ap.add_argument("--mpiexec", default="mpirun")
args = ap.parse_args()
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

# A tied Llama with grouped-query attention and the llama3 rope scaling over an original context of 16
# positions, so that all three of its frequency bands occur in a 64-token window.
LLAMA_TIED_SCALED = {"family": "llama", "name": "llama-tied-scaled", "num_hidden_layers": 2, "hidden_size": 128,
                     "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
                     "vocab_size": 256, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                     "tie_word_embeddings": True}


def sk(*argv, ranks=None, capture=False):
    cmd = ([args.mpiexec, "-n", str(ranks), "--oversubscribe"] if ranks else []) + [args.shardkit, *argv]
    r = subprocess.run(cmd, check=True, stdout=subprocess.PIPE if capture else subprocess.DEVNULL, text=True)
    return r.stdout


def transformers_loss(folder, tokens, windows):
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    T = model.config.max_position_embeddings
    x = torch.tensor(np.stack([tokens[k * T:(k + 1) * T] for k in range(windows)]))
    y = torch.tensor(np.stack([tokens[k * T + 1:(k + 1) * T + 1] for k in range(windows)]))
    with torch.no_grad():
        logits = model(x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), y.reshape(-1)).item()


def export_matches_eval(tmp, data, model, fp32_tol):
    run = os.path.join(tmp, "run-" + os.path.basename(model))
    sk("train", "--config", os.path.join(root, "samples/configs/tiny_zero2.json"), "--model", model, "--data", data,
       "--steps", "40", "--save-dir", run, "--quiet", ranks=2)
    windows = 16
    ours = json.loads(sk("eval", run, "--data", data, "--windows", str(windows), "--json", capture=True))
    tokens = np.fromfile(data, dtype="<u2").astype(np.int64)
    out = {}
    for dtype, tol in (("fp32", fp32_tol), ("bf16", 1e-2)):
        folder = os.path.join(tmp, "hf-" + os.path.basename(model) + "-" + dtype)
        sk("convert", "consolidate", run, "-o", folder, "--dtype", dtype, "--quiet")
        loss = transformers_loss(folder, tokens, windows)
        rel = abs(loss - ours["loss"]) / ours["loss"]
        out[dtype] = {"transformers_loss": loss, "shardkit_eval_loss": ours["loss"], "relative_difference": rel,
                      "ok": rel <= tol}
    return out


def round_trip(tmp, name, hf_model, dtype="fp32"):
    """save_pretrained -> convert import (3 ranks, stage 3) -> convert consolidate in the saved dtype: the
    same tensors, and the same file."""
    hf_dir = os.path.join(tmp, "saved-" + name)
    hf_model.save_pretrained(hf_dir)
    imported = os.path.join(tmp, "imported-" + name)
    exported = os.path.join(tmp, "exported-" + name)
    sk("convert", "import", hf_dir, "-o", imported, "--world-size", "3", "--stage", "3", "--quiet")
    sk("convert", "consolidate", imported, "-o", exported, "--dtype", dtype, "--quiet")
    a = load_file(os.path.join(hf_dir, "model.safetensors"))
    b = load_file(os.path.join(exported, "model.safetensors"))
    prefix = "transformer." if isinstance(hf_model, GPT2LMHeadModel) else ""
    tied = hf_model.config.tie_word_embeddings
    names = [k for k in a if not (tied and k == "lm_head.weight")]
    same = all(torch.equal(a[k], b[k if k.startswith(prefix) else prefix + k]) for k in names)
    same_bytes = (open(os.path.join(hf_dir, "model.safetensors"), "rb").read() ==
                  open(os.path.join(exported, "model.safetensors"), "rb").read())
    return {"tensors": len(names), "identical": same, "same_file_bytes": same_bytes}


result = {}
with tempfile.TemporaryDirectory() as tmp:
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        for name in ("README.md", "docs/FORMAT.md", "docs/ARCHITECTURE.md"):
            f.write(open(os.path.join(root, name)).read())
    data = os.path.join(tmp, "text.bin")
    sk("data", "encode", text, "-o", data)
    scaled = os.path.join(tmp, "llama-tied-scaled.json")
    with open(scaled, "w") as f:
        json.dump(LLAMA_TIED_SCALED, f)
    result["gpt2-tiny"] = export_matches_eval(tmp, data, "gpt2-tiny", 1e-5)
    result["llama-tiny"] = export_matches_eval(tmp, data, "llama-tiny", 1e-4)
    result["llama-tied-scaled"] = export_matches_eval(tmp, data, scaled, 1e-4)

    torch.manual_seed(0)
    result["round_trip"] = {
        "gpt2": round_trip(tmp, "gpt2", GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=256,
                                                                    n_positions=64))),
        "llama-untied": round_trip(tmp, "llama-untied", LlamaForCausalLM(LlamaConfig(
            hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-5))),
        "llama-tied-bf16": round_trip(tmp, "llama-tied-bf16", LlamaForCausalLM(LlamaConfig(
            hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
            vocab_size=300, max_position_embeddings=64, tie_word_embeddings=True)).to(torch.bfloat16), "bf16"),
    }
print(json.dumps(result, indent=2))
ok = all(r[d]["ok"] for m, r in result.items() if m != "round_trip" for d in r)
ok = ok and all(r["identical"] for r in result["round_trip"].values())
raise SystemExit(0 if ok else 1)
