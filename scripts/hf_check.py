#!/usr/bin/env python3
"""Hugging Face check of the safetensors export (issue 4), for a machine with transformers installed
(the H200 machine): train gpt2-tiny briefly on CPU ranks, export fp32 and bf16 safetensors, load each
with GPT2LMHeadModel.from_pretrained and compare its mean next-token loss on the same windows with
`shardkit eval` (fp32: 1e-5 relative; bf16: the weights are rounded, so 1e-2). Also checks that the
export of a Hugging Face model imported into shardkit gives back identical tensors. Prints JSON.

Usage: scripts/hf_check.py --shardkit build/shardkit"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

ap = argparse.ArgumentParser()
ap.add_argument("--shardkit", required=True)
ap.add_argument("--mpiexec", default="mpirun")
args = ap.parse_args()
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def sk(*argv, ranks=None, capture=False):
    cmd = ([args.mpiexec, "-n", str(ranks), "--oversubscribe"] if ranks else []) + [args.shardkit, *argv]
    r = subprocess.run(cmd, check=True, stdout=subprocess.PIPE if capture else subprocess.DEVNULL, text=True)
    return r.stdout


result = {}
with tempfile.TemporaryDirectory() as tmp:
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        for name in ("README.md", "docs/FORMAT.md", "docs/ARCHITECTURE.md"):
            f.write(open(os.path.join(root, name)).read())
    data = os.path.join(tmp, "text.bin")
    sk("data", "encode", text, "-o", data)
    run = os.path.join(tmp, "run")
    sk("train", "--config", os.path.join(root, "samples/configs/tiny_zero2.json"), "--model", "gpt2-tiny", "--data",
       data, "--steps", "40", "--save-dir", run, "--quiet", ranks=2)
    windows = 16
    ours = json.loads(sk("eval", run, "--data", data, "--windows", str(windows), "--json", capture=True))
    tokens = np.fromfile(data, dtype="<u2").astype(np.int64)
    for dtype, tol in (("fp32", 1e-5), ("bf16", 1e-2)):
        out = os.path.join(tmp, "hf-" + dtype)
        sk("convert", "consolidate", run, "-o", out, "--dtype", dtype, "--quiet")
        model = GPT2LMHeadModel.from_pretrained(out, torch_dtype=torch.float32).eval()
        T = model.config.n_positions
        x = torch.tensor(np.stack([tokens[k * T:(k + 1) * T] for k in range(windows)]))
        y = torch.tensor(np.stack([tokens[k * T + 1:(k + 1) * T + 1] for k in range(windows)]))
        with torch.no_grad():
            logits = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
        rel = abs(loss - ours["loss"]) / ours["loss"]
        result[dtype] = {"transformers_loss": loss, "shardkit_eval_loss": ours["loss"], "relative_difference": rel,
                         "ok": rel <= tol}

    # A Hugging Face model saved by transformers, imported and exported again: identical tensors.
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=256, n_positions=64)
    hf_dir = os.path.join(tmp, "hf-saved")
    GPT2LMHeadModel(cfg).save_pretrained(hf_dir)
    sk("convert", "import", hf_dir, "-o", os.path.join(tmp, "imported"), "--world-size", "3", "--stage", "3", "--quiet")
    sk("convert", "consolidate", os.path.join(tmp, "imported"), "-o", os.path.join(tmp, "re-exported"), "--quiet")
    a = load_file(os.path.join(hf_dir, "model.safetensors"))
    b = load_file(os.path.join(tmp, "re-exported", "model.safetensors"))
    same = all(torch.equal(a[k], b["transformer." + k if not k.startswith("transformer.") else k])
               for k in a if not k.startswith("lm_head"))
    result["import_export_round_trip"] = {"tensors": len(a), "identical": same,
                                          "same_file_bytes": open(os.path.join(hf_dir, "model.safetensors"), "rb").read()
                                          == open(os.path.join(tmp, "re-exported", "model.safetensors"), "rb").read()}
print(json.dumps(result, indent=2))
ok = result["fp32"]["ok"] and result["bf16"]["ok"] and result["import_export_round_trip"]["identical"]
raise SystemExit(0 if ok else 1)
