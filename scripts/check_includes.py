#!/usr/bin/env python3
"""The include graph keeps docs/ARCHITECTURE.md's layers: no file includes a folder above its own, no
model family includes another, and only model/ and the registry name a family.

Rules, by the folder of the including file (tests/, bench/ and fuzz/ may include anything):
  base/     base/                          comm/     base/ ckpt/ comm/
  ckpt/     base/ ckpt/                    report/   base/ ckpt/ report/
  model/    base/ ckpt/ model/             convert/  base/ ckpt/ model/ convert/
  trainer/  base/ ckpt/ comm/ model/ trainer/ (and no file under model/<family>/)
  cli/      everything but tests/, bench/, fuzz/
  model/<family>/ includes no other family's folder.

KNOWN lists the includes that break a rule today, each with the issue that removes it: a new one fails
the check, and so does a listed one that is gone (the list must shrink with the code). Prints every
break and exits 1 on any. Usage: scripts/check_includes.py [REPO_ROOT]
"""
import os
import re
import sys

ALLOWED = {
    "base": {"base"},
    "ckpt": {"base", "ckpt"},
    "comm": {"base", "ckpt", "comm"},
    "report": {"base", "ckpt", "report"},
    "model": {"base", "ckpt", "model"},
    "convert": {"base", "ckpt", "model", "convert"},
    "trainer": {"base", "ckpt", "comm", "model", "trainer"},
    "cli": {"base", "ckpt", "comm", "model", "trainer", "convert", "report", "cli"},
}
FAMILIES = ("gpt2", "llama")
# Issue 38: the layer kernels, GpuModel and its parameter store move from trainer/cuda/ to model/cuda/,
# and the GPU factory is registered with each family's Family record.
KNOWN = {
    ("model/gpt2/cuda/gpu_model.cpp", "trainer/cuda/device_type.hpp"),
    ("model/gpt2/cuda/gpu_model.cpp", "trainer/cuda/head_size.hpp"),
    ("model/gpt2/cuda/gpu_model.cpp", "trainer/cuda/kernels.hpp"),
    ("model/gpt2/cuda/gpu_model.cpp", "trainer/cuda/norms.hpp"),
    ("model/gpt2/cuda/gpu_model.hpp", "trainer/cuda/encoder_backward.hpp"),
    ("model/gpt2/cuda/gpu_model.hpp", "trainer/cuda/gpu_model.hpp"),
    ("model/gpt2/cuda/gpu_model.hpp", "trainer/cuda/matmul.hpp"),
    ("model/gpt2/cuda/kernels.cu", "trainer/cuda/cuda_common.hpp"),
    ("model/gpt2/cuda/kernels.cu", "trainer/cuda/kernels.hpp"),
    ("model/gpt2/cuda/kernels.cu", "trainer/cuda/launch.cuh"),
    ("model/gpt2/cuda/kernels.cu", "trainer/cuda/vec.cuh"),
    ("model/llama/cuda/gpu_model.cpp", "trainer/cuda/device_type.hpp"),
    ("model/llama/cuda/gpu_model.cpp", "trainer/cuda/head_size.hpp"),
    ("model/llama/cuda/gpu_model.cpp", "trainer/cuda/kernels.hpp"),
    ("model/llama/cuda/gpu_model.cpp", "trainer/cuda/norms.hpp"),
    ("model/llama/cuda/gpu_model.hpp", "trainer/cuda/encoder_backward.hpp"),
    ("model/llama/cuda/gpu_model.hpp", "trainer/cuda/gpu_model.hpp"),
    ("model/llama/cuda/gpu_model.hpp", "trainer/cuda/matmul.hpp"),
    ("model/llama/cuda/kernels.cu", "trainer/cuda/cuda_common.hpp"),
    ("model/llama/cuda/kernels.cu", "trainer/cuda/launch.cuh"),
    ("model/llama/cuda/kernels.cu", "trainer/cuda/vec.cuh"),
    ("trainer/cuda/gpu_model.cpp", "model/gpt2/cuda/gpu_model.hpp"),
    ("trainer/cuda/gpu_model.cpp", "model/gpt2/model.hpp"),
    ("trainer/cuda/gpu_model.cpp", "model/llama/cuda/gpu_model.hpp"),
    ("trainer/cuda/gpu_model.cpp", "model/llama/model.hpp"),
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".c")


def family_of(path):
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "model" and parts[1] in FAMILIES else None


def breaks(root):
    found = set()
    for top in ALLOWED:
        for folder, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(folder, name), root)
                with open(os.path.join(root, path), errors="replace") as f:
                    text = f.read()
                for target in INCLUDE.findall(text):
                    other = target.split("/")[0]
                    if other not in ALLOWED:
                        continue  # a third-party or generated header
                    mine, theirs = family_of(path), family_of(target)
                    if (other not in ALLOWED[top] or (mine and theirs and mine != theirs)
                            or (top == "trainer" and theirs)):
                        found.add((path, target))
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    found = breaks(root)
    new = sorted(found - KNOWN)
    gone = sorted(KNOWN - found)
    for path, target in new:
        print("%s includes %s: against the layers (scripts/check_includes.py)" % (path, target))
    for path, target in gone:
        print("%s no longer includes %s: remove it from KNOWN in scripts/check_includes.py" % (path, target))
    print("include graph: %d known break(s) left, %d new, %d gone" % (len(found & KNOWN), len(new), len(gone)))
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main())
