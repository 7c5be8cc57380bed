"""renaissance.torch.SGD's dampening (docs/math.md, "SGD dampening"): per step as torch.optim.SGD
(the first step's buffer is the gradient, later steps add (1 - dampening) times it), with L2 or
without weight decay; torch's validation and texts; a dampening edited in param_groups; state
dicts both ways mid-run (a torch state with a momentum_buffer has stepped, even without a
`step`); save/load."""
import math

import pytest

import torch  # noqa: E402  (CI installs it: scripts/test_python.sh)

import renaissance.torch as rt  # noqa: E402

from torch_test_util import max_diff, params, step_alongside  # noqa: E402
STEPS = 6


def feed(ps, step, seed=10):
    g = torch.Generator().manual_seed(seed + step)
    for p in ps:
        p.grad = torch.randn(*p.shape, generator=g)


CASES = {
    "plain": dict(lr=0.05, momentum=0.9, dampening=0.3),
    "l2": dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.1),
    "full": dict(lr=0.05, momentum=0.5, dampening=1.0),
    "negative": dict(lr=0.02, momentum=0.9, dampening=-0.5),  # torch checks no range
    "no_momentum": dict(lr=0.05, dampening=0.7),  # no buffer: torch ignores it
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_dampening_follows_torch_optim_sgd(name):
    kw = CASES[name]
    a, b = params(), params()
    ours, theirs = rt.SGD(a, **kw), torch.optim.SGD(b, **kw)
    for step in range(STEPS):
        feed(a, step)
        feed(b, step)
        ours.step()
        theirs.step()
        assert max_diff(a, b) < 1e-6, (name, step, max_diff(a, b))
        if kw.get("momentum"):
            m = [ours.state[p]["momentum_buffer"] for p in a]
            t = [theirs.state[p]["momentum_buffer"] for p in b]
            assert max_diff(m, t) < 1e-6, (name, step)


def test_dampening_changes_the_run():
    # Not a no-op: after the first step (undamped, the same bits) the buffers differ.
    a, b = params(), params()
    damped, plain = rt.SGD(a, lr=0.05, momentum=0.9, dampening=0.3), rt.SGD(b, lr=0.05, momentum=0.9)
    feed(a, 0)
    feed(b, 0)
    damped.step()
    plain.step()
    assert max_diff(a, b) == 0.0
    feed(a, 1)
    feed(b, 1)
    damped.step()
    plain.step()
    assert max_diff(a, b) > 1e-3


def torch_error(make):
    with pytest.raises(Exception) as info:
        make(params())
    return info.type, str(info.value)


@pytest.mark.parametrize("kw", [dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True),
                                dict(lr=0.1, momentum=0.0, dampening=0.0, nesterov=True),
                                dict(lr=0.1, nesterov=True)])
def test_nesterov_with_dampening_is_torchs_error(kw):
    kind, text = torch_error(lambda p: torch.optim.SGD(p, **kw))
    assert text == "Nesterov momentum requires a momentum and zero dampening"
    ps = params()
    with pytest.raises(kind, match="^" + text + "$"):
        rt.SGD(ps, **kw)
    assert all(p.grad is None for p in ps)


def test_dampening_that_is_not_a_number():
    # torch fails in its step ('int' - 'str'); this class at construction, with torch's type.
    with pytest.raises(TypeError):
        rt.SGD(params(), lr=0.1, momentum=0.9, dampening="0.1")
    # float32 cannot hold it: the documented stricter rule.
    for bad in (math.inf, math.nan, 1e39):
        with pytest.raises(ValueError, match="dampening"):
            rt.SGD(params(), lr=0.1, momentum=0.9, dampening=bad)


def test_dampening_edited_in_param_groups():
    kw = dict(lr=0.05, momentum=0.9)
    a, b = params(), params()
    ours, theirs = rt.SGD(a, **kw), torch.optim.SGD(b, **kw)
    for step in range(STEPS):
        d = [0.0, 0.0, 0.4, 0.4, 0.0, 0.9][step]
        ours.param_groups[0]["dampening"] = d
        theirs.param_groups[0]["dampening"] = d
        step_alongside(ours, theirs, a, b, step, feed)
    # A value nesterov cannot take, set between steps, is refused at the step, the weights kept.
    ours.param_groups[0]["nesterov"] = True
    ours.param_groups[0]["dampening"] = 0.5
    before = [p.detach().clone() for p in a]
    feed(a, 9)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        ours.step()
    assert max_diff(a, before) == 0.0


def run(opt, ps, steps, first=0):
    for step in range(first, first + steps):
        feed(ps, step)
        opt.step()


@pytest.mark.parametrize("direction", ["torch_to_ours", "ours_to_torch"])
def test_state_dict_mid_run_both_ways(direction):
    kw = dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.01)
    ref_ps = params()
    ref = torch.optim.SGD(ref_ps, **kw)
    run(ref, ref_ps, 6)
    src_cls, dst_cls = (torch.optim.SGD, rt.SGD) if direction == "torch_to_ours" else (rt.SGD, torch.optim.SGD)
    a = params()
    src = src_cls(a, **kw)
    run(src, a, 3)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    dst = dst_cls(b, **kw)
    sd = src.state_dict()
    assert sd["param_groups"][0]["dampening"] == 0.3
    dst.load_state_dict(sd)
    assert dst.param_groups[0]["dampening"] == 0.3
    # torch's SGD state has no `step`: its buffer says the first (undamped) step is done.
    run(dst, b, 3, first=3)
    assert max_diff(b, ref_ps) < 1e-6, max_diff(b, ref_ps)


def test_state_dict_round_trip_keeps_dampening():
    kw = dict(lr=0.05, momentum=0.9, dampening=0.3)
    a = params()
    ours = rt.SGD(a, **kw)
    run(ours, a, 2)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    other = rt.SGD(b, lr=0.05, momentum=0.9)
    other.load_state_dict(ours.state_dict())
    assert other.param_groups[0]["dampening"] == 0.3
    run(ours, a, 3, first=2)
    run(other, b, 3, first=2)
    assert max_diff(a, b) == 0.0


def test_save_and_load_keep_dampening(tmp_path):
    kw = dict(lr=0.05, momentum=0.9, dampening=0.3)
    a = params()
    ours = rt.SGD(a, **kw)
    run(ours, a, 2)
    path = str(tmp_path / "sgd.ckpt")
    ours.save(path)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    other = rt.SGD(b, **kw)
    other.load(path)
    run(ours, a, 3, first=2)
    run(other, b, 3, first=2)
    assert max_diff(a, b) == 0.0
