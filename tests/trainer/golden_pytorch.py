#!/usr/bin/python3
"""Golden numerics: shardkit's GPT-2 against a PyTorch computation of the same model (Hugging Face's
GPT2LMHeadModel math, written out here in plain torch), in float64 from the same fp32 weights.

Checks, to 1e-5 relative:
  1. the forward loss and every gradient of gpt2-tiny on a batch (golden_dump), element-wise
     (per tensor: max |ours - torch| <= 1e-5 * max |torch|);
  2. three training steps of `shardkit train` with AdamW and with Lion (weight decay on the matrices
     and embeddings, PyTorch given the same two parameter groups; gradient clipping, gradient accumulation over 2
     micro-batches): the loss and gradient norm of each step element-wise, and the fp32 master weights
     and the optimizer's moments of the checkpoint written after step 3 norm-wise, as
     golden_common.close_after_adam() explains."""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_common as gc  # noqa: E402
from torch_gpt2 import gpt2_loss, shapes  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--dump", required=True)
ap.add_argument("--shardkit", required=True)
args = ap.parse_args()

with tempfile.TemporaryDirectory() as tmp:
    tokens, data = gc.write_tokens(tmp)
    model = "gpt2-tiny"
    cfg, init, inputs, targets = gc.check_dump(args.dump, model, tokens, data, os.path.join(tmp, "dump"), gpt2_loss,
                                               shapes, model)
    for optimizer in gc.OPTIMIZERS:
        gc.check_training(args.shardkit, model, cfg, init, inputs, targets, data, tmp, gpt2_loss, model, optimizer)
gc.finish()
