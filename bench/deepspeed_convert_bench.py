#!/usr/bin/env python3
"""shardkit's DeepSpeed converters beside DeepSpeed's own tools, on one checkpoint, in one process tree.

A real DeepSpeed engine (Hugging Face's GPT2LMHeadModel at gpt2-xl's shape by default, bf16, ZeRO
stage 1, one GPU, torch.optim.AdamW with Hugging Face Trainer's two parameter groups) trains one step
and saves with `engine.save_checkpoint`. With --device cpu the engine runs on the CPU (gloo, DeepSpeed's
CPU accelerator) with the GPT-2 of tests/convert/write_deepspeed_fixtures.py, which has Hugging Face's
parameter names and orientations, so that no GPU and no transformers are needed; the checkpoint's files
are the same kind. Then, each timed from start to exit, with the peak resident
memory of its whole process tree (sampled every 20 ms, worker processes included):

  ds_to_universal   DeepSpeed's route to another world size or stage (`load_universal`)
  reshard           shardkit convert reshard DS -o OUT --world-size 8 --stage 3 --to deepspeed
                    (DeepSpeed's files for 8 ranks at ZeRO-3, durable)
  zero_to_fp32      DeepSpeed's consolidation (convert_zero_checkpoint_to_fp32_state_dict)
  consolidate       shardkit convert consolidate DS -o OUT (fp32 safetensors, durable)
  import            shardkit convert import-deepspeed DS -o OUT (a shardkit checkpoint, for reference)

Outputs go to --out-root (default: the work folder), one at a time, removed after each measurement.
--tools picks some of them; --baseline-shardkit OLD adds `import` by another shardkit binary (the
previous release), and --rounds N runs the two imports N times each, alternately (the figure is the
median). Prints one `RESULT {json}` line per run and a table. Needs torch, transformers, psutil and DeepSpeed
importable (PYTHONPATH), and a GPU for the save (or --device cpu: torch, psutil and DeepSpeed).

  PYTHONPATH=<deepspeed site> DS_ACCELERATOR=cuda TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 \\
      python3 bench/deepspeed_convert_bench.py --shardkit build-gpu/shardkit --work /tmp/dsbench
  PYTHONPATH=<deepspeed site>:<its CPU-only shims> DS_ACCELERATOR=cpu python3 bench/deepspeed_convert_bench.py \\
      --device cpu --model gpt2-medium --shardkit build/shardkit --work /tmp/dsbench
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

SHAPES = {  # n_layer, n_embd, n_head
    "gpt2": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-xl": (48, 1600, 25),
}


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def tree_bytes(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def remove(path):
    if os.path.isfile(path):
        os.remove(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def measured(name, cmd, out, env=None, keep=False):
    """Runs cmd; returns seconds and the peak summed RSS of it and its descendants. Removes `out` after,
    unless `keep`."""
    import psutil

    remove(out)
    subprocess.run(["sync"], check=False)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            rss = root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
            peak = max(peak, rss)
        except psutil.Error:
            pass
        time.sleep(0.02)
    seconds = time.perf_counter() - start
    output = proc.stdout.read()
    row = dict(tool=name, seconds=round(seconds, 2), peak_rss_gb=round(peak / 1e9, 3), rc=proc.returncode,
               output_gb=round(tree_bytes(out) / 1e9, 2) if os.path.exists(out) else 0, command=" ".join(cmd))
    if proc.returncode != 0:
        row["tail"] = output[-2000:]
    result(**row)
    if not keep:
        remove(out)
    return row


def save(args):
    """One DeepSpeed training step and save_checkpoint, in this process (rank 0 of 1)."""
    import torch
    import deepspeed

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    layers, width, heads = SHAPES[args.model]
    torch.manual_seed(0)
    if args.device == "cpu":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "convert"))
        import write_deepspeed_fixtures as fx

        fx.init_distributed("cpu")
        model = fx.build_model("gpt2", {"family": "gpt2", "n_layer": layers, "n_embd": width, "n_head": heads,
                                        "vocab_size": 50257, "n_positions": 1024})
        # A short sequence: the step is only there to give the optimizer states values.
        ids = torch.randint(0, 50257, (1, 129))
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        deepspeed.init_distributed(dist_backend="nccl")
        model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=50257,
                                           n_positions=1024)).cuda()
        ids = torch.randint(0, 50257, (2, 1024), device="cuda")
    no_decay = ("bias", "ln_")
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": 0.1},
              {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    config = {"train_micro_batch_size_per_gpu": ids.shape[0], "gradient_accumulation_steps": 1,
              "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1},
              "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    if args.device == "cpu":
        logits = engine(ids[:, :-1]).float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    else:
        loss = engine(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    start = time.perf_counter()
    engine.save_checkpoint(args.ckpt)
    seconds = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    result(tool="save_checkpoint", seconds=round(seconds, 2), params=params, device=args.device,
           output_gb=round(tree_bytes(args.ckpt) / 1e9, 2), torch=torch.__version__, deepspeed=deepspeed.__version__)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shardkit", required=True)
    ap.add_argument("--work", required=True, help="folder for the DeepSpeed checkpoint")
    ap.add_argument("--out-root", default="", help="folder for the outputs (default: --work)")
    ap.add_argument("--model", default="gpt2-xl", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="where DeepSpeed trains and saves")
    ap.add_argument("--tools", default="ds_to_universal,reshard,zero_to_fp32,consolidate,import")
    ap.add_argument("--baseline-shardkit", default="", help="another shardkit binary whose import to time alike")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each import, alternately")
    ap.add_argument("--import-model", default="", help="--model for the imports (a baseline may need one)")
    ap.add_argument("--only-save", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only_save:
        return save(args)
    os.makedirs(args.work, exist_ok=True)
    out_root = args.out_root or args.work
    ckpt = os.path.join(args.work, "ds")
    shutil.rmtree(ckpt, ignore_errors=True)
    # The save runs in a process of its own, so that its GPU and host memory is gone before the tools run.
    rc = subprocess.run([sys.executable, __file__, "--only-save", "--ckpt", ckpt, "--model", args.model,
                         "--device", args.device, "--shardkit", args.shardkit, "--work", args.work]).returncode
    if rc != 0:
        sys.exit(rc)
    tag = open(os.path.join(ckpt, "latest")).read().strip()
    sk = os.path.abspath(args.shardkit)
    py = sys.executable
    tools = {
        "ds_to_universal": lambda: measured(
            "ds_to_universal", [py, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                                os.path.join(ckpt, tag), "--output_folder", os.path.join(out_root, "universal"),
                                "--num_extract_workers", "4", "--num_merge_workers", "4", "--inject_missing_state"],
            os.path.join(out_root, "universal")),
        "reshard": lambda: measured(
            "reshard", [sk, "convert", "reshard", ckpt, "-o", os.path.join(out_root, "reshard"), "--world-size", "8",
                        "--stage", "3", "--to", "deepspeed", "-q"], os.path.join(out_root, "reshard")),
        "zero_to_fp32": lambda: measured(
            "zero_to_fp32", [py, "-c", "import sys; from deepspeed.utils.zero_to_fp32 import "
                             "convert_zero_checkpoint_to_fp32_state_dict as c; c(sys.argv[1], sys.argv[2])", ckpt,
                             os.path.join(out_root, "zero_to_fp32.bin")], os.path.join(out_root, "zero_to_fp32.bin")),
        "consolidate": lambda: measured(
            "consolidate", [sk, "convert", "consolidate", ckpt, "-o", os.path.join(out_root, "safetensors"), "-q"],
            os.path.join(out_root, "safetensors")),
    }
    rows = [tools[t]() for t in args.tools.split(",") if t in tools]
    if "import" in args.tools.split(","):
        binaries = [("import", sk)]
        if args.baseline_shardkit:
            binaries.append(("import (baseline)", os.path.abspath(args.baseline_shardkit)))
        runs = {name: [] for name, _ in binaries}
        for _ in range(args.rounds):
            for name, binary in binaries:
                out = os.path.join(out_root, "shardkit")
                model = ["--model", args.import_model] if args.import_model else []
                runs[name].append(measured(name, [binary, "convert", "import-deepspeed", ckpt, "-o", out, "-q"] + model,
                                           out))
        for name, got in runs.items():
            got.sort(key=lambda r: r["seconds"])
            rows.append(dict(got[len(got) // 2], tool=name + (f" (median of {len(got)})" if len(got) > 1 else "")))
    print("\n| tool | seconds | peak RSS (GB) | output (GB) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['tool']} | {r['seconds']} | {r['peak_rss_gb']} | {r['output_gb']} |")
    if any(r["rc"] != 0 for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
