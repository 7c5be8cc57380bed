"""renaissance.torch's amsgrad=True (Adam, AdamW; docs/math.md, "AMSGrad"): the parameters follow
torch.optim's amsgrad=True step by step; state_dict() holds torch's max_exp_avg_sq only with amsgrad;
a state dict round-trips both ways (torch -> ours -> torch continues like torch alone); groups may
differ in it (each gets its own core Task); an edit of it after construction and a value that is
not a bool are refused."""
import numpy as np
import pytest

import torch  # noqa: E402  (CI installs it: scripts/test_python.sh)

import renaissance.torch as rt  # noqa: E402

SHAPES = [(6, 5), (6,), (3, 2, 2, 2), (3,)]
STEPS = 8
# Large gradients first, then small ones: v falls below its running max, so amsgrad decides the step.
AMPLITUDE = [4.0, 2.0, 0.1, 0.5, 0.02, 1.0, 0.01, 0.2]
TOL = 1e-6  # the tolerance of the other torch.optim comparisons (test_torch_maximize.py)

# beta2 = 0.8: v forgets a large gradient within a few steps, so vmax and v part far.
CASES = {
    "adam": (rt.Adam, torch.optim.Adam, dict(lr=1e-2, betas=(0.9, 0.8), weight_decay=0.1)),
    "adamw": (rt.AdamW, torch.optim.AdamW, dict(lr=1e-2, betas=(0.9, 0.8), weight_decay=0.1)),
}


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]


def feed(ps, step, seed=10):
    g = torch.Generator().manual_seed(seed + step)
    for p, s in zip(ps, SHAPES):
        p.grad = torch.randn(*s, generator=g) * AMPLITUDE[step % len(AMPLITUDE)]


def max_diff(a, b):
    return max(float((x.detach().double() - y.detach().double()).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(CASES))
def test_amsgrad_follows_torch_optim(name):
    ours_cls, theirs_cls, kw = CASES[name]
    a, b, c = params(), params(), params()
    ours = ours_cls(a, amsgrad=True, **kw)
    theirs = theirs_cls(b, amsgrad=True, **kw)
    plain = ours_cls(c, **kw)
    for step in range(STEPS):
        for ps in (a, b, c):
            feed(ps, step)
        ours.step()
        theirs.step()
        plain.step()
        assert max_diff(a, b) < TOL, (name, step, max_diff(a, b))
    # amsgrad mattered: the run without it ends far from torch's amsgrad run.
    assert max_diff(c, b) > 100 * TOL
    for i, p in enumerate(a):
        st, ts = ours.state[p], theirs.state[b[i]]
        assert set(st) == set(ts) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
        # Relative (the values are squared gradients, up to ~16): torch's addcmul rounds otherwise.
        want = ts["max_exp_avg_sq"].double()
        assert float((st["max_exp_avg_sq"].double() - want).abs().max() / want.abs().max()) < TOL
    assert ours.param_groups[0]["amsgrad"] is True


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_has_max_exp_avg_sq_only_with_amsgrad(name):
    ours_cls, _, kw = CASES[name]
    for amsgrad in (False, True):
        ps = params()
        opt = ours_cls(ps, amsgrad=amsgrad, **kw)
        feed(ps, 0)
        opt.step()
        sd = opt.state_dict()
        assert sd["param_groups"][0]["amsgrad"] is amsgrad
        for st in sd["state"].values():
            assert ("max_exp_avg_sq" in st) is amsgrad
            if amsgrad:  # after one step vmax is v
                assert torch.equal(st["max_exp_avg_sq"], st["exp_avg_sq"])


def continue_side_by_side(a_ps, a_opt, b_ps, b_opt, name):
    """Steps 4..STEPS-1 of both optimizers on the same gradients, their parameters within TOL."""
    for step in range(4, STEPS):
        feed(a_ps, step)
        feed(b_ps, step)
        a_opt.step()
        b_opt.step()
        assert max_diff(a_ps, b_ps) < TOL, (name, step, max_diff(a_ps, b_ps))


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_round_trip_both_ways(name):
    ours_cls, theirs_cls, kw = CASES[name]
    # torch -> ours: torch runs 4 steps, ours continues from its state dict; torch alone goes on.
    t_ps = params()
    theirs = theirs_cls(t_ps, amsgrad=True, **kw)
    for step in range(4):
        feed(t_ps, step)
        theirs.step()
    o_ps = [torch.nn.Parameter(p.detach().clone()) for p in t_ps]
    ours = ours_cls(o_ps, amsgrad=True, **kw)
    ours.load_state_dict(theirs.state_dict())
    for i, p in enumerate(o_ps):
        assert torch.equal(ours.state[p]["max_exp_avg_sq"], theirs.state[t_ps[i]]["max_exp_avg_sq"])
    continue_side_by_side(o_ps, ours, t_ps, theirs, name)
    # ours -> torch: ours runs 4 steps, torch continues from its state dict.
    o_ps = params(1)
    ours = ours_cls(o_ps, amsgrad=True, **kw)
    ref_ps = params(1)
    ref = theirs_cls(ref_ps, amsgrad=True, **kw)
    for step in range(4):
        feed(o_ps, step)
        feed(ref_ps, step)
        ours.step()
        ref.step()
    t_ps = [torch.nn.Parameter(p.detach().clone()) for p in o_ps]
    theirs = theirs_cls(t_ps, amsgrad=True, **kw)
    sd = ours.state_dict()
    sd = {"state": {k: {n: t.detach().clone() for n, t in v.items()} for k, v in sd["state"].items()},
          "param_groups": sd["param_groups"]}
    theirs.load_state_dict(sd)
    continue_side_by_side(t_ps, theirs, ref_ps, ref, name)


def test_groups_may_differ_in_amsgrad():
    a, b = params(), params()
    ours = rt.Adam([{"params": a[:2], "amsgrad": True}, {"params": a[2:]}], lr=1e-2)
    theirs = torch.optim.Adam([{"params": b[:2], "amsgrad": True}, {"params": b[2:]}], lr=1e-2)
    for step in range(STEPS):
        feed(a, step)
        feed(b, step)
        ours.step()
        theirs.step()
        assert max_diff(a, b) < TOL, (step, max_diff(a, b))
    assert "max_exp_avg_sq" in ours.state[a[0]] and "max_exp_avg_sq" not in ours.state[a[2]]


def test_amsgrad_edit_after_construction_and_non_bool_are_refused():
    ps = params()
    opt = rt.AdamW(ps, lr=1e-2)
    feed(ps, 0)
    opt.step()
    before = [p.detach().clone() for p in ps]
    opt.param_groups[0]["amsgrad"] = True
    feed(ps, 1)
    with pytest.raises(ValueError, match="cannot change amsgrad after construction"):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(ps, before))
    for value in (1, "yes", None):
        with pytest.raises(ValueError, match="amsgrad="):
            rt.Adam(params(), amsgrad=value)
    # Other kinds have no amsgrad keyword, as in torch.
    with pytest.raises(TypeError):
        rt.SGD(params(), lr=0.1, amsgrad=True)
    np.testing.assert_equal(opt.param_groups[0]["amsgrad"], True)


def test_an_amsgrad_recording_replays_and_a_late_one_is_refused(tmp_path):
    """The replay key `amsgrad`: a Recorder writes it into case.json and the replay, a core Task
    of its own, reaches the recorded fingerprint (VMAX included); a recording that starts after a
    step is refused (a case holds no max_exp_avg_sq)."""
    import json
    import os

    import renaissance
    from renaissance.recorder import Recorder

    ps = params()
    opt = rt.AdamW(ps, lr=1e-2, betas=(0.9, 0.8), amsgrad=True)
    case = str(tmp_path / "case")
    with Recorder(opt, case, steps=STEPS) as rec:
        for step in range(STEPS):
            feed(ps, step)
            opt.step()
    with open(os.path.join(case, "case.json")) as f:
        assert json.load(f)["groups"][0]["optimizer"]["amsgrad"] is True
    assert renaissance.replay(case)["fingerprint"] == rec.fingerprint
    with pytest.raises(ValueError, match="uses amsgrad and has stepped"):
        Recorder(opt, str(tmp_path / "late"), steps=1)
