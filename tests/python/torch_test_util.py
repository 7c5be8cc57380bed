"""Shared by the renaissance.torch tests on the CPU: a small layout of four parameters, their
seeded values and gradients, bit views, and the distance between two parameter lists."""
import numpy as np
import torch

SHAPES = [(6, 5), (6,), (3, 2, 2, 2), (3,)]


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]


def grads(step, seed=10):
    g = torch.Generator().manual_seed(seed + step)
    return [torch.randn(*s, generator=g) for s in SHAPES]


def bits(t):
    return t.detach().cpu().contiguous().numpy().view(np.uint32).copy()


def same_bits(a, b):
    return np.array_equal(bits(a), bits(b))


def max_diff(a, b):
    return max(float((x.detach().double() - y.detach().double()).abs().max()) for x, y in zip(a, b))


def step_alongside(ours, theirs, a, b, step, feed):
    """One step of `ours` on the parameters `a` and of torch's `theirs` on `b`, each list given
    feed(params, step) first; afterwards the two lists must be within 1e-6."""
    feed(a, step)
    feed(b, step)
    ours.step()
    theirs.step()
    assert max_diff(a, b) < 1e-6, (step, max_diff(a, b))
