"""A minimal torch optimizer on renaissance.Task with the interface Recorder relies on.

renaissance.torch (zero-copy views into the arena) is a separate piece of work; the recorder
needs from an optimizer only ``_renaissance_groups`` (per torch param group: ``.task``, ``.names``,
``.params``), the tasks' state and torch's ``step()``. This stand-in keeps that contract with
host copies (gradients in, weights out each step), so test_recorder.py and
scripts/record_torch_case.py --standin exercise the recorder without renaissance.torch.
Every parameter gets the role deep_conv: a group's weight decay applies to all its tensors, as in
torch. A loss scale comes from torch 2.x's protocol attribute ``grad_scale`` when set.
"""
from types import SimpleNamespace

import torch

import renaissance


class StandinAdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, threads=1):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self._renaissance_groups = []
        for group in self.param_groups:
            names = [f"p{i}" for i in range(len(group["params"]))]
            task = renaissance.Task([(n, tuple(p.shape), "deep_conv") for n, p in zip(names, group["params"])],
                                    threads=threads)
            task.optimizer("adamw", lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
                           eps=group["eps"], weight_decay=group["weight_decay"])
            task.compile()
            for n, p in zip(names, group["params"]):
                task.set_weight(n, p.detach().contiguous().numpy())
            self._renaissance_groups.append(SimpleNamespace(task=task, names=names, params=group["params"]))

    @torch.no_grad()
    def step(self, closure=None):
        scale = getattr(self, "grad_scale", None)
        for group, g in zip(self.param_groups, self._renaissance_groups):
            g.task.set_lr(group["lr"])
            g.task.set_loss_scale(1.0 if scale is None else float(scale))
            for n, p in zip(g.names, g.params):
                g.task.set_grad(n, p.grad.detach().contiguous().numpy())
            g.task.step()
            for n, p in zip(g.names, g.params):
                p.copy_(torch.from_numpy(g.task.get_weight(n)))

    def fingerprint(self):
        return renaissance._core.combine_fingerprints([g.task.fingerprint() for g in self._renaissance_groups])
