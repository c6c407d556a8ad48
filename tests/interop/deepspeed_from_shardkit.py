#!/usr/bin/env python3
"""Real DeepSpeed resumes a run that shardkit trained: `shardkit train` (CPU, the GPT-2 model of
tests/data/deepspeed, AdamW from a DeepSpeed config) saves a checkpoint, `shardkit convert
export-deepspeed` writes it for 2 ranks at ZeRO-2, and DeepSpeed's load_checkpoint at 2 ranks must hold
every fp32 master weight and both Adam moments bit for bit as shardkit's own export of them
(`convert consolidate --with-optimizer`), the step counters, and the two parameter groups with the
config's hyperparameters (Hugging Face Trainer's split, which write_deepspeed_fixtures.py's engine
makes too).

`--optimizer lion` trains with Lion instead (DeepSpeed's "Lion" type) and has DeepSpeed load it into a
Lion with FusedLion's states (write_deepspeed_fixtures.py's): the master weights and exp_avg bit for bit,
and Lion's group settings (lr, betas, weight_decay; no Adam settings).

Run by hand where DeepSpeed runs (tests/data/deepspeed/README.md); prints `RESULT {json}` lines, exits
1 on a failure and 77 when DeepSpeed cannot be imported:
  DS_ACCELERATOR=cpu PYTHONPATH=<deepspeed site> /usr/bin/python3 tests/interop/deepspeed_from_shardkit.py \\
      --shardkit build/shardkit [--work DIR] [--optimizer lion]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "convert"))
import write_deepspeed_fixtures as fx  # noqa: E402

STEPS, WORLD, STAGE = 3, 2, 2
CONFIG = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
          "gradient_clipping": 1.0, "zero_optimization": {"stage": 1},
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                     "weight_decay": 0.1}}}
LION = {"type": "Lion", "params": {"lr": 3e-4, "betas": [0.9, 0.99], "weight_decay": 0.1}}


def target_rank(work, optimizer):
    import torch
    import torch.distributed as dist
    case = fx._case("gpt2", STAGE, "fp32", WORLD, groups=2, steps=STEPS, batch=6, optimizer=optimizer)
    fx.init_distributed("cpu")
    engine, named, _ = fx.make_engine(case, seed=99)  # other weights: only the load can make them equal
    engine.load_checkpoint(os.path.join(work, "deepspeed"))
    state = fx.gather_state(engine, named, fx.MOMENTS[optimizer])
    counters = fx.counters(engine)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.optimizer.param_groups]
    if dist.get_rank() == 0:
        want = fx.read_safetensors(os.path.join(work, "export", "model.safetensors"))
        differ = []
        for key, value in state.items():
            kind, name = key.split("/", 1)
            exported = want.get(name if kind == "fp32" else "optimizer.%s.%s" % (kind, name))
            if exported is None or not torch.equal(value.float().view(torch.int32), exported.view(torch.int32)):
                differ.append(key)
        with open(os.path.join(work, "target.json"), "w") as f:
            json.dump({"compared": len(state), "differ": differ, "counters": counters, "groups": groups}, f)
    fx.finish_rank()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shardkit")
    p.add_argument("--work")
    p.add_argument("--optimizer", default="adamw", choices=sorted(fx.MOMENTS))
    p.add_argument("--target-rank", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.target_rank:
        return target_rank(args.target_rank, args.optimizer)
    config = dict(CONFIG, optimizer=LION) if args.optimizer == "lion" else CONFIG
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        print("deepspeed_from_shardkit.py: DeepSpeed is not importable; skipped")
        return 77
    work = args.work or tempfile.mkdtemp(prefix="shardkit-from-shardkit-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    import numpy as np
    np.random.default_rng(0).integers(0, fx.MODEL_FILES["gpt2"]["vocab_size"], 20000).astype("<u2").tofile(
        os.path.join(work, "tokens.bin"))
    with open(os.path.join(work, "model.json"), "w") as f:
        json.dump(fx.MODEL_FILES["gpt2"], f)
    with open(os.path.join(work, "ds.json"), "w") as f:
        json.dump(config, f)
    sk = os.path.abspath(args.shardkit)
    ok = True

    def shardkit(*argv):
        out = subprocess.run([sk] + list(argv), capture_output=True, text=True, cwd=work)
        print("RESULT " + json.dumps({"check": "shardkit " + argv[0], "command": " ".join(argv),
                                      "ok": out.returncode == 0, "output": (out.stdout + out.stderr)[-1500:]}))
        return out.returncode == 0

    ok &= shardkit("train", "--config", "ds.json", "--model", "model.json", "--data", "tokens.bin", "--steps",
                   str(STEPS), "--seq-len", "8", "--save-dir", "run")
    ok &= shardkit("convert", "export-deepspeed", "run", "-o", "deepspeed", "--world-size", str(WORLD), "--stage",
                   str(STAGE), "-q")
    ok &= shardkit("convert", "consolidate", "run", "-o", "export", "--with-optimizer", "-q")
    if not ok:
        return 1
    codes = fx.launch([os.path.abspath(__file__), "--optimizer", args.optimizer, "--target-rank", work], WORLD, "cpu",
                      os.path.join(work, "target.log"), 300)
    if any(c != 0 for c in codes):
        print("RESULT " + json.dumps({"check": "load", "ok": False, "log": fx.log_tail(os.path.join(work, "target.log"))}))
        return 1
    with open(os.path.join(work, "target.json")) as f:
        t = json.load(f)
    checks = [
        ("state bit for bit", not t["differ"], {"compared": t["compared"], "differ": t["differ"][:8]}),
        ("counters", t["counters"]["global_steps"] == STEPS and t["counters"]["adam_step"] == STEPS
         and t["counters"]["global_samples"] == STEPS * config["train_batch_size"], {"counters": t["counters"]}),
    ]
    params = config["optimizer"]["params"]
    adam = args.optimizer == "adamw"
    checks.append(("parameter groups", [g["weight_decay"] for g in t["groups"]] == [params["weight_decay"], 0.0]
                   and all(g["lr"] == params["lr"] and list(g["betas"]) == params["betas"]
                           and ("eps" in g) == adam and (not adam or g["eps"] == params["eps"]) for g in t["groups"]),
                   {"groups": t["groups"]}))
    for name, passed, detail in checks:
        print("RESULT " + json.dumps(dict(check=name, ok=passed, **detail)))
        ok &= passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
