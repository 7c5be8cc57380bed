"""renaissance.torch against torch.optim on real data: a small CNN on scikit-learn's digits (shipped
with sklearn, no download), 200 steps from the same initial weights. The first 20 steps must keep
every parameter within 1e-5 relative L2 of torch's, and the final test accuracy within 1 point.
The parameters we compare are the arena views themselves, so a broken re-pointing of .data/.grad
or a wrong update rule shows here."""
import copy

import numpy as np
import pytest

import torch  # noqa: E402  (CI installs it: scripts/test_python.sh)
from sklearn import datasets  # noqa: E402

import renaissance.torch as rt  # noqa: E402

STEPS = 200
CLOSE_STEPS = 20
BATCH = 64


def digits():
    d = datasets.load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(d.target, dtype=torch.int64)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def make_model():
    torch.manual_seed(0)
    # A strided conv rather than max pooling: a pooling tie broken differently by a rounding
    # difference reroutes a gradient, a discrete jump no tolerance describes.
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.Tanh(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.Tanh(), torch.nn.Flatten(),
        torch.nn.Linear(16 * 4 * 4, 10))


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), 1e-30))


def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean()) * 100.0


def train_pair(make_ours, make_theirs, steps=STEPS):
    """Trains two copies side by side on the same batches; returns the worst early relative L2
    and both final accuracies."""
    xtr, ytr, xte, yte = digits()
    ours_model = make_model()
    theirs_model = copy.deepcopy(ours_model)
    ours = make_ours(ours_model.parameters())
    theirs = make_theirs(theirs_model.parameters())
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for step in range(steps):
        idx = torch.randint(0, xtr.shape[0], (BATCH,), generator=gen)
        for model, opt in ((ours_model, ours), (theirs_model, theirs)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
        if step < CLOSE_STEPS:
            for p, q in zip(ours_model.parameters(), theirs_model.parameters()):
                worst = max(worst, rel_l2(p.detach(), q.detach()))
    return worst, accuracy(ours_model, xte, yte), accuracy(theirs_model, xte, yte), ours


CASES = {
    "adamw": (lambda p: rt.AdamW(p, lr=2e-3, weight_decay=0.05),
              lambda p: torch.optim.AdamW(p, lr=2e-3, weight_decay=0.05)),
    "adam_l2": (lambda p: rt.Adam(p, lr=2e-3, weight_decay=1e-3),
                lambda p: torch.optim.Adam(p, lr=2e-3, weight_decay=1e-3)),
    "sgd_nesterov_l2": (lambda p: rt.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
                        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    "sgd_momentum_l2": (lambda p: rt.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3),
                        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_training_matches_torch(name):
    make_ours, make_theirs = CASES[name]
    worst, acc_ours, acc_theirs, ours = train_pair(make_ours, make_theirs)
    assert worst <= 1e-5, "%s: relative L2 %.3g in the first %d steps" % (name, worst, CLOSE_STEPS)
    assert acc_theirs > 80.0, "the reference did not learn (%.1f %%)" % acc_theirs
    assert abs(acc_ours - acc_theirs) <= 1.0, "%s: accuracy %.2f vs torch %.2f" % (name, acc_ours, acc_theirs)
    assert ours._bindings[0].task.step_count == STEPS


def test_lr_scheduler_works_unchanged():
    """StepLR and a per-step LambdaLR drive both optimizers through param_groups[i]['lr']."""
    def sched(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.1 * s))

    xtr, ytr, _, _ = digits()
    a_model = make_model()
    b_model = copy.deepcopy(a_model)
    a = rt.AdamW(a_model.parameters(), lr=3e-3)
    b = torch.optim.AdamW(b_model.parameters(), lr=3e-3)
    sa, sb = sched(a), sched(b)
    for step in range(20):
        for model, opt, s in ((a_model, a, sa), (b_model, b, sb)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xtr[step * 32:(step + 1) * 32]), ytr[step * 32:(step + 1) * 32]).backward()
            opt.step()
            s.step()
    assert a.param_groups[0]["lr"] == b.param_groups[0]["lr"] < 3e-3 * 0.5
    for p, q in zip(a_model.parameters(), b_model.parameters()):
        assert rel_l2(p.detach(), q.detach()) <= 1e-5
    # The scheduler's last lr was applied to the task at the last step (not the one after).
    assert a._bindings[0].task.lr == pytest.approx(3e-3 / (1.0 + 0.1 * 19), rel=1e-15)
