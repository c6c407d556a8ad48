#!/usr/bin/env python3
"""Writes DeepSpeed ZeRO checkpoints of small models as DeepSpeed's save code lays them out, for the
tests of `shardkit convert import-deepspeed`.

DeepSpeed is not installed where the tests run, so this script builds the same dictionaries that
DeepSpeed's engine and ZeRO optimizers save (engine._save_checkpoint, _save_zero_checkpoint and the
optimizers' state_dict) and torch.save's them. The DeepSpeed classes the files contain (the loss scaler,
ZeroStageEnum, fragment_address) are small stand-ins registered under DeepSpeed's module names, so the
pickles name exactly the globals real files name.

Usage: make_deepspeed_fixture.py --out DIR --table NAME=TABLE.json [--table ...]
       make_deepspeed_fixture.py --seeds DIR   (the fuzz seeds of fuzz/corpus/torch_file/)
TABLE.json: [{"name": ..., "shape": [...]}, ...], the model's parameters in the module's order. For each
NAME it writes under DIR/NAME/:
  zero1/, zero2/, zero3/   checkpoint folders (`latest` -> global_step9/) of 2 data-parallel ranks
  universal/               ds_to_universal.py's output (`latest_universal` -> global_step9_universal/)
  evil/                    zero2/ with a rank file whose pickle calls os.system to create DIR/NAME/pwned
  expected/fp32.bin, exp_avg.bin, exp_avg_sq.bin   the full tensors in table order (float32, little-endian)
  expected/counters.json   global_steps, global_samples, skipped_steps, Adam's step, last_batch_iteration
"""

import argparse
import collections
import dataclasses
import enum
import json
import math
import os
import shlex
import shutil
import sys
import types

try:
    import torch
except ImportError:
    print("make_deepspeed_fixture.py: needs PyTorch (Debian's python3-torch)", file=sys.stderr)
    sys.exit(77)

WORLD = 2
GLOBAL_STEPS, SKIPPED, ADAM_STEP, SAMPLES = 9, 2, 7, 72
DS_VERSION = "0.16.5"
DS_CONFIG = {"train_batch_size": 8, "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}}


def register(module_name, **attrs):
    """Puts stand-ins into sys.modules under DeepSpeed's module path, so pickle names them there."""
    parts = module_name.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        sys.modules.setdefault(name, types.ModuleType(name))
    module = sys.modules[module_name]
    for key, value in attrs.items():
        value.__module__ = module_name
        value.__qualname__ = key
        setattr(module, key, value)


class ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


class LossScaler:
    def __init__(self, scale):
        self.cur_scale = scale
        self.dynamic = False


class DynamicLossScaler:
    def __init__(self):
        self.cur_scale = 65536.0
        self.cur_iter = GLOBAL_STEPS
        self.last_overflow_iter = 3
        self.scale_factor = 2.0
        self.scale_window = 1000
        self.min_scale = 1.0
        self.delayed_shift = 2
        self.cur_hysteresis = 2
        self.consecutive_hysteresis = False
        self.raise_error_at_min_scale = True
        self.dynamic = True
        self.dtype = torch.float16


@dataclasses.dataclass
class fragment_address:  # noqa: N801 (DeepSpeed's name)
    numel: int
    start: int


class Evil:
    """What a hostile checkpoint would hold: unpickling it runs a shell command (creating `marker`)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch " + shlex.quote(self.marker),))


register("deepspeed.runtime.zero.config", ZeroStageEnum=ZeroStageEnum)
register("deepspeed.runtime.fp16.loss_scaler", LossScaler=LossScaler, DynamicLossScaler=DynamicLossScaler)
register("deepspeed.utils.tensor_fragment", fragment_address=fragment_address)


def adam_param_group(index):
    return {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "amsgrad": False,
            "foreach": None, "maximize": False, "capturable": False, "params": [index]}


def model_states(params, groups, module, stage, shared, prefix=""):
    """engine._save_checkpoint's dict; `groups`: per group (or sub-group) the parameter names in flat order;
    `prefix`: what a wrapper module adds to the names ("module.")."""
    shapes = [collections.OrderedDict((prefix + n, torch.Size(params[n].shape)) for n in g) for g in groups]
    return {
        "module": module,
        "buffer_names": [],
        "optimizer": None,
        "param_shapes": shapes,
        "frozen_param_shapes": None,
        "shared_params": shared,
        "frozen_param_fragments": None,
        "lr_scheduler": {"last_batch_iteration": GLOBAL_STEPS - 1},
        "data_sampler": None,
        "random_ltd": None,
        "sparse_tensor_module_names": set(),
        "skipped_steps": SKIPPED,
        "global_steps": GLOBAL_STEPS,
        "global_samples": SAMPLES,
        "dp_world_size": WORLD,
        "mp_world_size": 1,
        "ds_config": dict(DS_CONFIG, zero_optimization={"stage": stage}),
        "ds_version": DS_VERSION,
    }


def step_value(as_tensor):
    # torch.optim.Adam keeps a tensor; DeepSpeed's FusedAdam a Python int.
    return torch.tensor(float(ADAM_STEP)) if as_tensor else ADAM_STEP


def write_zero12(folder, params, moments, groups, stage, module, shared, prefix, name_prefix=""):
    """stage_1_and_2.py: per group a flat buffer padded to a multiple of 2W, split in W equal parts."""
    tag = os.path.join(folder, "global_step%d" % GLOBAL_STEPS)
    os.makedirs(tag)
    per_rank = [{"single": [], "state": {}, "paddings": [], "mappings": []} for _ in range(WORLD)]
    for g, names in enumerate(groups):
        flats = [torch.cat([t[n].reshape(-1) for n in names]) for t in (params,) + moments]
        total = flats[0].numel()
        align = 2 * WORLD
        padded = math.ceil(total / align) * align
        size = padded // WORLD
        # Padding holds a value no parameter has, so that reading it by mistake shows.
        flats = [torch.cat([f, torch.full((padded - total,), 777.0)]) for f in flats]
        for r in range(WORLD):
            left = r * size
            padding = size if total <= left else max(0, left + size - total)
            part = flats[0][left:left + size].clone()
            rank = per_rank[r]
            # A view of the whole partition: torch.save writes all of its storage (padding included).
            rank["single"].append(part.narrow(0, 0, size - padding))
            rank["state"][g] = {"step": step_value(g == 0), "exp_avg": flats[1][left:left + size].clone(),
                                "exp_avg_sq": flats[2][left:left + size].clone()}
            rank["paddings"].append(padding)
            mapping = collections.OrderedDict()
            start = 0
            for n in names:
                lo, hi = max(start, left), min(start + params[n].numel(), left + size)
                if lo < hi:
                    mapping[n] = fragment_address(numel=hi - lo, start=lo - left)
                start += params[n].numel()
            rank["mappings"].append(mapping)
    for r in range(WORLD):
        rank = per_rank[r]
        sd = {
            "loss_scaler": DynamicLossScaler(),
            "dynamic_loss_scale": True,
            "overflow": False,
            "clip_grad": 1.0,
            "base_optimizer_state": {"state": rank["state"],
                                     "param_groups": [adam_param_group(g) for g in range(len(groups))]},
            "single_partition_of_fp32_groups": rank["single"],
            "zero_stage": ZeroStageEnum(stage),
            "group_paddings": rank["paddings"],
            "partition_count": [WORLD] * len(groups),
            "ds_version": DS_VERSION,
            "param_slice_mappings": rank["mappings"],
        }
        torch.save({"optimizer_state_dict": sd, "ds_config": DS_CONFIG, "ds_version": DS_VERSION},
                   os.path.join(tag, "%szero_pp_rank_%d_mp_rank_00_optim_states.pt" % (prefix, r)))
    torch.save(model_states(params, groups, module, stage, shared, name_prefix),
               os.path.join(tag, "mp_rank_00_model_states.pt"))
    with open(os.path.join(folder, "latest"), "w") as f:
        f.write("global_step%d" % GLOBAL_STEPS)  # DeepSpeed writes no newline


def write_zero3(folder, params, moments, subgroups, module, shared, prefix):
    """stage3.py: each parameter split into ceil(n/W) per rank (padding uninitialised), per sub-group."""
    tag = os.path.join(folder, "global_step%d" % GLOBAL_STEPS)
    os.makedirs(tag)
    for r in range(WORLD):
        flats = [[], [], []]
        for names in subgroups:
            pieces = [[], [], []]
            for n in names:
                numel = params[n].numel()
                part = math.ceil(numel / WORLD)
                for i, t in enumerate((params,) + moments):
                    flat = torch.cat([t[n].reshape(-1), torch.full((part * WORLD - numel,), 555.0)])
                    pieces[i].append(flat[r * part:(r + 1) * part])
            for i in range(3):
                flats[i].append(torch.cat(pieces[i]))
        state = {k: {"step": step_value(k == 0), "exp_avg": flats[1][k], "exp_avg_sq": flats[2][k]}
                 for k in range(len(subgroups))}
        sd = {
            "zero_stage": ZeroStageEnum.weights,
            "loss_scaler": LossScaler(1.0),
            "dynamic_loss_scale": False,
            "overflow": False,
            "partition_count": WORLD,
            "optimizer_state_dict": {"state": state,
                                     "param_groups": [adam_param_group(k) for k in range(len(subgroups))]},
            "fp32_flat_groups": flats[0],
        }
        torch.save({"optimizer_state_dict": sd, "ds_config": DS_CONFIG, "ds_version": DS_VERSION},
                   os.path.join(tag, "%szero_pp_rank_%d_mp_rank_00_optim_states.pt" % (prefix, r)))
        # Partitioned parameters are saved as empty placeholders.
        placeholders = collections.OrderedDict((n, torch.empty(0, dtype=t.dtype)) for n, t in module.items())
        torch.save(model_states(params, subgroups, placeholders, 3, shared),
                   os.path.join(tag, "zero_pp_rank_%d_mp_rank_00_model_states.pt" % r))
    with open(os.path.join(folder, "latest"), "w") as f:
        f.write("global_step%d" % GLOBAL_STEPS)


def write_universal(folder, params, moments, source, flat):
    """ds_to_universal.py's output: zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt (+ step.pt from stage 1/2)."""
    tag = os.path.join(folder, "global_step%d_universal" % GLOBAL_STEPS)
    for n in params:
        d = os.path.join(tag, "zero", n)
        os.makedirs(d)
        for state, t in zip(("fp32", "exp_avg", "exp_avg_sq"), (params,) + moments):
            value = t[n].reshape(-1).clone() if flat else {"param": t[n].clone(), "cat_dim": 0}
            torch.save(value, os.path.join(d, state + ".pt"))
        if not flat:
            torch.save(torch.tensor(float(ADAM_STEP)), os.path.join(d, "step.pt"))
    torch.save({"param_groups": [adam_param_group(0)]}, os.path.join(tag, "zero", "optimizer_state.pt"))
    shutil.copy(source, tag)
    with open(os.path.join(folder, "latest_universal"), "w") as f:
        f.write("global_step%d_universal" % GLOBAL_STEPS)


def make(out, table_file, seed):
    with open(table_file) as f:
        table = json.load(f)
    g = torch.Generator().manual_seed(seed)
    params = collections.OrderedDict()
    moments = (collections.OrderedDict(), collections.OrderedDict())
    for t in table:
        shape = t["shape"]
        params[t["name"]] = torch.randn(shape, generator=g)
        moments[0][t["name"]] = torch.randn(shape, generator=g) * 0.01
        moments[1][t["name"]] = torch.rand(shape, generator=g) * 1e-4
    names = list(params)
    # The module's state dict in bf16 (the training dtype); GPT-2's head is the token embedding.
    module = collections.OrderedDict((n, params[n].to(torch.bfloat16)) for n in names)
    shared = {}
    if "transformer.wte.weight" in params:
        module["lm_head.weight"] = module["transformer.wte.weight"]
        shared = {"lm_head.weight": "transformer.wte.weight"}
    # Two param groups, as trainers make them (no weight decay for biases and norms), and two stage 3
    # sub-groups: boundaries inside the flat buffers.
    decay = [n for n in names if params[n].dim() >= 2]
    no_decay = [n for n in names if params[n].dim() < 2]
    half = len(names) // 2
    # The second model's stage 1 run had its module wrapped: names with a "module." prefix.
    write_zero12(os.path.join(out, "zero1"), params, moments, [names], 1, module, shared, "",
                 "module." if seed % 2 == 1 else "")
    write_zero12(os.path.join(out, "zero2"), params, moments, [decay, no_decay], 2, module, shared, "bf16_")
    write_zero3(os.path.join(out, "zero3"), params, moments, [names[:half], names[half:]], module, shared, "")
    write_universal(os.path.join(out, "universal"), params, moments,
                    os.path.join(out, "zero1", "global_step%d" % GLOBAL_STEPS, "mp_rank_00_model_states.pt"),
                    flat=seed % 2 == 1)
    # A hostile copy of zero2: rank 1's optimizer file carries an object whose unpickling runs a command.
    shutil.copytree(os.path.join(out, "zero2"), os.path.join(out, "evil"))
    evil = os.path.join(out, "evil", "global_step%d" % GLOBAL_STEPS, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt")
    torch.save({"optimizer_state_dict": {"zero_stage": 2, "payload": Evil(os.path.join(out, "pwned"))}}, evil)
    expected = os.path.join(out, "expected")
    os.makedirs(expected)
    for state, t in zip(("fp32", "exp_avg", "exp_avg_sq"), (params,) + moments):
        with open(os.path.join(expected, state + ".bin"), "wb") as f:
            for n in names:
                f.write(t[n].contiguous().numpy().astype("<f4").tobytes())
    with open(os.path.join(expected, "counters.json"), "w") as f:
        json.dump({"global_steps": GLOBAL_STEPS, "global_samples": SAMPLES, "skipped_steps": SKIPPED,
                   "adam_step": ADAM_STEP, "last_batch_iteration": GLOBAL_STEPS - 1}, f)


def write_seeds(folder):
    """Small DeepSpeed-shaped files for the fuzzer: a first byte of 1 + a .pt file, 0 + its data.pkl."""
    import io
    import zipfile
    os.makedirs(folder, exist_ok=True)
    part = torch.arange(6.0)
    optim = {"optimizer_state_dict": {
        "loss_scaler": DynamicLossScaler(), "zero_stage": ZeroStageEnum.gradients, "partition_count": [2],
        "single_partition_of_fp32_groups": [part.narrow(0, 0, 5)],
        "base_optimizer_state": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(6),
                                               "exp_avg_sq": torch.ones(6, dtype=torch.bfloat16)}},
                                 "param_groups": [adam_param_group(0)]},
        "param_slice_mappings": [collections.OrderedDict(w=fragment_address(numel=5, start=0))]},
        "ds_version": DS_VERSION}
    weight = torch.ones(2, 3, dtype=torch.float16)
    model = {"module": collections.OrderedDict(w=weight, tied=weight), "param_shapes": [
        collections.OrderedDict(w=torch.Size([2, 3]))], "sparse_tensor_module_names": set(), "global_steps": 3,
        "fp32_flat_groups": [torch.zeros(3, dtype=torch.float64)]}
    for name, value in (("zero2_optim", optim), ("model_states", model)):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        with open(os.path.join(folder, name + ".pt.seed"), "wb") as f:
            f.write(b"\x01" + buffer.getvalue())
        with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as z:
            pickle = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
        with open(os.path.join(folder, name + ".pkl.seed"), "wb") as f:
            f.write(b"\x00" + pickle)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--table", action="append", default=[], help="NAME=TABLE.json")
    p.add_argument("--seeds", help="write the fuzz seeds into this folder instead")
    args = p.parse_args()
    if args.seeds:
        write_seeds(args.seeds)
        return
    if not args.out or not args.table:
        p.error("--out and --table are required")
    for seed, spec in enumerate(args.table):
        name, table = spec.split("=", 1)
        make(os.path.join(args.out, name), table, seed)


if __name__ == "__main__":
    main()
