#!/usr/bin/env python3
"""Real DeepSpeed resumes from checkpoints that shardkit resharded, at other world sizes and stages, with
every master weight, both Adam moments and Adam's step bit for bit as the source left them, and trains
on as the source did. `--optimizer lion` does the same with a Lion that keeps DeepSpeed FusedLion's
states (exp_avg and the step; write_deepspeed_fixtures.py's, as DeepSpeed's own Lion kernels are not
built for its CPU accelerator).

For each model (a GPT-2-shaped one with Hugging Face's names, and a network of no known family):
  (a) source: DeepSpeed, 2 ranks, ZeRO-2, fp32, two parameter groups, trains 3 steps on global batches
      that depend on the step only (6 rows, each rank its rows), gathers its state, saves a checkpoint,
      trains 2 more steps and records their losses;
  (b) shardkit: `convert reshard SRC -o OUT --world-size W --stage S --to deepspeed` for (W, S) = (1, 3)
      and (3, 1); for GPT-2 also `convert import-deepspeed` + `convert export-deepspeed --world-size 3
      --stage 1`;
  (c) target: DeepSpeed at W ranks and stage S (the same 6-row global batch: 1 rank takes 3 rows twice
      with gradient accumulation 2, 3 ranks 2 rows each) calls load_checkpoint(OUT), gathers its state
      and compares it with the source's bit for bit (and the counters), trains the 2 steps and compares
      the losses with the source's to 1e-5.
--self-check loads DeepSpeed's own checkpoint instead of shardkit's outputs (same world size and stage,
same code path), and trains the source's first steps afresh at 1 rank ZeRO-3 and 3 ranks ZeRO-1 to
show that the losses agree there: it tests this script, not shardkit.

Prints one `RESULT {json}` line per check; exits 1 when any fails, 77 (skipped) when DeepSpeed cannot be
imported. Usage, on a machine where DeepSpeed runs (see tests/data/deepspeed/README.md):
  DS_ACCELERATOR=cpu PYTHONPATH=<deepspeed site> /usr/bin/python3 tests/interop/deepspeed_roundtrip.py \\
      --shardkit build/shardkit [--work DIR] [--self-check]
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
import write_deepspeed_fixtures as fx  # noqa: E402 (the models, batches, engine set-up and state gathering)

SOURCE = {"world": 2, "stage": 2}
TRAIN_STEPS, MORE_STEPS, BATCH = 3, 2, 6
LOSS_TOLERANCE = 1e-5
MODELS = ("gpt2", "net")
OPTIMIZER = "adamw"  # main() sets it from --optimizer, in the driver and in every rank


def case_for(model, world, stage):
    accum = 2 if world == 1 else 1  # 1 rank: 3 rows twice; 2 ranks: 3 rows; 3 ranks: 2 rows
    top = {"gradient_accumulation_steps": accum} if accum > 1 else {}
    return fx._case(model, stage, "fp32", world, groups=2, steps=TRAIN_STEPS, batch=BATCH, top=top,
                    optimizer=OPTIMIZER)


# ---------------------------------------------------------------------------------------------------
# In the ranks.

def source_rank(model, work):
    import torch.distributed as dist
    case = case_for(model, SOURCE["world"], SOURCE["stage"])
    fx.init_distributed("cpu")
    engine, named, _ = fx.make_engine(case)
    losses = fx.train(engine, case, 0, TRAIN_STEPS)
    state = fx.gather_state(engine, named, fx.MOMENTS[OPTIMIZER])
    engine.save_checkpoint(os.path.join(work, "ds-source"))
    counters = fx.counters(engine)
    more = fx.train(engine, case, TRAIN_STEPS, MORE_STEPS)
    if dist.get_rank() == 0:
        fx.write_safetensors(os.path.join(work, "source-state.safetensors"), state)
        with open(os.path.join(work, "source.json"), "w") as f:
            json.dump({"losses": losses, "continuation": more, "counters": counters,
                       "params": [[n, list(p.shape)] for n, p in named]}, f)


def target_rank(model, work, name, folder, world, stage):
    import torch
    import torch.distributed as dist
    case = case_for(model, world, stage)
    fx.init_distributed("cpu")
    engine, named, _ = fx.make_engine(case, seed=99)  # other initial weights: only the load can make them equal
    path, _ = engine.load_checkpoint(folder)
    state = fx.gather_state(engine, named, fx.MOMENTS[OPTIMIZER])
    counters = fx.counters(engine)
    more = fx.train(engine, case, TRAIN_STEPS, MORE_STEPS)
    if dist.get_rank() != 0:
        return
    want = fx.read_safetensors(os.path.join(work, "source-state.safetensors"))
    differ = [k for k, v in want.items()
              if k not in state or state[k].shape != v.shape
              or not torch.equal(state[k].view(torch.int32), v.view(torch.int32))]
    with open(os.path.join(work, "source.json")) as f:
        source = json.load(f)
    with open(os.path.join(work, "target-%s.json" % name), "w") as f:
        json.dump({"loaded": path, "compared": len(want), "differ": differ, "counters": counters,
                   "want_counters": source["counters"], "continuation": more,
                   "want_continuation": source["continuation"]}, f)


def fresh_rank(model, work, name, world, stage):
    """The source's first steps from the source's initial weights at another world size and stage: the
    losses must agree, or the batches are not the same global batch (a check of this script)."""
    import torch.distributed as dist
    case = case_for(model, world, stage)
    fx.init_distributed("cpu")
    engine, _, _ = fx.make_engine(case)
    losses = fx.train(engine, case, 0, TRAIN_STEPS)
    if dist.get_rank() == 0:
        with open(os.path.join(work, "fresh-%s.json" % name), "w") as f:
            json.dump({"losses": losses}, f)


# ---------------------------------------------------------------------------------------------------
# The driver.

def why_failed(log):
    """The last line of a log that names an error, or its last lines."""
    with open(log, errors="replace") as f:
        lines = [line.rstrip() for line in f]
    named = [line for line in lines if "Error" in line or "Exception" in line]
    return named[-1] if named else "\n".join(lines[-3:])


class Results:
    def __init__(self):
        self.failed = 0

    def report(self, ok, **fields):
        self.failed += 0 if ok else 1
        print("RESULT " + json.dumps(dict(fields, ok=bool(ok))), flush=True)
        return ok


def run_ranks(argv, world, log):
    codes = fx.launch([os.path.abspath(__file__), "--optimizer", OPTIMIZER] + argv, world, "cpu", log, timeout=600)
    return all(c == 0 for c in codes), codes


def run_shardkit(results, argv, log, **fields):
    with open(log, "w") as out:
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode
    return results.report(rc == 0, check="shardkit", command=" ".join(argv), rc=rc,
                          output=None if rc == 0 else why_failed(log), **fields)


def roundtrip(args, results, model):
    work = os.path.join(args.work, model)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ok, codes = run_ranks(["--source-rank", model, work], SOURCE["world"], os.path.join(work, "source.log"))
    if not results.report(ok, check="source", model=model, world=SOURCE["world"], stage=SOURCE["stage"],
                          codes=codes, log=None if ok else why_failed(os.path.join(work, "source.log"))):
        return
    source_dir = os.path.join(work, "ds-source")
    # (name, folder DeepSpeed loads, world, stage)
    targets = []
    if args.self_check:
        targets.append(("deepspeed-own", source_dir, SOURCE["world"], SOURCE["stage"]))
        with open(os.path.join(work, "source.json")) as f:
            want = json.load(f)["losses"]
        for world, stage in ((1, 3), (3, 1)):
            name = "w%ds%d" % (world, stage)
            log = os.path.join(work, "fresh-%s.log" % name)
            ok, codes = run_ranks(["--fresh-rank", model, work, name, str(world), str(stage)], world, log)
            where = dict(model=model, world=world, stage=stage)
            if results.report(ok, check="fresh run", codes=codes, log=None if ok else why_failed(log), **where):
                with open(os.path.join(work, "fresh-%s.json" % name)) as f:
                    got = json.load(f)["losses"]
                gap = max(abs(a - b) for a, b in zip(got, want))
                results.report(gap <= LOSS_TOLERANCE, check="same global batch at another layout", losses=got,
                               want=want, max_abs_diff=gap, **where)
    else:
        for world, stage in ((1, 3), (3, 1)):
            out = os.path.join(work, "reshard-w%ds%d" % (world, stage))
            if run_shardkit(results, [args.shardkit, "convert", "reshard", source_dir, "-o", out, "--world-size",
                                      str(world), "--stage", str(stage), "--to", "deepspeed"],
                            os.path.join(work, "reshard-w%ds%d.log" % (world, stage)), model=model):
                targets.append(("reshard-w%ds%d" % (world, stage), out, world, stage))
        if model in fx.MODEL_FILES:
            # Through a shardkit checkpoint: import, then export at 3 ranks, stage 1.
            model_file = os.path.join(work, "model.json")
            with open(model_file, "w") as f:
                json.dump(fx.MODEL_FILES[model], f)
            ckpt, out = os.path.join(work, "shardkit-ckpt"), os.path.join(work, "export-w3s1")
            if (run_shardkit(results, [args.shardkit, "convert", "import-deepspeed", source_dir, "-o", ckpt,
                                       "--model", model_file], os.path.join(work, "import.log"), model=model)
                    and run_shardkit(results, [args.shardkit, "convert", "export-deepspeed", ckpt, "-o", out,
                                               "--world-size", "3", "--stage", "1", "--dtype", "fp32"],
                                     os.path.join(work, "export.log"), model=model)):
                targets.append(("export-w3s1", out, 3, 1))
    for name, folder, world, stage in targets:
        log = os.path.join(work, "target-%s.log" % name)
        ok, codes = run_ranks(["--target-rank", model, work, name, folder, str(world), str(stage)], world, log)
        where = dict(model=model, target=name, world=world, stage=stage)
        if not results.report(ok, check="load", codes=codes, log=None if ok else why_failed(log), **where):
            continue
        with open(os.path.join(work, "target-%s.json" % name)) as f:
            t = json.load(f)
        results.report(not t["differ"], check="state bit for bit", compared=t["compared"], differ=t["differ"][:8],
                       **where)
        keys = ("global_steps", "global_samples", "skipped_steps", "adam_step")
        results.report(all(t["counters"][k] == t["want_counters"][k] for k in keys), check="counters",
                       got={k: t["counters"][k] for k in keys}, want={k: t["want_counters"][k] for k in keys}, **where)
        gap = max(abs(a - b) for a, b in zip(t["continuation"], t["want_continuation"]))
        results.report(gap <= LOSS_TOLERANCE and len(t["continuation"]) == MORE_STEPS, check="loss continuation",
                       losses=t["continuation"], want=t["want_continuation"], max_abs_diff=gap, **where)


def deepspeed_importable():
    env = dict(os.environ, DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"))
    r = subprocess.run([sys.executable, "-c", "import deepspeed, torch"], env=env, capture_output=True, text=True)
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shardkit", help="the shardkit binary (not needed with --self-check)")
    p.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    p.add_argument("--self-check", action="store_true",
                   help="load DeepSpeed's own checkpoint instead of shardkit's outputs")
    p.add_argument("--models", default=",".join(MODELS), help="comma list of: " + ", ".join(MODELS))
    p.add_argument("--optimizer", default="adamw", choices=sorted(fx.MOMENTS))
    p.add_argument("--source-rank", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--target-rank", nargs=6, help=argparse.SUPPRESS)
    p.add_argument("--fresh-rank", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    global OPTIMIZER
    OPTIMIZER = args.optimizer
    if args.fresh_rank:
        model, work, name, world, stage = args.fresh_rank
        fresh_rank(model, work, name, int(world), int(stage))
        fx.finish_rank()
    if args.source_rank:
        source_rank(*args.source_rank)
        fx.finish_rank()
    if args.target_rank:
        model, work, name, folder, world, stage = args.target_rank
        target_rank(model, work, name, folder, int(world), int(stage))
        fx.finish_rank()
    if not args.self_check and not args.shardkit:
        p.error("--shardkit is required (or --self-check)")
    ok, why = deepspeed_importable()
    if not ok:
        print("SKIP: DeepSpeed is not importable here (%s); see tests/data/deepspeed/README.md" % why)
        return 77
    temporary = args.work is None
    args.work = args.work or tempfile.mkdtemp(prefix="ds-roundtrip-")
    if args.shardkit:
        args.shardkit = os.path.abspath(args.shardkit)
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
