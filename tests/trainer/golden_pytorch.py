#!/usr/bin/python3
"""Golden numerics: shardkit's GPT-2 against a PyTorch computation of the same model (Hugging Face's
GPT2LMHeadModel math, written out here in plain torch), in float64 from the same fp32 weights.

Checks, to 1e-5 relative:
  1. the forward loss and every gradient of gpt2-tiny on a batch (golden_dump), element-wise
     (per tensor: max |ours - torch| <= 1e-5 * max |torch|);
  2. three training steps of `shardkit train` (AdamW with weight decay, gradient clipping, gradient
     accumulation over 2 micro-batches): the loss and gradient norm of each step element-wise, and
     the fp32 master weights and both Adam moments of the checkpoint written after step 3 norm-wise,
     as close_after_adam() explains."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2 import gpt2_loss, shapes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--dump", required=True)
ap.add_argument("--shardkit", required=True)
args = ap.parse_args()

RTOL = 1e-5
SEED = 42
failures = []


def close(name, ours, ref, rtol=RTOL):
    """Element-wise: max |ours - ref| <= rtol * max |ref|."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(np.abs(ref).max(initial=0.0), 1e-30)
    err = np.abs(ours - ref).max(initial=0.0)
    ok = err <= rtol * scale
    if not ok:
        failures.append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: max|diff| {err:.3e}, relative {err / scale:.3e}")


def close_after_adam(name, ours, ref, torch32):
    """After optimizer steps, fp32 arithmetic itself limits agreement with an exact computation: Adam
    divides each gradient by its own running RMS, so gradients that cancel to nearly zero turn fp32
    rounding noise into updates of order lr, which then move every later gradient a little. PyTorch's
    own fp32 computation shows the same spread (the attention key bias, whose exact gradient is zero,
    is all noise). The check, per tensor and norm-wise (|ours - ref| / |ref|): within 1e-5, or no more
    than 3x PyTorch fp32's own deviation from the float64 computation."""
    ours, ref, torch32 = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (ours, ref, torch32))
    scale = max(np.linalg.norm(ref), 1e-30)
    err = np.linalg.norm(ours - ref) / scale
    err32 = np.linalg.norm(torch32 - ref) / scale
    ok = err <= max(RTOL, 3 * err32)
    if not ok:
        failures.append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: relative {err:.3e} (PyTorch fp32: {err32:.3e})")


def load_raw(folder, cfg):
    return {n: np.fromfile(os.path.join(folder, n + ".f32"), dtype="<f4").reshape(s) for n, s in shapes(cfg).items()}


def read_checkpoint(step_dir):
    """Full tensors of every state, from the shards alone (docs/FORMAT.md)."""
    with open(os.path.join(step_dir, "manifest.json")) as f:
        m = json.load(f)
    out = {s: {} for s in m["states"]}
    for t in m["tensors"]:
        for s in m["states"]:
            out[s][t["name"]] = np.zeros(int(np.prod(t["shape"])), np.float32)
    names = [t["name"] for t in m["tensors"]]
    for shard in m["shards"]:
        with h5py.File(os.path.join(step_dir, shard["file"]), "r") as f:
            for s in m["states"]:
                flat = f["state"][s][...]
                for tensor, off, length, flat_off in f["fragments"][...]:
                    out[s][names[tensor]][off:off + length] = flat[flat_off:flat_off + length]
    return m, out


with tempfile.TemporaryDirectory() as tmp:
    # Four windows of 64 tokens (+1) of varied byte-level text.
    rng = np.random.default_rng(7)
    text = np.concatenate([rng.integers(32, 127, 200), np.frombuffer(b"the quick brown fox jumps over it " * 2, np.uint8)])
    tokens = text[: 4 * 64 + 1].astype("<u2")
    data = os.path.join(tmp, "tokens.bin")
    tokens.tofile(data)
    dump = os.path.join(tmp, "dump")
    subprocess.run([args.dump, "gpt2-tiny", data, str(SEED), dump], check=True)
    with open(os.path.join(dump, "loss.json")) as f:
        info = json.load(f)
    cfg = info["model"]
    init = load_raw(os.path.join(dump, "init"), cfg)
    T = info["seq_len"]
    windows = torch.tensor(tokens.astype(np.int64))
    inputs = torch.stack([windows[i * T:(i + 1) * T] for i in range(info["batch"])])
    targets = torch.stack([windows[i * T + 1:(i + 1) * T + 1] for i in range(info["batch"])])

    # 1. Forward loss and every gradient.
    params = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in init.items()}
    loss = gpt2_loss(params, inputs, targets, cfg)
    loss.backward()
    close("forward loss", info["loss"], loss.item())
    close("forward-only loss", info["eval_loss"], loss.item())
    grads = load_raw(os.path.join(dump, "grad"), cfg)
    for n in params:
        close("grad " + n, grads[n], params[n].grad.numpy())

    # 2. Three steps of `shardkit train`, then the checkpoint's states.
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                         "weight_decay": 0.1}},
              "steps_per_print": 1}
    cfg_path = os.path.join(tmp, "ds.json")
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    metrics = os.path.join(tmp, "metrics.jsonl")
    run = os.path.join(tmp, "run")
    subprocess.run([args.shardkit, "train", "--config", cfg_path, "--model", "gpt2-tiny", "--data", data,
                    "--steps", "3", "--save-dir", run, "--metrics", metrics, "--seed", str(SEED), "--threads", "1",
                    "--quiet"], check=True)
    steps = [json.loads(l) for l in open(metrics) if "event" not in l]

    def train_torch(dtype):
        params = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in init.items()}
        opt = torch.optim.AdamW(params.values(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        history = []
        for step in range(3):
            opt.zero_grad()
            # Two micro-batches of two windows, each loss divided by the accumulation steps (DeepSpeed).
            total = 0.0
            for mb in range(2):
                l = gpt2_loss(params, inputs[2 * mb:2 * mb + 2], targets[2 * mb:2 * mb + 2], cfg) / 2
                l.backward()
                total += l.item()
            norm = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            history.append((total, norm.item()))
            opt.step()
        return params, opt, history

    params, opt, history = train_torch(torch.float64)
    params32, opt32, _ = train_torch(torch.float32)
    for step, (total, norm) in enumerate(history):
        close(f"step {step + 1} loss", steps[step]["loss"], total)
        close(f"step {step + 1} grad norm", steps[step]["grad_norm"], norm)
    _, states = read_checkpoint(os.path.join(run, "step-00000003"))
    for n, p in params.items():
        st, st32 = opt.state[p], opt32.state[params32[n]]
        close_after_adam("master " + n, states["fp32"][n], p.detach().numpy(), params32[n].detach().numpy())
        for s in ("exp_avg", "exp_avg_sq"):
            close_after_adam(f"{s} {n}", states[s][n], st[s].numpy(), st32[s].numpy())

if failures:
    print(f"{len(failures)} comparison(s) failed")
    sys.exit(1)
print("golden numerics: all comparisons within tolerance")
