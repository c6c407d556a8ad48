#!/usr/bin/env python3
"""shardkit's DCP converters beside PyTorch's own routes, on one checkpoint, in one process tree.

FSDP2 (`fully_shard`, per block and the whole model) at --ranks CPU ranks with Gloo holds Hugging
Face's GPT2LMHeadModel at gpt2-xl's shape (fp32), takes one torch.optim.AdamW step (Hugging Face
Trainer's two parameter groups) on random gradients and saves model and optimizer with `dcp.save` in
get_state_dict's layout. Then, each timed from start to exit, with the peak resident memory of its
whole process tree (dsb.measured: sampled every 20 ms):

  dcp_to_torch_save     PyTorch's offline consolidation (torch.distributed.checkpoint.format_utils):
                        the whole state dict, model and optimizer, into one torch.save file
  torch model-only      the model's entries alone (_load_state_dict_from_keys({"model"})) saved as
                        safetensors: what a user writes to get weights out without the optimizer
  consolidate           shardkit convert consolidate DCP -o OUT --max-shard-size 1TB (fp32 safetensors,
                        one file, durable)
  consolidate +optim    shardkit convert consolidate DCP -o OUT --with-optimizer (the same work as
                        dcp_to_torch_save: weights and both moments)
  reshard to 8 ranks    shardkit convert reshard DCP -o OUT --world-size 8 (DCP for 8 ranks, durable)

The source is on --work (read once beforehand, so every tool reads it from the page cache); outputs go
to --out-root, one at a time, removed after each. shardkit's and PyTorch's weights are compared tensor
by tensor (bit for bit). Prints one `RESULT {json}` line per run. Needs torch 2.6+, transformers,
safetensors and psutil:

  python3 bench/dcp_convert_bench.py --shardkit build-gpu/shardkit --work /tmp/dcpbench --out-root /dev/shm/o
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepspeed_convert_bench as dsb  # noqa: E402 (shapes, measured(), result())


def make_rank(args):
    """One rank of the FSDP2 run that saves the checkpoint."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from transformers import GPT2Config, GPT2LMHeadModel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    layers, width, heads = dsb.SHAPES[args.model]
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=50257,
                                           n_positions=1024))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(rank)
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().normal_(0.0, 0.02)
    no_decay = ("bias", "ln_")
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": 0.1},
              {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    for p in model.parameters():
        p.grad = DTensor.from_local(torch.randn_like(p.to_local()), p.device_mesh, p.placements, shape=p.shape,
                                    stride=p.stride())
    opt.step()
    model_sd, optim_sd = get_state_dict(model, opt)
    start = time.perf_counter()
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=args.dcp)
    seconds = time.perf_counter() - start
    if rank == 0:
        dsb.result(tool="dcp.save", seconds=round(seconds, 2), ranks=world,
                   params=sum(p.numel() for p in model.parameters()), output_gb=round(dsb.tree_bytes(args.dcp) / 1e9, 2),
                   torch=torch.__version__)
    dist.barrier()
    dist.destroy_process_group()


def launch_ranks(argv, world):
    env_base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", OMP_NUM_THREADS="4")
    procs = [subprocess.Popen([sys.executable] + argv, env=dict(env_base, RANK=str(r), WORLD_SIZE=str(world)))
             for r in range(world)]
    return [p.wait() for p in procs]


TORCH_SAVE = ("from torch.distributed.checkpoint.format_utils import dcp_to_torch_save; import sys; "
              "dcp_to_torch_save(sys.argv[1], sys.argv[2])")
# The tied output projection is dropped as shardkit drops it (Hugging Face's layout keeps one copy).
MODEL_ONLY = ("import sys, os; from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys; "
              "from safetensors.torch import save_file; sd = _load_state_dict_from_keys({'model'}, "
              "checkpoint_id=sys.argv[1])['model']; sd.pop('lm_head.weight', None); os.makedirs(sys.argv[2]); "
              "save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(sys.argv[2], 'model.safetensors'))")


def same_weights(a, b):
    """Whether two safetensors files hold the same tensors, bit for bit; the names that differ."""
    import torch
    from safetensors.torch import load_file
    x, y = load_file(a), load_file(b)
    differ = sorted(k for k in set(x) | set(y) if k not in x or k not in y or not torch.equal(
        x[k].view(torch.int32), y[k].view(torch.int32)))
    return len(x), differ


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shardkit", required=False)
    p.add_argument("--work", required=True, help="folder for the DCP checkpoint")
    p.add_argument("--out-root", help="where outputs go (default: --work)")
    p.add_argument("--model", default="gpt2-xl", choices=sorted(dsb.SHAPES))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--make-rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dcp", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.make_rank:
        return make_rank(args)
    src = os.path.join(args.work, "dcp")
    out_root = args.out_root or args.work
    os.makedirs(out_root, exist_ok=True)
    if not os.path.exists(os.path.join(src, ".metadata")):
        codes = launch_ranks([os.path.abspath(__file__), "--make-rank", "--work", args.work, "--model", args.model,
                              "--dcp", src],
                             args.ranks)
        if any(codes):
            dsb.result(tool="dcp.save", rc=codes)
            return 1
    subprocess.run(["cat"] + [os.path.join(src, f) for f in os.listdir(src)], stdout=subprocess.DEVNULL, check=True)
    sk = os.path.abspath(args.shardkit)
    py = sys.executable
    rows = [
        dsb.measured("dcp_to_torch_save", [py, "-c", TORCH_SAVE, src, os.path.join(out_root, "full.pt")],
                     os.path.join(out_root, "full.pt")),
        dsb.measured("consolidate +optim", [sk, "convert", "consolidate", src, "-o", os.path.join(out_root, "sko"),
                                            "--with-optimizer", "-q"], os.path.join(out_root, "sko")),
        dsb.measured("reshard to 8 ranks", [sk, "convert", "reshard", src, "-o", os.path.join(out_root, "dcp8"),
                                            "--world-size", "8", "-q"], os.path.join(out_root, "dcp8")),
    ]
    # The weights alone, by both; compared before they are removed.
    torch_out, sk_out = os.path.join(out_root, "torch-model"), os.path.join(out_root, "sk-model")
    rows.append(dsb.measured("torch model-only", [py, "-c", MODEL_ONLY, src, torch_out], torch_out, keep=True))
    # One file, as save_file writes it (the default splits at Hugging Face's 5 GB).
    rows.append(dsb.measured("consolidate", [sk, "convert", "consolidate", src, "-o", sk_out, "-q",
                                             "--max-shard-size", "1TB"], sk_out, keep=True))
    count, differ = same_weights(os.path.join(torch_out, "model.safetensors"), os.path.join(sk_out, "model.safetensors"))
    dsb.result(tool="compare", tensors=count, differ=differ[:8], ok=not differ)
    dsb.remove(torch_out)
    dsb.remove(sk_out)
    print("\n| tool | seconds | peak RSS (GB) | output (GB) |\n|---|---:|---:|---:|")
    for r in rows:
        print("| %s | %.2f | %.2f | %.2f |" % (r["tool"], r["seconds"], r["peak_rss_gb"], r["output_gb"]))
    return 0 if all(r["rc"] == 0 for r in rows) and not differ else 1


if __name__ == "__main__":
    sys.exit(main())
