#!/usr/bin/env python3
"""The include graph keeps docs/ARCHITECTURE.md's layers: no file includes a folder above its own, no
model family includes another, only model/ names a family, and only CUDA code includes CUDA code.

Rules, by the folder of the including file (tests/, bench/ and fuzz/ may include anything):
  base/     base/                          comm/     base/ ckpt/ comm/
  ckpt/     base/ ckpt/                    report/   base/ ckpt/ report/
  model/    base/ ckpt/ model/             convert/  base/ ckpt/ model/ convert/
  trainer/  base/ ckpt/ comm/ model/ trainer/ (and no file under model/<family>/)
  cli/      everything but tests/, bench/, fuzz/
  model/<family>/ includes no other family's folder.
  A file outside a cuda/ folder includes nothing inside one (the build without CUDA has none of it).
The top-level folders are ordered by these rules, so no cycle runs between them; within model/, the
families' lists (model/registry.cpp, model/cuda/gpu_family.cpp) are the only files that include a
family from outside it. Prints every break and exits 1 on any. Usage: scripts/check_includes.py [ROOT]
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
# The folders of model/ that hold no family: the layer kernels every family shares.
SHARED_MODEL_FOLDERS = ("cpu", "cuda")
FAMILIES = ()  # every other folder of model/, found by main()
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".cpp", ".hpp", ".cu", ".cuh", ".h", ".c")


def family_of(path):
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "model" and parts[1] in FAMILIES else None


def in_cuda(path):
    return "cuda" in path.split("/")[:-1]


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
                            or (top == "trainer" and theirs) or (in_cuda(target) and not in_cuda(path))):
                        found.add((path, target))
    return found


def main():
    global FAMILIES
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    model = os.path.join(root, "model")
    FAMILIES = tuple(d for d in sorted(os.listdir(model))
                     if os.path.isdir(os.path.join(model, d)) and d not in SHARED_MODEL_FOLDERS)
    found = sorted(breaks(root))
    for path, target in found:
        print("%s includes %s: against the layers (scripts/check_includes.py)" % (path, target))
    print("include graph: %d break(s)" % len(found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
