#!/usr/bin/env python3
"""Real PyTorch takes back what shardkit made of its Distributed Checkpoints, and DeepSpeed and
transformers take what shardkit made of them, every value bit for bit.

For each model (a GPT-2 with Hugging Face's names, and a network of no known family):
  (a) source: FSDP2 (`fully_shard`) + AdamW at 2 CPU ranks (Gloo) trains 3 steps and saves with
      `dcp.save` (tests/convert/write_dcp_fixtures.py), with the full weights and moments it held;
  (b) shardkit: `convert export-dcp SRC -o OUT --world-size 3`;
  (c) PyTorch at 3 ranks builds the model afresh (other weights, other hyperparameters), calls
      get_state_dict, `dcp.load` of OUT and set_state_dict: every parameter, both moments and the step
      must equal the source's bit for bit and the groups' hyperparameters the source's; it then trains
      one more step, and so does a 3-rank load of PyTorch's own checkpoint: both must end with the same
      loss and the same state, bit for bit;
  (d) shardkit: `convert export-deepspeed SRC -o DS --world-size 1 --stage 2`; DeepSpeed at 1 rank
      load_checkpoint(DS): its fp32 master weights and moments equal the source's bit for bit;
  (e) GPT-2 only: `convert consolidate SRC -o HF --model model.json`; transformers'
      GPT2LMHeadModel.from_pretrained(HF) holds the source's weights bit for bit.

Prints one `RESULT {json}` line per check; exits 1 when any fails. Needs PyTorch 2.6+ (FSDP2 on CPU);
(d) needs DeepSpeed (skipped, with a RESULT saying so, when it cannot be imported), (e) transformers:
  python3 tests/interop/dcp_roundtrip.py --shardkit build/shardkit [--work DIR] [--models gpt2,net]
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "convert"))
import write_deepspeed_fixtures as fx  # noqa: E402 (models, batches, DeepSpeed engine, launcher)
import write_dcp_fixtures as dcpfx  # noqa: E402 (the FSDP2 source run)
from deepspeed_roundtrip import Results  # noqa: E402 (one RESULT line per check, the failures counted)

SCRIPT = os.path.abspath(__file__)
CASES = {"gpt2": "gpt2-w2", "net": "net-w2"}
LOAD_WORLD = 3


# ---------------------------------------------------------------------------------------------------
# In the ranks.

def load_rank(model_name, folder, expected_dir, out_json):
    """FSDP2 + AdamW at this world size, loaded from `folder`, then one more step."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(99)  # other initial weights: only the load can make them equal
    model = fx.build_model(model_name)
    named = list(model.named_parameters())
    fully_shard(model, mesh=mesh)
    # Other hyperparameters too: the checkpoint's groups must replace them.
    groups = [{"params": [p for n, p in model.named_parameters() if not fx.no_decay(n)], "weight_decay": 0.7},
              {"params": [p for n, p in model.named_parameters() if fx.no_decay(n)], "weight_decay": 0.6}]
    optimizer = torch.optim.AdamW(groups, lr=0.5, betas=(0.1, 0.2), eps=1e-2)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    loaded_model, loaded_optim = get_state_dict(model, optimizer, options=full)
    # The step tensors of the full state dict are the optimizer's own: read them before it steps on.
    steps = sorted({int(s["step"]) for s in loaded_optim["state"].values()}) if rank == 0 else []
    hyper = [{k: (list(g[k]) if k == "betas" else g[k]) for k in ("lr", "betas", "eps", "weight_decay")}
             for g in optimizer.param_groups]
    # One more step on the source's next global batch, this rank's rows.
    inputs, targets = fx.global_batch(model_name, dcpfx.STEPS, dcpfx.BATCH, "cpu")
    rows = dcpfx.BATCH // world
    mine = slice(rank * rows, (rank + 1) * rows)
    loss = dcpfx.loss_of(model_name, model, inputs[mine], targets[mine])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses = torch.tensor([float(loss)])
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, losses)
    after_model, after_optim = get_state_dict(model, optimizer, options=full)
    if rank == 0:
        want = fx.read_safetensors(os.path.join(expected_dir, "expected.safetensors"))
        with open(os.path.join(expected_dir, "expected.json")) as f:
            expected = json.load(f)
        got = {}
        for n, _ in named:
            got["fp32/" + n] = loaded_model[n]
            got["exp_avg/" + n] = loaded_optim["state"][n]["exp_avg"]
            got["exp_avg_sq/" + n] = loaded_optim["state"][n]["exp_avg_sq"]
        differ = [k for k, v in want.items() if k not in got or got[k].shape != v.shape
                  or not torch.equal(got[k].float().view(torch.int32), v.view(torch.int32))]
        digest = hashlib.sha256()
        for n, _ in named:
            for t in (after_model[n], after_optim["state"][n]["exp_avg"], after_optim["state"][n]["exp_avg_sq"]):
                digest.update(t.float().contiguous().numpy().tobytes())
        with open(out_json, "w") as f:
            json.dump({"compared": len(want), "differ": differ, "steps": steps, "want_step": expected["adam_step"],
                       "hyper": hyper, "losses": [float(x) for x in gathered],
                       "after": digest.hexdigest()}, f)
    dist.barrier()
    dist.destroy_process_group()


def deepspeed_rank(model_name, folder, expected_dir, out_json):
    """DeepSpeed at 1 rank, ZeRO-2, loading `folder`: its master weights and moments."""
    import torch
    case = fx._case(model_name, 2, "fp32", 1, groups=2, steps=dcpfx.STEPS, batch=dcpfx.BATCH)
    fx.init_distributed("cpu")
    engine, named, _ = fx.make_engine(case, seed=99)
    engine.load_checkpoint(folder)
    state = fx.gather_state(engine, named)
    want = fx.read_safetensors(os.path.join(expected_dir, "expected.safetensors"))
    differ = [k for k, v in want.items() if k not in state or state[k].shape != v.shape
              or not torch.equal(state[k].view(torch.int32), v.view(torch.int32))]
    with open(out_json, "w") as f:
        json.dump({"compared": len(want), "differ": differ, "counters": fx.counters(engine)}, f)


# ---------------------------------------------------------------------------------------------------
# The driver.

def run(results, argv, log, **fields):
    with open(log, "w") as out:
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode
    return results.report(rc == 0, check="run", command=" ".join(argv), rc=rc,
                          output=None if rc == 0 else fx.log_tail(log, 5), **fields)


def ranks(results, argv, world, log, **fields):
    codes = fx.launch([SCRIPT] + argv, world, "cpu", log, 600)
    ok = all(c == 0 for c in codes)
    return results.report(ok, check="ranks", argv=argv[0], codes=codes, log=None if ok else fx.log_tail(log, 8),
                          **fields)


def roundtrip(args, results, model):
    work = os.path.join(args.work, model)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    case = CASES[model]
    source = os.path.join(work, case)
    if not run(results, [sys.executable, dcpfx.SCRIPT, "--out", work, "--cases", case],
               os.path.join(work, "source.log"), model=model, step="FSDP2 saves at 2 ranks"):
        return
    src_dcp = os.path.join(source, "dcp")
    export = os.path.join(work, "export-w3")
    if run(results, [args.shardkit, "convert", "export-dcp", src_dcp, "-o", export, "--world-size", "3"],
           os.path.join(work, "export.log"), model=model):
        outs = {}
        for name, folder in (("pytorch-own", src_dcp), ("shardkit-export", export)):
            out = os.path.join(work, "load-%s.json" % name)
            if ranks(results, ["--load-rank", model, folder, source, out], LOAD_WORLD,
                     os.path.join(work, "load-%s.log" % name), model=model, loads=name):
                with open(out) as f:
                    outs[name] = json.load(f)
        if "shardkit-export" in outs:
            t = outs["shardkit-export"]
            where = dict(model=model, loaded_at=LOAD_WORLD)
            results.report(not t["differ"], check="dcp.load: weights and moments bit for bit", compared=t["compared"],
                           differ=t["differ"][:8], **where)
            results.report(t["steps"] == [t["want_step"]], check="dcp.load: AdamW step", got=t["steps"],
                           want=t["want_step"], **where)
            want_hyper = [{"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": wd} for wd in (0.1, 0.0)]
            results.report(t["hyper"] == want_hyper, check="dcp.load: group hyperparameters", got=t["hyper"],
                           want=want_hyper, **where)
            if "pytorch-own" in outs:
                o = outs["pytorch-own"]
                results.report(t["losses"] == o["losses"] and t["after"] == o["after"],
                               check="next step same as from PyTorch's own checkpoint", losses=t["losses"],
                               want=o["losses"], **where)
    ds = os.path.join(work, "ds-w1s2")
    why = deepspeed_importable()
    if why:
        results.report(True, check="DeepSpeed load", skipped="deepspeed cannot be imported here: " + why, model=model)
    elif run(results, [args.shardkit, "convert", "export-deepspeed", src_dcp, "-o", ds, "--world-size", "1",
                       "--stage", "2", "--dtype", "fp32"], os.path.join(work, "export-ds.log"), model=model):
        out = os.path.join(work, "deepspeed.json")
        if ranks(results, ["--deepspeed-rank", model, ds, source, out], 1, os.path.join(work, "deepspeed.log"),
                 model=model):
            with open(out) as f:
                t = json.load(f)
            results.report(not t["differ"], check="DeepSpeed load_checkpoint: state bit for bit",
                           compared=t["compared"], differ=t["differ"][:8], counters=t["counters"], model=model)
    if model == "gpt2":
        model_file = os.path.join(work, "model.json")
        with open(model_file, "w") as f:
            json.dump(fx.MODEL_FILES[model], f)
        hf = os.path.join(work, "hf")
        if run(results, [args.shardkit, "convert", "consolidate", src_dcp, "-o", hf, "--model", model_file],
               os.path.join(work, "consolidate.log"), model=model):
            import torch
            from transformers import GPT2LMHeadModel
            m = GPT2LMHeadModel.from_pretrained(hf, torch_dtype=torch.float32)
            sd = m.state_dict()
            want = fx.read_safetensors(os.path.join(source, "expected.safetensors"))
            names = [k[len("fp32/"):] for k in want if k.startswith("fp32/")]
            differ = [n for n in names if n not in sd or not torch.equal(sd[n].view(torch.int32),
                                                                          want["fp32/" + n].view(torch.int32))]
            results.report(not differ, check="transformers from_pretrained: weights bit for bit",
                           compared=len(names), differ=differ[:8], model=model)


def deepspeed_importable():
    """None when DeepSpeed imports, else why not."""
    try:
        import deepspeed  # noqa: F401
        return None
    except Exception as e:  # noqa: BLE001 (any failure to import means: not here)
        return "%s: %s" % (type(e).__name__, e)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shardkit")
    p.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    p.add_argument("--models", default=",".join(CASES))
    p.add_argument("--load-rank", nargs=4, help=argparse.SUPPRESS)
    p.add_argument("--deepspeed-rank", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.load_rank:
        return load_rank(*args.load_rank)
    if args.deepspeed_rank:
        return deepspeed_rank(*args.deepspeed_rank)
    if not args.shardkit:
        p.error("--shardkit is required")
    args.shardkit = os.path.abspath(args.shardkit)
    temporary = args.work is None
    args.work = args.work or tempfile.mkdtemp(prefix="dcp-roundtrip-")
    results = Results()
    try:
        for model in args.models.split(","):
            roundtrip(args, results, model)
    finally:
        if temporary:
            shutil.rmtree(args.work, ignore_errors=True)
    print("%d check(s) failed" % results.failed if results.failed else "all checks passed", flush=True)
    return 1 if results.failed else 0


if __name__ == "__main__":
    sys.exit(main())
