"""The strongest torch LARS we could write, with THIS library's LARS semantics (docs/math.md):
lr inside the momentum, the bias-like group plain momentum SGD with weight decay 0, the trust
ratio set to 1 when a norm is below 1e-12 and clamped at 100. bench/compare_torch.py times it
(foreach ops, optionally captured in one CUDA graph) as the fair torch side of the LARS rows,
since timm's Lars is a per-tensor Python loop with other semantics; bench/check_torch_lars.py
checks it in float64 against the replay cases' expected values.

Per step: torch._foreach_norm gives the per-tensor norms of w and g of the weight group in two
launches; the ratios are formed on the device (no host sync, so the step can be captured); the
updates are foreach ops. Only the per-tensor scale q = (lr*η) * p needs one 0-dim tensor per
tensor, which torch's foreach mul takes as a list (its generic path where the fast one does not
apply).
"""
import torch


class ForeachLars:
    """weights/biases: lists of tensors whose .grad is set; hyperparameters as in the kind table."""

    def __init__(self, weights, biases, lr, momentum, weight_decay, trust_coefficient, eps, nesterov=False):
        self.w, self.b = list(weights), list(biases)
        self.lr, self.mom, self.wd, self.tc, self.eps, self.nesterov = lr, momentum, weight_decay, trust_coefficient, eps, nesterov
        self.mw = [torch.zeros_like(p) for p in self.w]
        self.mb = [torch.zeros_like(p) for p in self.b]

    @torch.no_grad()
    def step(self, inv_scale=None):
        """One LARS step. inv_scale (float or None): the gradients are multiplied by it first, in
        place, as the library's fused unscale does (ĝ = g * inv_s)."""
        gw = [p.grad for p in self.w]
        gb = [p.grad for p in self.b]
        if inv_scale is not None:
            torch._foreach_mul_(gw, inv_scale)
            torch._foreach_mul_(gb, inv_scale)
        if self.w:
            wn = torch.stack(torch._foreach_norm(self.w))
            gn = torch.stack(torch._foreach_norm(gw))
            ratio = self.tc * wn / (gn + self.wd * wn + self.eps)
            ones = torch.ones_like(ratio)
            eta = torch.where((wn >= 1e-12) & (gn >= 1e-12), ratio, ones).clamp(max=100.0)
            lr_eta = (eta * self.lr).unbind()
            q = torch._foreach_add(gw, self.w, alpha=self.wd)  # p = ĝ + wd*w
            torch._foreach_mul_(q, lr_eta)                      # q = (lr*η) * p
            torch._foreach_mul_(self.mw, self.mom)
            torch._foreach_add_(self.mw, q)                     # m = β*m + q
            if self.nesterov:
                torch._foreach_add_(q, self.mw, alpha=self.mom)  # β*m + q with the new m
                torch._foreach_sub_(self.w, q)
            else:
                torch._foreach_sub_(self.w, self.mw)             # w = w - m
        if self.b:
            torch._foreach_mul_(self.mb, self.mom)
            torch._foreach_add_(self.mb, gb)                    # m = β*m + ĝ
            if self.nesterov:
                d = torch._foreach_add(gb, self.mb, alpha=self.mom)
                torch._foreach_add_(self.b, d, alpha=-self.lr)
            else:
                torch._foreach_add_(self.b, self.mb, alpha=-self.lr)  # w = w - lr*m
