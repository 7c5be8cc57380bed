"""renaissance.torch's maximize=True (docs/math.md, "Maximize"): SGD, Adam and AdamW follow
torch.optim's maximize=True step by step; every class (LARS, Lion, LAMB too) maximizing on G is bit
for bit the same class minimizing on -G; the GradScaler protocol keeps the sign per group; the
flag is a group key (edited between steps, kept by state_dict and by save/load); .grad is left as
it is; a value that is not a bool is refused."""
import copy

import pytest

import torch  # noqa: E402  (CI installs it: scripts/test_python.sh)

import renaissance.torch as rt  # noqa: E402

from torch_test_util import grads, max_diff, params, same_bits, step_alongside  # noqa: E402

STEPS = 5


def feed(ps, step, sign=1.0, scale=1.0):
    for p, g in zip(ps, grads(step)):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        p.grad.copy_(g * (sign * scale))


# (ours, torch's) with the same arguments, torch's maximize=True on both sides.
TORCH_CASES = {
    "sgd": (rt.SGD, torch.optim.SGD, dict(lr=0.05)),
    "sgd_wd": (rt.SGD, torch.optim.SGD, dict(lr=0.05, weight_decay=0.1)),
    "sgd_momentum": (rt.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    "sgd_nesterov": (rt.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "adam": (rt.Adam, torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1)),
    "adamw": (rt.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
}


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_maximize_follows_torch_optim(name):
    ours_cls, theirs_cls, kw = TORCH_CASES[name]
    a, b = params(), params()
    ours = ours_cls(a, maximize=True, **kw)
    theirs = theirs_cls(b, maximize=True, **kw)
    start = [p.detach().clone() for p in a]
    for step in range(STEPS):
        feed(a, step)
        feed(b, step)
        given = [p.grad.detach().clone() for p in a]
        ours.step()
        theirs.step()
        # torch's rule: .grad is not changed by maximize.
        assert all(same_bits(p.grad, g) for p, g in zip(a, given))
        assert max_diff(a, b) < 1e-6, (name, step, max_diff(a, b))
    # It ascended: the run differs from a minimizing one by far more than the tolerance.
    c = params()
    down = ours_cls(c, **kw)
    for step in range(STEPS):
        feed(c, step)
        down.step()
    assert max_diff(a, c) > 1e-3
    assert max_diff(a, start) > 1e-3


ALL_CLASSES = {
    "sgd_momentum": (rt.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    "adam": (rt.Adam, dict(lr=1e-2, weight_decay=0.1)),
    "adamw": (rt.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    "lars": (rt.LARS, dict(lr=0.1, weight_decay=1e-3)),
    "lion": (rt.Lion, dict(lr=1e-3, weight_decay=0.1)),
    "lamb": (rt.LAMB, dict(lr=1e-2)),
}


@pytest.mark.parametrize("name", sorted(ALL_CLASSES))
@pytest.mark.parametrize("clip", [None, 0.5])
def test_maximize_on_g_is_minimize_on_negated_g(name, clip):
    cls, kw = ALL_CLASSES[name]
    a, b = params(), params()
    up = cls(a, maximize=True, max_grad_norm=clip, **kw)
    down = cls(b, maximize=False, max_grad_norm=clip, **kw)
    for step in range(STEPS):
        feed(a, step)
        feed(b, step, sign=-1.0)
        up.step()
        down.step()
    assert all(same_bits(p, q) for p, q in zip(a, b))
    assert up.fingerprint() == down.fingerprint()
    assert all(g["maximize"] is True for g in up.param_groups)


@pytest.mark.parametrize("name", sorted(ALL_CLASSES))
def test_grad_scaler_keeps_the_sign_per_group(name):
    """torch 2.x's GradScaler protocol (grad_scale, found_inf on the optimizer) with two groups of
    which only the first maximizes: the scaled run gives the bits of the unscaled one (a power of
    two scales exactly), so each group's 1/scale slot carries its own sign."""
    cls, kw = ALL_CLASSES[name]
    a, b = params(), params()
    scaled = cls([{"params": a[:2], "maximize": True}, {"params": a[2:]}], **kw)
    plain = cls([{"params": b[:2], "maximize": True}, {"params": b[2:]}], **kw)
    assert len(scaled._shared()) == 1  # the groups share one Task: one slot per block
    for step in range(STEPS):
        feed(a, step, scale=1024.0)
        feed(b, step)
        scaled.grad_scale = torch.tensor(1024.0)
        scaled.found_inf = torch.tensor(0.0)
        scaled.step()
        plain.step()
    assert all(same_bits(p, q) for p, q in zip(a, b))
    # And the unscaled run is the minimizing one on -G for the first group only.
    c = params()
    neg = cls(c, **kw)
    for step in range(STEPS):
        feed(c, step)
        for p in c[:2]:
            p.grad.neg_()
        neg.step()
    assert all(same_bits(p, q) for p, q in zip(b, c))


def test_maximize_edited_in_param_groups_follows_torch():
    a, b = params(), params()
    ours = rt.AdamW(a, lr=1e-2)
    theirs = torch.optim.AdamW(b, lr=1e-2)
    for step in range(STEPS):
        if step == 2:
            for opt in (ours, theirs):
                opt.param_groups[0]["maximize"] = True
        if step == 4:
            for opt in (ours, theirs):
                opt.param_groups[0]["maximize"] = False
        step_alongside(ours, theirs, a, b, step, feed)


def test_state_dict_round_trip_keeps_maximize():
    a, c, d = params(), params(), params()
    ours = rt.AdamW(a, lr=1e-2, maximize=True)
    for step in range(2):
        feed(a, step)
        ours.step()
    sd = ours.state_dict()
    assert sd["param_groups"][0]["maximize"] is True
    with torch.no_grad():
        for p, q, r in zip(c, d, a):
            p.copy_(r)
            q.copy_(r)
    # Into an optimizer built minimizing, ours and torch's: the loaded group maximizes from then on.
    again = rt.AdamW(c, lr=1e-2)
    theirs = torch.optim.AdamW(d, lr=1e-2)
    again.load_state_dict(sd)
    theirs.load_state_dict(copy.deepcopy(sd))  # torch keeps the tensors it is given: not our views
    assert again.param_groups[0]["maximize"] is True and theirs.param_groups[0]["maximize"] is True
    assert again.state_dict()["param_groups"][0]["maximize"] is True
    for step in range(2, STEPS):
        for ps, opt in ((a, ours), (c, again), (d, theirs)):
            feed(ps, step)
            opt.step()
    assert all(same_bits(p, q) for p, q in zip(a, c))
    assert max_diff(c, d) < 1e-6


def test_checkpoint_save_load_keeps_maximize(tmp_path):
    a, b = params(), params()
    whole = rt.SGD(a, lr=0.05, momentum=0.9, maximize=True)
    for step in range(2):
        feed(a, step)
        whole.step()
    with torch.no_grad():
        for p, q in zip(b, a):
            p.copy_(q)
    path = tmp_path / "max.ckpt"
    whole.save(path)
    for step in range(2, STEPS):
        feed(a, step)
        whole.step()
    resumed = rt.SGD(b, lr=0.05, momentum=0.9, maximize=True)
    resumed.load(path)
    for step in range(2, STEPS):
        feed(b, step)
        resumed.step()
    assert all(same_bits(p, q) for p, q in zip(a, b))
    assert resumed.fingerprint() == whole.fingerprint()


def test_maximize_must_be_a_bool():
    for cls in (rt.SGD, rt.Adam, rt.AdamW, rt.LARS, rt.Lion, rt.LAMB):
        ps = params()
        with pytest.raises(ValueError, match="maximize=1: expected True or False"):
            cls(ps, lr=0.01, maximize=1)
        assert all(p.grad is None for p in ps)
    ps = params()
    opt = rt.Adam(ps, lr=0.01)
    feed(ps, 0)
    opt.param_groups[0]["maximize"] = "yes"
    before = [p.detach().clone() for p in ps]
    with pytest.raises(ValueError, match="expected True or False"):
        opt.step()
    assert all(same_bits(p, q) for p, q in zip(ps, before))


def test_a_maximizing_recording_replays(tmp_path):
    """The Recorder writes the group's maximize into case.json (a minimizing group's optimizer has
    no such key) and the replay (renaissance.replay, the code of `renaissance replay`) reaches the
    recorded fingerprint with one group maximizing and one not, in one Task."""
    import json
    import renaissance
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = rt.AdamW([{"params": model[0].parameters(), "maximize": True},
                    {"params": model[2].parameters(), "lr": 1e-2}], lr=1e-3, threads=1)
    assert len(opt._shared()) == 1
    x = torch.randn(32, 12)
    y = torch.randint(0, 4, (32,))
    case = str(tmp_path / "case")
    with rt.Recorder(opt, case, steps=3):
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    with open(tmp_path / "case" / "case.json") as f:
        groups = json.load(f)["groups"]
    assert groups[0]["optimizer"]["maximize"] is True and "maximize" not in groups[1]["optimizer"]
    assert renaissance.replay(case, threads=2)["fingerprint"] == opt.fingerprint()
    # The flag matters to the replay: without it the case no longer passes.
    with open(tmp_path / "case" / "case.json") as f:
        c = json.load(f)
    del c["groups"][0]["optimizer"]["maximize"]
    with open(tmp_path / "case" / "case.json", "w") as f:
        json.dump(c, f)
    assert renaissance.replay(case, threads=2)["fingerprint"] != opt.fingerprint()
