#!/usr/bin/python3
"""Writes random GPT-2 weights of a given configuration as a Hugging Face folder (model.safetensors +
config.json), streamed tensor by tensor, for benchmarks that need a large checkpoint.

Usage: bench/make_gpt2_weights.py OUT_DIR n_layer n_embd n_head vocab_size n_positions"""
import json
import os
import struct
import sys

import numpy as np

out, L, C, H, V, P = sys.argv[1], *map(int, sys.argv[2:7])
os.makedirs(out, exist_ok=True)
shapes = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (P, C))]
for i in range(L):
    h = f"transformer.h.{i}."
    shapes += [(h + "ln_1.weight", (C,)), (h + "ln_1.bias", (C,)), (h + "attn.c_attn.weight", (C, 3 * C)),
               (h + "attn.c_attn.bias", (3 * C,)), (h + "attn.c_proj.weight", (C, C)), (h + "attn.c_proj.bias", (C,)),
               (h + "ln_2.weight", (C,)), (h + "ln_2.bias", (C,)), (h + "mlp.c_fc.weight", (C, 4 * C)),
               (h + "mlp.c_fc.bias", (4 * C,)), (h + "mlp.c_proj.weight", (4 * C, C)), (h + "mlp.c_proj.bias", (C,))]
shapes += [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
header, offset = {"__metadata__": {"format": "pt"}}, 0
for name, shape in shapes:
    n = int(np.prod(shape)) * 4
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
    offset += n
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-(8 + len(text)) % 8)
rng = np.random.default_rng(0)
with open(os.path.join(out, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text)
    for name, shape in shapes:
        f.write((rng.standard_normal(shape, dtype=np.float32) * 0.02).tobytes())
json.dump({"model_type": "gpt2", "n_layer": L, "n_embd": C, "n_head": H, "vocab_size": V, "n_positions": P},
          open(os.path.join(out, "config.json"), "w"))
print(f"{out}: {offset / 1e9:.2f} GB of fp32 weights")
