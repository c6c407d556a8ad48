"""Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023) in plain PyTorch, as the
paper's pseudo-code writes it and DeepSpeed's "Lion" optimizer type configures it (lr, betas,
weight_decay): the reference of shardkit's Lion in the golden tests. PyTorch has no Lion of its own."""
import torch


class Lion(torch.optim.Optimizer):
    def __init__(self, params, lr, betas=(0.9, 0.999), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                c = m * beta1 + p.grad * (1 - beta1)
                p.mul_(1 - lr * wd)
                p.add_(torch.sign(c), alpha=-lr)
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)
