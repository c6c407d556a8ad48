#!/usr/bin/env python3
"""Hugging Face's Trainer with DeepSpeed saves `checkpoint-N/`; shardkit rewrites it for another ZeRO
stage; the Trainer resumes from the rewritten folder and trains on. Run by hand on a machine with a GPU,
PyTorch 2.x, transformers and DeepSpeed importable (the tool is not a dependency of the tests' run):

  PYTHONPATH=<deepspeed site> DS_ACCELERATOR=cuda TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 \\
      python3 tests/interop/deepspeed_trainer_resume.py --shardkit build/shardkit [--work DIR]

DeepSpeed must be importable as transformers looks for it (`importlib.metadata.version('deepspeed')`:
an installed DeepSpeed is). One process, one GPU, a small GPT2LMHeadModel (bf16, AdamW, a linear schedule with warmup, the Trainer's
two parameter groups). Run A trains 8 steps at ZeRO stage 2 and saves checkpoint-4 and checkpoint-8.
`shardkit convert reshard A/checkpoint-4 -o B/checkpoint-4 --world-size 1 --stage 3` rewrites the first.
Run B, at stage 3, resumes from B/checkpoint-4 and trains steps 5-8. Checks: the rewritten folder keeps
the Trainer's files; run B resumes at step 4 (global step, learning rate and the optimizer's state as
DeepSpeed loads them); its losses of steps 5-8 equal run A's to 1e-3 (stage 2 and stage 3 reduce in
another order in bf16). Prints one `RESULT {json}` line per check; exits 1 on any failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

STEPS, SAVE_EVERY = 8, 4


def result(ok, **kw):
    print("RESULT " + json.dumps(dict(kw, ok=ok)), flush=True)
    return ok


def train(work, stage, resume):
    """Trains with the Trainer in this process; returns the losses it logged by step."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    class Steps(TrainerCallback):
        """The steps this process ran (a resumed run's log history also holds the checkpoint's)."""

        def __init__(self):
            self.ran = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ran.append(state.global_step)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=97, n_positions=32))
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 97, (STEPS * 4, 32), generator=g)
    data = [{"input_ids": r, "labels": r} for r in rows]
    ds_config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                 "gradient_clipping": "auto", "bf16": {"enabled": True},
                 "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    args = TrainingArguments(output_dir=work, per_device_train_batch_size=4, max_steps=STEPS, learning_rate=1e-3,
                             warmup_steps=2, lr_scheduler_type="linear", weight_decay=0.1, logging_steps=1,
                             save_steps=SAVE_EVERY, save_strategy="steps", bf16=True, deepspeed=ds_config,
                             report_to=[], seed=0, data_seed=0, dataloader_num_workers=0)
    steps = Steps()
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[steps])
    trainer.train(resume_from_checkpoint=resume)
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h and h["step"] in steps.ran}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardkit", required=True)
    ap.add_argument("--work", default="")
    ap.add_argument("--run", nargs=3, help=argparse.SUPPRESS)  # work stage resume: one training process
    args = ap.parse_args()
    if args.run:
        losses = train(args.run[0], int(args.run[1]), args.run[2] or None)
        print("LOSSES " + json.dumps(losses), flush=True)
        return 0
    work = args.work or tempfile.mkdtemp(prefix="shardkit-trainer-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")

    def run(sub, stage, resume=""):
        out = subprocess.run([sys.executable, __file__, "--shardkit", args.shardkit, "--run",
                              os.path.join(work, sub), str(stage), resume], env=env, capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("LOSSES ")]
        if out.returncode != 0 or not lines:
            print(out.stdout[-3000:] + out.stderr[-6000:])
            return None
        return {int(k): v for k, v in json.loads(lines[-1][7:]).items()}

    ok = True
    a = run("A", 2)
    ok &= result(a is not None, check="run A (stage 2) trains and saves", losses=a)
    if a is None:
        sys.exit(1)
    src = os.path.join(work, "A", "checkpoint-%d" % SAVE_EVERY)
    dst = os.path.join(work, "B", "checkpoint-%d" % SAVE_EVERY)
    cmd = [args.shardkit, "convert", "reshard", src, "-o", dst, "--world-size", "1", "--stage", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    ok &= result(out.returncode == 0, check="shardkit reshard", command=" ".join(cmd), output=out.stdout + out.stderr)
    kept = sorted(f for f in os.listdir(src) if os.path.isfile(os.path.join(src, f)) and f != "latest")
    missing = [f for f in kept if not os.path.isfile(os.path.join(dst, f))]
    ok &= result(not missing, check="the Trainer's files are kept", files=kept, missing=missing)
    b = run("B", 3, dst)
    ok &= result(b is not None, check="run B (stage 3) resumes from the rewritten folder", losses=b)
    if b is not None:
        resumed = sorted(b)
        ok &= result(resumed and resumed[0] == SAVE_EVERY + 1, check="run B starts after the saved step",
                     steps=resumed)
        diff = max(abs(b[s] - a[s]) for s in resumed if s in a) if resumed else None
        ok &= result(diff is not None and diff <= 1e-3, check="losses after the resume", max_abs_diff=diff,
                     a={s: a.get(s) for s in resumed}, b=b)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
