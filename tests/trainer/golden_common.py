"""What the golden numerics tests of every model family share: the token file, running golden_dump and
`shardkit train`, the PyTorch side of the three training steps, and the comparisons.

A family's reference is a pair of functions over a dict of float tensors named as the tensor table:
loss(params, inputs, targets, cfg), the mean next-token cross-entropy, and shapes(cfg), the table."""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import torch

from torch_decay import adamw_groups
from torch_lion import Lion

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
    own fp32 computation shows the same spread (GPT-2's attention key bias, whose exact gradient is
    zero, is all noise). The check, per tensor and norm-wise (|ours - ref| / |ref|): within 1e-5, or no
    more than 3x PyTorch fp32's own deviation from the float64 computation."""
    ours, ref, torch32 = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (ours, ref, torch32))
    scale = max(np.linalg.norm(ref), 1e-30)
    err = np.linalg.norm(ours - ref) / scale
    err32 = np.linalg.norm(torch32 - ref) / scale
    ok = err <= max(RTOL, 3 * err32)
    if not ok:
        failures.append(name)
    print(f"{'ok  ' if ok else 'FAIL'} {name}: relative {err:.3e} (PyTorch fp32: {err32:.3e})")


def write_tokens(folder):
    """Four windows of 64 tokens (+1) of varied byte-level text: (the tokens, the token file)."""
    rng = np.random.default_rng(7)
    text = np.concatenate([rng.integers(32, 127, 200), np.frombuffer(b"the quick brown fox jumps over it " * 2, np.uint8)])
    tokens = text[: 4 * 64 + 1].astype("<u2")
    path = os.path.join(folder, "tokens.bin")
    tokens.tofile(path)
    return tokens, path


def load_raw(folder, table):
    """The dump's tensors; the files must be exactly the table's."""
    found = sorted(f[:-len(".f32")] for f in os.listdir(folder) if f.endswith(".f32"))
    if found != sorted(table):
        sys.exit(f"{folder}: tensors {found}, expected {sorted(table)}")
    out = {}
    for n, s in table.items():
        values = np.fromfile(os.path.join(folder, n + ".f32"), dtype="<f4")
        if values.size != np.prod(s):
            sys.exit(f"{folder}: {n} has {values.size} values, expected shape {s}")
        out[n] = values.reshape(s)
    return out


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


def check_dump(dump_tool, model, tokens, data, out_dir, loss_fn, shapes_fn, label):
    """golden_dump's forward loss and every gradient against the reference, computed in float64 from
    the dump's fp32 initial weights. Returns (model JSON, initial weights, inputs, targets)."""
    subprocess.run([dump_tool, model, data, str(SEED), out_dir], check=True)
    with open(os.path.join(out_dir, "loss.json")) as f:
        info = json.load(f)
    cfg = info["model"]
    init = load_raw(os.path.join(out_dir, "init"), shapes_fn(cfg))
    T = info["seq_len"]
    windows = torch.tensor(tokens.astype(np.int64))
    inputs = torch.stack([windows[i * T:(i + 1) * T] for i in range(info["batch"])])
    targets = torch.stack([windows[i * T + 1:(i + 1) * T + 1] for i in range(info["batch"])])

    params = {n: torch.tensor(v, dtype=torch.float64, requires_grad=True) for n, v in init.items()}
    loss = loss_fn(params, inputs, targets, cfg)
    loss.backward()
    close(f"[{label}] forward loss", info["loss"], loss.item())
    close(f"[{label}] forward-only loss", info["eval_loss"], loss.item())
    grads = load_raw(os.path.join(out_dir, "grad"), shapes_fn(cfg))
    for n in params:
        close(f"[{label}] grad {n}", grads[n], params[n].grad.numpy())
    return cfg, init, inputs, targets


# The optimizers of the training check: DeepSpeed's config section, the PyTorch optimizer of the same
# settings over the decay / no-decay groups, and the states a checkpoint holds besides "fp32".
OPTIMIZERS = {
    "AdamW": ({"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
              lambda params: torch.optim.AdamW(adamw_groups(params, 0.1), lr=1e-3, betas=(0.9, 0.95), eps=1e-8),
              ("exp_avg", "exp_avg_sq")),
    "Lion": ({"type": "Lion", "params": {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.1}},
             lambda params: Lion(adamw_groups(params, 0.1), lr=1e-4, betas=(0.9, 0.99)),
             ("exp_avg",)),
}


def check_training(shardkit, model, cfg, init, inputs, targets, data, tmp, loss_fn, label, optimizer="AdamW"):
    """Three steps of `shardkit train` (`optimizer` with weight decay on the matrices and embeddings,
    gradient clipping, gradient accumulation over 2 micro-batches of the 4 windows) against PyTorch's
    AdamW (or torch_lion.py's Lion) with the same two parameter groups (torch_decay.py) on the
    reference: the loss and gradient norm of each step element-wise, and the fp32 master weights and
    the optimizer's moments of the checkpoint written after step 3 as close_after_adam() explains."""
    section, make_optimizer, moments = OPTIMIZERS[optimizer]
    label = f"{label} {optimizer}"
    tmp = os.path.join(tmp, optimizer)
    os.makedirs(tmp)
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
              "optimizer": section, "steps_per_print": 1}
    cfg_path = os.path.join(tmp, "ds.json")
    with open(cfg_path, "w") as f:
        json.dump(config, f)
    metrics = os.path.join(tmp, "metrics.jsonl")
    run = os.path.join(tmp, "run")
    subprocess.run([shardkit, "train", "--config", cfg_path, "--model", model, "--data", data, "--steps", "3",
                    "--save-dir", run, "--metrics", metrics, "--seed", str(SEED), "--threads", "1", "--quiet"],
                   check=True)
    steps = [json.loads(l) for l in open(metrics) if "event" not in l]

    def train_torch(dtype):
        params = {n: torch.tensor(v, dtype=dtype, requires_grad=True) for n, v in init.items()}
        opt = make_optimizer(params.values())
        history = []
        for step in range(3):
            opt.zero_grad()
            # Two micro-batches of two windows, each loss divided by the accumulation steps (DeepSpeed).
            total = 0.0
            for mb in range(2):
                l = loss_fn(params, inputs[2 * mb:2 * mb + 2], targets[2 * mb:2 * mb + 2], cfg) / 2
                l.backward()
                total += l.item()
            norm = torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
            history.append((total, norm.item()))
            opt.step()
        return params, opt, history

    params, opt, history = train_torch(torch.float64)
    params32, opt32, _ = train_torch(torch.float32)
    for step, (total, norm) in enumerate(history):
        close(f"[{label}] step {step + 1} loss", steps[step]["loss"], total)
        close(f"[{label}] step {step + 1} grad norm", steps[step]["grad_norm"], norm)
    manifest, states = read_checkpoint(os.path.join(run, "step-00000003"))
    if manifest["states"] != ["fp32", *moments]:
        failures.append(f"[{label}] states")
        print(f"FAIL [{label}] the checkpoint holds the states {manifest['states']}, not fp32 and {moments}")
    for n, p in params.items():
        st, st32 = opt.state[p], opt32.state[params32[n]]
        close_after_adam(f"[{label}] master {n}", states["fp32"][n], p.detach().numpy(), params32[n].detach().numpy())
        for s in moments:
            close_after_adam(f"[{label}] {s} {n}", states[s][n], st[s].numpy(), st32[s].numpy())


def finish():
    if failures:
        print(f"{len(failures)} comparison(s) failed")
        sys.exit(1)
    print("golden numerics: all comparisons within tolerance")
