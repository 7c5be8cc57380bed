"""One torch param group bound to one renaissance Task (used by renaissance.torch).

Each torch group owns a Task: its own arena, scalars and compiled step. The parameters' .data
and .grad are re-pointed to views into the Task's W and G regions (DLPack tensors that keep the
Task alive), so autograd accumulates straight into the arena and step() is one core step.
"""
import warnings

import torch

from . import _core

_GRAD_COPY_WARNED = [False]  # warn once per process that a foreign .grad was copied in


def tensor_interval(p):
    """The byte range [start, end) a contiguous float32 tensor occupies."""
    start = p.data_ptr()
    return start, start + p.numel() * p.element_size()


class GroupBinding:
    """The Task of one torch param group and the arena views of its parameters."""

    def __init__(self, params, roles, kind, hyper, device, threads, state_names):
        self.params = list(params)
        self.kind = kind
        self.roles = list(roles)
        self.hyper = dict(hyper)  # the core hyperparameters last applied (lr included)
        self.device = device
        self.state_names = state_names  # {"M": "exp_avg", ...}: families kept as torch state
        self.amp_used = False
        backend = "cuda" if device.type == "cuda" else "cpu"
        self.device_id = device.index if device.type == "cuda" else 0
        specs = [(str(j), [int(d) for d in p.shape], roles[j]) for j, p in enumerate(self.params)]
        with _device_context(device):
            task = _core.Task(specs, backend=backend, threads=threads, check_finite=True)
            task.optimizer(kind, **hyper)
            task.compile()
        self.task = task
        did = self.device_id
        self.W = [task.view("W", j, did) for j in range(len(self.params))]
        self.G = [task.view("G", j, did) for j in range(len(self.params))]
        self.M = [task.view("M", j, did) for j in range(len(self.params))] if "M" in state_names else None
        self.V = [task.view("V", j, did) for j in range(len(self.params))] if "V" in state_names else None
        self.g_ptrs = [g.data_ptr() for g in self.G]
        self.G_all = task.family_view("G", did)
        self.inv_scale = task.scalar_view("inv_loss_scale", did)

    def adopt(self):
        """Copies every parameter (and any gradient) in, then re-points .data and .grad."""
        with torch.no_grad():
            for j, p in enumerate(self.params):
                self.W[j].copy_(p.detach())
                if p.grad is not None:
                    self.G[j].copy_(p.grad.detach())
            for j, p in enumerate(self.params):
                p.data = self.W[j]
                p.grad = self.G[j]

    def is_view(self, j, g):
        # The common case first: torch hands back the very tensor object it was given. Otherwise
        # (torch only accepts a .grad of the parameter's shape) the address and layout decide.
        return g is self.G[j] or (g.data_ptr() == self.g_ptrs[j] and g.is_contiguous())

    def zero_grad(self):
        with torch.no_grad():
            self.G_all.zero_()
        for p, g, j in zip(self.params, self.G, range(len(self.G))):
            grad = p.grad
            if grad is not g and (grad is None or not self.is_view(j, grad)):
                p.grad = g

    def apply_hyper(self, kind, hyper):
        """Brings the Task's scalars to `hyper` (no recompile): lr alone by set_lr, else all."""
        if kind != self.kind:
            raise ValueError(
                "cannot change the optimizer of a param group from '%s' to '%s' after construction "
                "(momentum to or from 0, nesterov or decoupled_weight_decay change the compiled step); "
                "build a new optimizer" % (self.kind, kind))
        if hyper == self.hyper:
            return
        if ("max_grad_norm" in hyper) != ("max_grad_norm" in self.hyper):
            raise ValueError("cannot turn max_grad_norm on or off after construction (it changes the compiled step)")
        changed = {k for k in hyper if hyper[k] != self.hyper.get(k)}
        if changed == {"lr"}:
            self.task.set_lr(hyper["lr"])
        else:
            self.task.optimizer(kind, **hyper)
        self.hyper = dict(hyper)

    def set_scale(self, grad_scale):
        """The step's 1/scale slot: from torch's scale tensor on the device (no host sync), or 1."""
        if grad_scale is not None:
            # 1/s formed in double, rounded to float once: Task.set_loss_scale's bits.
            inv = grad_scale.detach().to(self.inv_scale.device).double().reciprocal().float()
            self.inv_scale.copy_(inv.reshape(1))
            self.amp_used = True
        elif self.amp_used:
            self.task.set_loss_scale(1.0)
            self.amp_used = False

    def step(self, grad_scale):
        """One core step. Returns False when no parameter of the group has a gradient."""
        missing = []
        for j, p in enumerate(self.params):
            g = p.grad
            if g is self.G[j]:
                continue
            if g is None:
                missing.append(j)
            elif not self.is_view(j, g):
                if not _GRAD_COPY_WARNED[0]:
                    _GRAD_COPY_WARNED[0] = True
                    warnings.warn("renaissance.torch: a parameter's .grad is not the optimizer's gradient view; "
                                  "it is copied in and .grad re-pointed (one extra copy; see docs/python.md)",
                                  stacklevel=3)
                with torch.no_grad():
                    self.G[j].copy_(g.detach())
                p.grad = self.G[j]
        if len(missing) == len(self.params):
            return False
        self.set_scale(grad_scale)
        saved = []
        with torch.no_grad():
            # A parameter without a gradient must not move: its G is zeroed (so it cannot make the
            # step skip or enter a norm), and W and the state are put back after the step.
            for j in missing:
                self.G[j].zero_()
                saved.append([(buf[j], buf[j].clone()) for buf in (self.W, self.M, self.V) if buf is not None])
            if self.device.type == "cuda":
                self.task.set_stream(torch.cuda.current_stream(self.device).cuda_stream)
            with _device_context(self.device):  # the Task's device, whichever is current
                self.task.step()
            for pairs in saved:
                for view, copy in pairs:
                    view.copy_(copy)
        return True

    def state_of(self, j, step_tensor):
        st = {}
        if "step" in self.state_names:
            st["step"] = step_tensor
        for fam, bufs in (("M", self.M), ("V", self.V)):
            if bufs is not None:
                st[self.state_names[fam]] = bufs[j]
        return st


class _device_context:
    """torch.cuda.device(d) for a CUDA device (the Task allocates on the current device)."""

    def __init__(self, device):
        self.ctx = torch.cuda.device(device) if device.type == "cuda" else None

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            return self.ctx.__exit__(*exc)
        return False
