#!/usr/bin/python3
"""Interop test of the exports with nothing but Python, numpy and Debian's h5py:

* `convert consolidate --format safetensors` files parse by the published byte layout (8-byte length,
  JSON header, offsets tiling the data exactly, no trailing bytes), carry GPT-2's Hugging Face names
  and shapes (no lm_head: it is tied), {"format": "pt"}, and the values of the checkpoint's fp32
  master weights (reassembled from the shards with h5py), rounded to bf16/fp16 to nearest even as
  numpy computes it; the sharded export holds the same tensors as the single file;
* `convert consolidate --format hdf5-virtual` presents every full tensor (tests/interop/h5py_virtual_view.py),
  here over zstd-compressed shards of another layout (`convert reshard --compress`)."""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--shardkit", required=True)
ap.add_argument("--mpiexec", required=True)
ap.add_argument("--plugin-dir", required=True)
args = ap.parse_args()
os.environ["HDF5_PLUGIN_PATH"] = os.path.abspath(args.plugin_dir)
import h5py  # noqa: E402
import numpy as np  # noqa: E402

failures = []
HERE = os.path.dirname(os.path.abspath(__file__))


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def sk(*argv, ranks=None):
    cmd = ([args.mpiexec, "-n", str(ranks), "--oversubscribe"] if ranks else []) + [args.shardkit, *argv]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def parse_safetensors(path):
    """(metadata, {name: (dtype, shape, bytes)}) by the published layout, validating it."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    check(data[8:9] == b"{", f"{path}: header starts with '{{'")
    check((8 + n) % 8 == 0, f"{path}: data starts 8-byte aligned")
    buffer = data[8 + n:]
    meta = header.pop("__metadata__", {})
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    pos = 0
    for begin, end, name in spans:
        check(begin == pos, f"{path}: {name} does not start where the previous tensor ended")
        pos = end
    check(pos == len(buffer), f"{path}: data size {len(buffer)} != end of the last tensor {pos}")
    widths = {"F32": 4, "BF16": 2, "F16": 2}
    tensors = {}
    for name, v in header.items():
        begin, end = v["data_offsets"]
        numel = int(np.prod(v["shape"], dtype=np.int64))
        check(end - begin == numel * widths[v["dtype"]], f"{path}: {name} byte size")
        tensors[name] = (v["dtype"], v["shape"], buffer[begin:end])
    return meta, tensors


def master_weights(step_dir):
    m = json.load(open(os.path.join(step_dir, "manifest.json")))
    names = [t["name"] for t in m["tensors"]]
    out = {t["name"]: np.zeros(int(np.prod(t["shape"], dtype=np.int64)), np.float32) for t in m["tensors"]}
    for shard in m["shards"]:
        with h5py.File(os.path.join(step_dir, shard["file"]), "r") as f:
            flat = f["state"]["fp32"][...]
            for tensor, off, length, flat_off in f["fragments"][...]:
                out[names[tensor]][off:off + length] = flat[flat_off:flat_off + length]
    return m, out


def bf16_rne(x):
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded


with tempfile.TemporaryDirectory() as tmp:
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("Every rank writes its own shard; nothing is gathered to rank zero. " * 80)
    tokens = os.path.join(tmp, "text.bin")
    sk("data", "encode", text, "-o", tokens)
    run = os.path.join(tmp, "run")
    sk("train", "--config", os.path.join(HERE, "..", "..", "samples", "configs", "tiny_zero2.json"), "--model",
       "gpt2-tiny", "--data", tokens, "--steps", "3", "--save-dir", run, "--threads", "1", "--quiet", ranks=2)
    step_dir = os.path.join(run, open(os.path.join(run, "latest")).read().strip())
    manifest, master = master_weights(step_dir)
    hf_names = [t["name"] for t in manifest["tensors"]]

    exports = {}
    for dtype in ("fp32", "bf16", "fp16"):
        out = os.path.join(tmp, "hf-" + dtype)
        sk("convert", "consolidate", run, "-o", out, "--dtype", dtype, "--quiet")
        meta, tensors = parse_safetensors(os.path.join(out, "model.safetensors"))
        exports[dtype] = tensors
        check(meta == {"format": "pt"}, f"{dtype}: metadata {meta}")
        check(sorted(tensors) == sorted(hf_names), f"{dtype}: names are not GPT-2's")
        check("lm_head.weight" not in tensors, f"{dtype}: the tied lm_head must not be written")
        for t in manifest["tensors"]:
            dt, shape, raw = tensors[t["name"]]
            check(shape == t["shape"], f"{dtype}: shape of {t['name']}")
            want = master[t["name"]]
            if dtype == "fp32":
                ok = dt == "F32" and np.array_equal(np.frombuffer(raw, "<f4"), want)
            elif dtype == "bf16":
                ok = dt == "BF16" and np.array_equal(np.frombuffer(raw, "<u2"), bf16_rne(want))
            else:
                ok = dt == "F16" and np.array_equal(np.frombuffer(raw, "<f2"), want.astype(np.float16))
            check(ok, f"{dtype}: values of {t['name']}")
        config = json.load(open(os.path.join(out, "config.json")))
        check(config["model_type"] == "gpt2" and config["n_layer"] == manifest["model"]["n_layer"], "config.json")

    # Sharded: the same tensors, spread over files named by the index.
    out = os.path.join(tmp, "hf-sharded")
    sk("convert", "consolidate", run, "-o", out, "--max-shard-size", "200kB", "--quiet")
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    merged = {}
    for file in sorted(set(index["weight_map"].values())):
        _, tensors = parse_safetensors(os.path.join(out, file))
        for name, value in tensors.items():
            check(index["weight_map"][name] == file, f"index names {file} for {name}")
            merged[name] = value
    check(merged == exports["fp32"], "the sharded export differs from the single file")
    check(index["metadata"]["total_size"] == sum(len(v[2]) for v in merged.values()), "index total_size")

    # The virtual view, over compressed shards of another layout.
    resharded = os.path.join(tmp, "resharded")
    sk("convert", "reshard", run, "-o", resharded, "--world-size", "3", "--stage", "3", "--compress", "3", "--quiet")
    view = os.path.join(tmp, "view")
    sk("convert", "consolidate", resharded, "-o", view, "--format", "hdf5-virtual", "--with-optimizer", "--quiet")
    rs_step = os.path.join(resharded, open(os.path.join(resharded, "latest")).read().strip())
    r = subprocess.run([sys.executable, os.path.join(HERE, "h5py_virtual_view.py"), "--view",
                        os.path.join(view, "view.h5"), "--manifest", os.path.join(rs_step, "manifest.json")])
    check(r.returncode == 0, "h5py_virtual_view.py failed")
    with h5py.File(os.path.join(view, "view.h5"), "r") as f:
        for name, want in master.items():
            check(np.array_equal(f["fp32"][name][...].reshape(-1), want), f"view: {name}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("export interop: all checks passed")
