#!/usr/bin/python3
"""Interop test: Debian's h5py reads shardkit shards, uncompressed and zstd-compressed (through
shardkit's HDF5 filter plugin), and checks them against docs/FORMAT.md with nothing but Python:
attributes, fragment tables, per-chunk XXH64 checksums, the manifest digest and the reassembled
tensors, which must be identical across world sizes, stages and compression."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--shardkit", required=True)
ap.add_argument("--plugin-dir", required=True)
ap.add_argument("--mpiexec", required=True)
args = ap.parse_args()

# The plugin path must be set before HDF5 is loaded.
os.environ["HDF5_PLUGIN_PATH"] = os.path.abspath(args.plugin_dir)
import h5py  # noqa: E402
import numpy as np  # noqa: E402
import xxhash  # noqa: E402

ZSTD_FILTER = 32015
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def write(run_dir, ranks, stage, compress):
    cmd = [args.mpiexec, "-n", str(ranks), "--oversubscribe", args.shardkit, "bench", "ckpt", "--size", "3MiB",
           "--dir", run_dir, "--stage", str(stage), "--compress", str(compress), "--chunk-elems", "40000"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(run_dir, "latest")) as f:
        return os.path.join(run_dir, f.read().strip())


def manifest_digest_ok(manifest):
    body = dict(manifest)
    stored = body.pop("manifest_digest")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return xxhash.xxh64(canonical).hexdigest() == stored


def reassemble(step_dir):
    """Full tensors of every state, from the shards alone (FORMAT.md: fragments table)."""
    with open(os.path.join(step_dir, "manifest.json")) as f:
        m = json.load(f)
    check(manifest_digest_ok(m), f"{step_dir}: manifest digest")
    tensors = {t["name"]: np.zeros(int(np.prod(t["shape"], dtype=np.int64)), np.float32) for t in m["tensors"]}
    names = [t["name"] for t in m["tensors"]]
    out = {s: {n: v.copy() for n, v in tensors.items()} for s in m["states"]}
    chunk_elems = m["storage"]["chunk_elems"]
    for shard in m["shards"]:
        path = os.path.join(step_dir, shard["file"])
        check(os.path.getsize(path) == shard["bytes"], f"{path}: size")
        with h5py.File(path, "r") as f:
            a = f.attrs
            check(a["format"] == "shardkit-shard", f"{path}: format attribute")
            check(a["checkpoint_uid"] == m["checkpoint_uid"], f"{path}: uid")
            check(int(a["rank"]) == shard["rank"], f"{path}: rank")
            check(int(a["world_size"]) == m["layout"]["world_size"], f"{path}: world size")
            check(int(a["stage"]) == m["layout"]["stage"], f"{path}: stage")
            check(list(f["tensor_names"].asstr()[...]) == names, f"{path}: tensor names")
            flat_size = int(a["flat_size"])
            chunk = min(chunk_elems, flat_size)
            digest = xxhash.xxh64()
            for state in m["states"]:
                ds = f["state"][state]
                check(ds.dtype == np.dtype("<f4") and ds.shape == (flat_size,), f"{path}: {state} shape/type")
                filters = [ds.id.get_create_plist().get_filter(i)[0]
                           for i in range(ds.id.get_create_plist().get_nfilters())]
                compressed = m["storage"]["compression_level"] > 0
                check(filters == ([ZSTD_FILTER] if compressed else []), f"{path}: {state} filters {filters}")
                check(ds.chunks == (chunk,), f"{path}: {state} chunking")
                flat = ds[...]  # decoded by the plugin when compressed
                sums = f["checksum"][state][...]
                nchunks = (flat_size + chunk - 1) // chunk
                check(len(sums) == nchunks, f"{path}: {state} checksum count")
                for c in range(nchunks):
                    piece = flat[c * chunk:(c + 1) * chunk].tobytes()
                    check(xxhash.xxh64(piece).intdigest() == int(sums[c]), f"{path}: {state} chunk {c} checksum")
                digest.update(state.encode())
                digest.update(np.uint64(nchunks).tobytes())
                digest.update(sums.astype("<u8").tobytes())
                for tensor, t_off, length, flat_off in f["fragments"][...]:
                    out[state][names[tensor]][t_off:t_off + length] = flat[flat_off:flat_off + length]
            check(digest.hexdigest() == shard["digest"], f"{path}: shard digest")
    return out


with tempfile.TemporaryDirectory() as tmp:
    raw = write(os.path.join(tmp, "raw"), 2, 1, 0)
    zstd = write(os.path.join(tmp, "zstd"), 2, 1, 3)
    zstd3 = write(os.path.join(tmp, "zstd3"), 3, 3, 5)
    ref = reassemble(raw)
    for other in (zstd, zstd3):
        got = reassemble(other)
        for state in ref:
            for name in ref[state]:
                check(np.array_equal(ref[state][name], got[state][name]), f"{other}: {state}/{name} differs from {raw}")
    # The synthetic values lie in [-1, 1) and are not all zero: the comparison above is not vacuous.
    w = ref["fp32"]["blocks.0.weight"]
    check(w.size > 0 and np.abs(w).max() <= 1.0 and np.count_nonzero(w) > w.size // 2, "synthetic values")

    # Without the plugin, HDF5 cannot decode the compressed data: the plugin is what h5py used.
    shard = os.path.join(zstd, "shard-00000-of-00002.h5")
    probe = ("import h5py,sys; f=h5py.File(sys.argv[1],'r'); f['state']['fp32'][:10]")
    env = dict(os.environ, HDF5_PLUGIN_PATH=os.path.join(tmp, "no-plugins"))
    r = subprocess.run([sys.executable, "-c", probe, shard], env=env, capture_output=True)
    check(r.returncode != 0, "compressed data readable without the plugin?")

    # h5dump decodes it too.
    r = subprocess.run(["h5dump", "-p", "-d", "/state/fp32", "-s", "0", "-c", "4", shard], capture_output=True, text=True)
    check(r.returncode == 0 and "DATA" in r.stdout and "32015" in r.stdout, "h5dump with the plugin:\n" + r.stderr)

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("h5py interop: all checks passed")
