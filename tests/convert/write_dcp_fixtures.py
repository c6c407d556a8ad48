#!/usr/bin/env python3
"""Trains tiny models with PyTorch FSDP2 (`fully_shard`) and saves them with torch.distributed.checkpoint
(DCP), each with the exact values the ranks held when they saved: fixtures for shardkit's DCP reader.

Per case the ranks (processes of this script on 127.0.0.1, Gloo, CPU) build a model of
write_deepspeed_fixtures.py (GPT-2's Hugging Face names, or a network no model family knows), shard it
with `fully_shard` over a 1-D mesh, train a few steps of `torch.optim.AdamW` (Hugging Face Trainer's
two parameter groups) on batches that depend on the step only, and save. OUT/<case>/ then holds:

  dcp/                 `dcp.save` of the state dict in the case's key layout:
                         get_state_dict:  {"model": ..., "optim": ...} as torch.distributed.checkpoint.
                                          state_dict.get_state_dict returns them (optimizer state keyed
                                          by parameter name)
                         torchtitan:      {"model": ..., "optimizer": ..., "train_state": {"step": N}}
                                          with the model's entries at the top level, as torchtitan's
                                          checkpointer flattens them
  expected.safetensors fp32/<name>, exp_avg/<name>, exp_avg_sq/<name>: F32, full shapes (from
                       get_state_dict with full_state_dict=True)
  expected.json        step, parameters (name, shape, group), the case, versions, the command

Needs PyTorch 2.6 or later (fully_shard, DTensor on CPU with Gloo):
  python3 tests/convert/write_dcp_fixtures.py --out DIR [--cases all|NAME,...] [--list]
"""

import argparse
import collections
import datetime
import json
import os
import platform
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import write_deepspeed_fixtures as ds_fixtures  # noqa: E402  (the models, batches and file helpers)

SCRIPT = os.path.abspath(__file__)
STEPS, BATCH = 3, 6

CASES = collections.OrderedDict([
    ("gpt2-w2", dict(model="gpt2", world=2, layout="get_state_dict")),
    ("gpt2-w3-titan", dict(model="gpt2", world=3, layout="torchtitan")),
    ("net-w2", dict(model="net", world=2, layout="get_state_dict")),
])


def loss_of(model_name, module, inputs, targets):
    import torch.nn.functional as F
    if model_name == "net":
        return F.cross_entropy(module(inputs).float(), targets)
    logits = module(inputs).float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def rank_worker(name, folder):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    case = CASES[name]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == case["world"], (world, case)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(1234)
    model = ds_fixtures.build_model(case["model"])
    named = list(model.named_parameters())
    fully_shard(model, mesh=mesh)
    groups = [{"params": [p for n, p in model.named_parameters() if not ds_fixtures.no_decay(n)], "weight_decay": 0.1},
              {"params": [p for n, p in model.named_parameters() if ds_fixtures.no_decay(n)], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    rows = BATCH // world
    losses = []
    for step in range(STEPS):
        inputs, targets = ds_fixtures.global_batch(case["model"], step, BATCH, "cpu")
        mine = slice(rank * rows, (rank + 1) * rows)
        loss = loss_of(case["model"], model, inputs[mine], targets[mine])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    model_sd, optim_sd = get_state_dict(model, optimizer)
    if case["layout"] == "torchtitan":
        state = dict(model_sd)
        state.update({"optimizer": optim_sd, "train_state": {"step": STEPS}})
    else:
        state = {"model": model_sd, "optim": optim_sd}
    dcp.save(state, checkpoint_id=os.path.join(folder, "dcp"))
    full_model, full_optim = get_state_dict(model, optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        expected = collections.OrderedDict()
        for n, _ in named:
            expected["fp32/" + n] = full_model[n]
        for key in ("exp_avg", "exp_avg_sq"):
            for n, _ in named:
                expected[key + "/" + n] = full_optim["state"][n][key]
        ds_fixtures.write_safetensors(os.path.join(folder, "expected.safetensors"), expected)
        steps = sorted({int(s["step"]) for s in full_optim["state"].values()})
        ds_fixtures.write_json(os.path.join(folder, "expected.json"), collections.OrderedDict([
            ("case", name), ("model", case["model"]), ("world_size", world), ("layout", case["layout"]),
            ("adam_step", steps[0]), ("losses", losses),
            ("params", [{"name": n, "shape": list(p.shape), "group": int(ds_fixtures.no_decay(n))} for n, p in named]),
            ("torch", torch.__version__), ("python", platform.python_version()),
            ("made", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
            ("command", "python3 tests/convert/write_dcp_fixtures.py " + " ".join(map(shlex.quote, sys.argv[1:])))]))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--cases", default="all")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--rank-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker:
        return rank_worker(*args.rank_worker)
    if args.list:
        for name, case in CASES.items():
            print(name, json.dumps(case))
        return 0
    if not args.out:
        ap.error("--out is required")
    names = list(CASES) if args.cases == "all" else args.cases.split(",")
    failed = 0
    for name in names:
        folder = os.path.join(args.out, name)
        os.makedirs(folder, exist_ok=True)
        log = os.path.join(folder, "train.log")
        codes = ds_fixtures.launch([SCRIPT, "--rank-worker", name, folder], CASES[name]["world"], "cpu", log, 300)
        ok = all(c == 0 for c in codes)
        print(("OK " if ok else "FAILED ") + name + ("" if ok else "\n" + ds_fixtures.log_tail(log)), flush=True)
        if ok:
            os.remove(log)
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
