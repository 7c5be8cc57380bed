"""An infinite weight under torch's L2 weight decay of 0 (SGD, Adam; and the bias-like group of
every kind, whose decay is 0): torch skips the term g + 0*w, so the weight stays infinite and
the rest of the tensor updates as torch's; 0*inf used to make it NaN."""
import math

import pytest

import torch  # noqa: E402  (CI installs it: scripts/test_python.sh)

import renaissance.torch as rt  # noqa: E402


def params():
    g = torch.Generator().manual_seed(3)
    ps = [torch.nn.Parameter(torch.randn(5, 4, generator=g)), torch.nn.Parameter(torch.randn(4, generator=g))]
    with torch.no_grad():
        ps[0][1, 2] = math.inf
        ps[1][3] = -math.inf
    return ps


CASES = {
    "sgd": (rt.SGD, torch.optim.SGD, dict(lr=0.05)),
    "sgd_momentum": (rt.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
    "sgd_nesterov": (rt.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True)),
    "sgd_damped": (rt.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.3)),
    "adam": (rt.Adam, torch.optim.Adam, dict(lr=1e-2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_infinite_weight_with_zero_l2_decay(name):
    ours_cls, theirs_cls, kw = CASES[name]
    a, b = params(), params()
    ours, theirs = ours_cls(a, weight_decay=0.0, **kw), theirs_cls(b, weight_decay=0.0, **kw)
    for step in range(3):
        g = torch.Generator().manual_seed(20 + step)
        for p, q in zip(a, b):
            q.grad = torch.randn(*q.shape, generator=g)
            p.grad = q.grad.clone()
        ours.step()
        theirs.step()
        for p, q in zip(a, b):
            assert not torch.isnan(p).any(), (name, step)
            assert torch.equal(torch.isinf(p), torch.isinf(q)) and torch.equal(p[torch.isinf(p)], q[torch.isinf(q)])
            finite = torch.isfinite(q)
            assert float((p[finite].double() - q[finite].double()).abs().max()) < 1e-6, (name, step)
