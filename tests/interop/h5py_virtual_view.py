#!/usr/bin/python3
"""Interop test of a shardkit virtual view (ckpt/virtual_view.hpp) with nothing but h5py and numpy:
the view's attributes match the manifest, every dataset is a float32 virtual dataset in its tensor's
shape whose sources are this checkpoint's shards, and its values are bit for bit the tensor
reassembled from the shards' /fragments tables (docs/FORMAT.md). Exits 1 on any mismatch.

Compressed shards need shardkit's zstd filter: pass --plugin-dir or set HDF5_PLUGIN_PATH."""
import argparse
import json
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--view", required=True, help="the view written by write_virtual_view")
ap.add_argument("--manifest", required=True, help="STEP_DIR/manifest.json of the checkpoint it presents")
ap.add_argument("--plugin-dir", help="directory holding libshardkit_h5zstd.so (default: $HDF5_PLUGIN_PATH)")
args = ap.parse_args()

# The plugin path must be set before HDF5 is loaded.
if args.plugin_dir:
    os.environ["HDF5_PLUGIN_PATH"] = os.path.abspath(args.plugin_dir)
import h5py  # noqa: E402
import numpy as np  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return cond


def reassemble(step_dir, manifest, states):
    """Every tensor of `states` as a flat array, from the shards alone, and whether every element of
    it was covered by exactly one fragment."""
    numel = [int(np.prod(t["shape"], dtype=np.int64)) for t in manifest["tensors"]]
    out = {s: [np.zeros(n, np.float32) for n in numel] for s in states}
    covered = [np.zeros(n, np.int64) for n in numel]
    for shard in manifest["shards"]:
        path = os.path.join(step_dir, shard["file"])
        if not check(os.path.isfile(path), f"{path}: shard missing"):
            continue
        with h5py.File(path, "r") as f:
            fragments = f["fragments"][...]
            for tensor, t_off, length, _ in fragments:
                covered[tensor][t_off:t_off + length] += 1
            for state in states:
                flat = f["state"][state][...]
                for tensor, t_off, length, flat_off in fragments:
                    out[state][tensor][t_off:t_off + length] = flat[flat_off:flat_off + length]
    for t, count in zip(manifest["tensors"], covered):
        check(np.all(count == 1), f"{t['name']}: the shards' fragments do not cover it exactly once")
    return out


def check_attributes(view, manifest):
    a = view.attrs
    check(a.get("format") == "shardkit-virtual-view", f"format attribute {a.get('format')!r}")
    check(int(a.get("format_version", -1)) == 1, "format_version attribute")
    check(int(a.get("step", -1)) == manifest["step"], "step attribute")
    check(a.get("checkpoint_uid") == manifest["checkpoint_uid"], "checkpoint_uid attribute")
    check(json.loads(a.get("model", "null")) == manifest["model"], "model attribute")


def check_sources(ds, view_dir, step_dir, state, where):
    """Each mapping names /state/<state> of a shard of this step directory, relative to the view."""
    for vmap in ds.virtual_sources():
        name = vmap.file_name.replace("%%", "%")  # source names are stored as printf-like patterns
        check(not os.path.isabs(name), f"{where}: absolute source path {name}")
        path = os.path.join(view_dir, name)
        ok = os.path.isfile(path) and os.path.samefile(os.path.dirname(path), step_dir)
        check(ok, f"{where}: source {name} is not a shard of {step_dir}")
        check(vmap.dset_name == f"/state/{state}", f"{where}: source dataset {vmap.dset_name}")


def main():
    with open(args.manifest) as f:
        manifest = json.load(f)
    step_dir = os.path.dirname(os.path.abspath(args.manifest))
    view_dir = os.path.dirname(os.path.abspath(args.view))
    names = [t["name"] for t in manifest["tensors"]]
    with h5py.File(args.view, "r") as view:
        check_attributes(view, manifest)
        states = list(view.keys())
        check(len(states) > 0, "the view holds no state")
        check(all(s in manifest["states"] for s in states), f"states {states} not all in the manifest")
        states = [s for s in states if s in manifest["states"]]
        expected = reassemble(step_dir, manifest, states)
        for state in states:
            check(sorted(view[state].keys()) == sorted(names), f"/{state}: tensors differ from the manifest")
            for t, info in enumerate(manifest["tensors"]):
                where = f"/{state}/{info['name']}"
                if not check(info["name"] in view[state], f"{where}: missing"):
                    continue
                ds = view[state][info["name"]]
                shape = tuple(info["shape"])
                check(ds.is_virtual, f"{where}: not a virtual dataset")
                check(ds.dtype == np.dtype("<f4"), f"{where}: dtype {ds.dtype}")
                if not check(ds.shape == shape, f"{where}: shape {ds.shape}, manifest {shape}"):
                    continue
                check_sources(ds, view_dir, step_dir, state, where)
                got = np.asarray(ds[()], dtype=np.float32) if ds.size else np.empty(shape, np.float32)
                want = expected[state][t].reshape(shape)
                # Bit for bit: a NaN read from a shard that cannot be opened never passes.
                same = got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))
                check(same and not np.isnan(got).any(), f"{where}: values differ from the shards")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"h5py virtual view: {len(states)} state(s) x {len(names)} tensor(s) match the shards")
    return 0


sys.exit(main())
