"""torch.optim.AdamW's parameter groups as shardkit decays (model/model.hpp, Model::decays): weight decay
on the matrices and embeddings, none on biases and normalisation weights -- the groups Hugging Face's
Trainer, nanoGPT and llm.c build. In both families those are exactly the tensors of two or more
dimensions, which is how the PyTorch references here pick them (tests/model checks the two rules agree).
Shared by the golden tests and the benchmarks against PyTorch."""


def adamw_groups(params, weight_decay):
    """Two parameter groups for torch.optim.AdamW: (decay, no_decay)."""
    params = list(params)
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
