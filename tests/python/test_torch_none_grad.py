"""renaissance.torch with `.grad is None`, as torch 2.x's model.zero_grad() leaves it:
the core's per-tensor mask skips such a parameter on the device and keeps its own step count, so
a run with None gradients follows torch.optim's per-parameter semantics (including the lagging
Adam bias corrections), state_dict's `step` is per parameter, and a torch state dict whose
parameters are at different steps loads and trains on like torch. The references are
torch.optim itself (within the same 1e-5 as the other torch comparisons; torch's float
arithmetic is not ours bit for bit) and, bit for bit, one renaissance optimizer per parameter
that only ever sees that parameter's steps. CUDA variants skip without a device."""
import warnings

import numpy as np
import pytest

import torch

import renaissance.torch as rt

SHAPES = [(6, 5), (6,), (3, 2, 2, 2), (3,), (4, 4)]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
STEPS = 7


def params(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(device)) for s in SHAPES]


def grad(j, step, device):
    g = torch.Generator().manual_seed(1000 * step + j)
    return torch.randn(*SHAPES[j], generator=g).to(device)


def has_grad(j, step):
    """Which parameters get a gradient at `step`: every one is skipped at some steps, parameter 4
    for the first three, and step 3 gives one parameter only."""
    if step == 3:
        return j == 0
    if j == 4:
        return step >= 3
    return (j * 5 + step * 3) % 4 != 0


def train(ps, opt, first, last, device):
    """torch 2.x style: every step starts from None gradients; only some parameters get one."""
    for s in range(first, last):
        for j, p in enumerate(ps):
            p.grad = grad(j, s, device) if has_grad(j, s) else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # renaissance: "a foreign .grad is copied in"
            opt.step()


def bits(t):
    return t.detach().cpu().contiguous().numpy().view(np.uint32).copy()


def close(a, b, tol=1e-5):
    return float((a.detach().cpu() - b.detach().cpu()).norm()) <= tol * max(float(b.detach().cpu().norm()), 1e-30)


def expected_steps(last, first=0):
    return [sum(has_grad(j, s) for s in range(first, last)) for j in range(len(SHAPES))]


@pytest.mark.parametrize("device", DEVICES)
def test_none_gradients_follow_torch_adamw_per_parameter(device):
    kw = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    ps, qs = params(device), params(device)
    ours, theirs = rt.AdamW(ps, **kw), torch.optim.AdamW(qs, **kw)
    train(ps, ours, 0, STEPS, device)
    train(qs, theirs, 0, STEPS, device)
    steps = expected_steps(STEPS)
    assert len(set(steps)) > 1
    sd = ours.state_dict()["state"]
    for j, (p, q) in enumerate(zip(ps, qs)):
        assert int(sd[j]["step"]) == int(theirs.state[q]["step"]) == steps[j]
        assert close(p, q), j
        assert close(sd[j]["exp_avg"], theirs.state[q]["exp_avg"]) and close(sd[j]["exp_avg_sq"], theirs.state[q]["exp_avg_sq"])
    assert ours._shared()[0].task.tensor_steps is not None and ours._bindings[0].task.step_count == STEPS


@pytest.mark.parametrize("device", DEVICES)
def test_none_gradients_match_one_optimizer_per_parameter_bit_for_bit(device):
    """Two param groups in one Task (different lr and betas): each parameter's weights and state
    equal, bit for bit, those of an optimizer holding it alone that steps only when it has a
    gradient (its bias corrections use its own count)."""
    ps = params(device)
    groups = [{"params": ps[:2], "lr": 2e-2, "betas": (0.8, 0.95)}, {"params": ps[2:]}]
    opt = rt.Adam(groups, lr=1e-2, weight_decay=0.05)
    assert len(opt._shared()) == 1
    alone = []
    for j, p in enumerate(params(device)):
        g = groups[0] if j < 2 else groups[1]
        alone.append((p, rt.Adam([p], lr=g.get("lr", 1e-2), betas=g.get("betas", (0.9, 0.999)), weight_decay=0.05)))
    train(ps, opt, 0, STEPS, device)
    for j, (p, o) in enumerate(alone):
        for s in range(STEPS):
            if has_grad(j, s):
                p.grad = grad(j, s, device)
                o.step()
    sd = opt.state_dict()["state"]
    for j, (p, o) in enumerate(alone):
        assert np.array_equal(bits(ps[j]), bits(p)), j
        st = o.state_dict()["state"][0]
        assert np.array_equal(bits(sd[j]["exp_avg"]), bits(st["exp_avg"]))
        assert np.array_equal(bits(sd[j]["exp_avg_sq"]), bits(st["exp_avg_sq"]))
        assert int(sd[j]["step"]) == int(st["step"]) == expected_steps(STEPS)[j]


@pytest.mark.parametrize("device", DEVICES)
def test_torch_state_dict_with_different_steps_loads_and_continues_like_torch(device):
    kw = dict(lr=1e-2, weight_decay=0.1)
    qs = params(device)
    theirs = torch.optim.AdamW(qs, **kw)
    train(qs, theirs, 0, 4, device)
    assert len({int(theirs.state[q]["step"]) for q in qs if q in theirs.state}) > 1
    ps = [torch.nn.Parameter(q.detach().clone()) for q in qs]
    ours = rt.AdamW(ps, **kw)
    ours.load_state_dict(theirs.state_dict())
    sd = ours.state_dict()["state"]
    for j, q in enumerate(qs):
        if q not in theirs.state:  # never stepped: no state, as in torch's dict
            assert j not in sd
            continue
        assert int(sd[j]["step"]) == int(theirs.state[q]["step"])
    train(ps, ours, 4, STEPS, device)
    train(qs, theirs, 4, STEPS, device)
    sd = ours.state_dict()["state"]
    for j, (p, q) in enumerate(zip(ps, qs)):
        assert int(sd[j]["step"]) == int(theirs.state[q]["step"])
        assert close(p, q), j
    # ours -> torch: the per-parameter steps arrive as they are
    fresh = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    back = torch.optim.AdamW(fresh, **kw)
    back.load_state_dict(ours.state_dict())
    assert [int(back.state[p]["step"]) for p in fresh] == [int(theirs.state[q]["step"]) for q in qs]


def test_checkpoint_keeps_per_parameter_steps(tmp_path):
    ps = params("cpu")
    opt = rt.AdamW(ps, lr=1e-2)
    train(ps, opt, 0, 4, "cpu")
    opt.save(tmp_path / "ckpt")
    f4 = opt.fingerprint()
    steps4 = {k: int(s["step"]) for k, s in opt.state_dict()["state"].items()}
    train(ps, opt, 4, STEPS, "cpu")
    opt.load(tmp_path / "ckpt")
    assert opt.fingerprint() == f4
    # A parameter without a step yet has no state (as in torch).
    want = {j: n for j, n in enumerate(expected_steps(4)) if n}
    assert len(want) < len(SHAPES)
    assert {k: int(s["step"]) for k, s in opt.state_dict()["state"].items()} == steps4 == want


@pytest.mark.parametrize("device", DEVICES)
def test_clipping_with_none_gradients_follows_torch(device):
    """Clipping Tasks carry the mask too: the global norm leaves a None-gradient parameter out
    (its stale G in the arena is not read), as torch.nn.utils.clip_grad_norm_ over the parameters
    that have a .grad does, and each parameter keeps its own `step`."""
    kw = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    ps, qs = params(device), params(device)
    ours, theirs = rt.AdamW(ps, max_grad_norm=1.0, **kw), torch.optim.AdamW(qs, **kw)
    assert ours._shared()[0].task.tensor_steps is not None
    clipped = 0
    for s in range(STEPS):
        # Every step a gradient, alternate steps without parameters 1 and 3 (their G keeps the
        # last one they had); the norm is far above 1, so every step clips.
        for j, (p, q) in enumerate(zip(ps, qs)):
            g = grad(j, s, device) * 4 if (s % 2 == 0 or j not in (1, 3)) else None
            p.grad = g
            q.grad = None if g is None else g.clone()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours.step()
        norm = torch.nn.utils.clip_grad_norm_([q for q in qs if q.grad is not None], 1.0)
        clipped += float(norm) > 1.0
        theirs.step()
    assert clipped == STEPS
    sd = ours.state_dict()["state"]
    expected = [STEPS if j not in (1, 3) else (STEPS + 1) // 2 for j in range(len(SHAPES))]
    for j, (p, q) in enumerate(zip(ps, qs)):
        assert int(sd[j]["step"]) == int(theirs.state[q]["step"]) == expected[j]
        assert close(p, q), j
        assert close(sd[j]["exp_avg"], theirs.state[q]["exp_avg"]) and close(sd[j]["exp_avg_sq"], theirs.state[q]["exp_avg_sq"])


@pytest.mark.parametrize("device", DEVICES)
def test_unmasked_program_until_the_first_none_gradient(device):
    """While every parameter gets a gradient the Task runs its unmasked program (the speed of a
    Task without the mask), from the first None gradient on the masked one; the bits are those of
    a run that took the masked program from the start."""
    kw = dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)
    ps, qs = params(device), params(device)
    ours, ref = rt.AdamW(ps, **kw), rt.AdamW(qs, **kw)
    task, ref_task = ours._shared()[0].task, ref._shared()[0].task
    ref_task.tensor_mask_written(True)  # the reference: the masked program over a mask of zeros
    for s in range(5):
        for ps_, opt in ((ps, ours), (qs, ref)):
            for j, p in enumerate(ps_):
                p.grad = None if (s == 3 and j == 2) else grad(j, s, device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt.step()
        assert task.masked_program_next == (s >= 3), s
        assert ref_task.masked_program_next
    assert ours.fingerprint() == ref.fingerprint()
    assert [int(v["step"]) for v in ours.state_dict()["state"].values()] == [5, 5, 4, 5, 5]
