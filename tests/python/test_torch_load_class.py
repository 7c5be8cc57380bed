"""renaissance.torch: load_state_dict refuses a state dict of another optimizer class (its group
keys or per-parameter state keys say so) with a ValueError naming what differs, and changes
nothing; torch.optim's dicts of the same algorithm keep loading."""
import pytest
import torch

import renaissance.torch as rt


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in ((5, 6), (5,), (3, 5))]


def _run(opt, ps, steps, first=0):
    for s in range(first, first + steps):
        g = torch.Generator().manual_seed(50 + s)
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def _snapshot(opt, ps):
    sd = opt.state_dict()
    state = {k: {n: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for n, v in s.items()}
             for k, s in sd["state"].items()}
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return state, groups, [p.detach().clone() for p in ps]


def _same_snapshot(a, b):
    (sa, ga, wa), (sb, gb, wb) = a, b
    if ga != gb or sorted(sa) != sorted(sb) or any(not torch.equal(x, y) for x, y in zip(wa, wb)):
        return False
    for k in sa:
        if sorted(sa[k]) != sorted(sb[k]):
            return False
        for n in sa[k]:
            x, y = sa[k][n], sb[k][n]
            if isinstance(x, torch.Tensor) and not torch.equal(x, y):
                return False
    return True


SGD = (rt.SGD, dict(lr=0.1, momentum=0.9))
ADAMW = (rt.AdamW, dict(lr=1e-2, weight_decay=0.1))
ADAM = (rt.Adam, dict(lr=1e-2, weight_decay=0.1))
LION = (rt.Lion, dict(lr=1e-3, weight_decay=0.1))
LARS = (rt.LARS, dict(lr=0.1, momentum=0.9))
LAMB = (rt.LAMB, dict(lr=1e-2))


@pytest.mark.parametrize("src,dst,match", [
    (SGD, ADAMW, r"'dampening', 'momentum', 'nesterov'.*lacks 'betas', 'eps'"),
    (ADAMW, SGD, r"has 'amsgrad', 'betas', 'capturable', 'eps'"),
    (LION, ADAMW, r"lacks 'eps'"),
    (ADAMW, LION, r"has 'amsgrad', 'capturable', 'decoupled_weight_decay', 'differentiable', 'eps'"),
    (SGD, LARS, r"has 'dampening'"),
    (LARS, SGD, r"has 'eps', 'trust_coefficient', 'trust_ratio'"),
    (LAMB, ADAM, r"has 'trust_ratio'"),
], ids=["sgd-adamw", "adamw-sgd", "lion-adamw", "adamw-lion", "sgd-lars", "lars-sgd", "lamb-adam"])
def test_state_dict_of_another_class_is_refused(src, dst, match):
    ps, qs = _params(), _params()
    a = src[0](ps, **src[1])
    _run(a, ps, 3)
    b = dst[0](qs, **dst[1])
    _run(b, qs, 2)
    before = _snapshot(b, qs)
    with pytest.raises(ValueError, match="load_state_dict: param group 0 does not fit %s: .*%s" % (dst[0].__name__, match)):
        b.load_state_dict(a.state_dict())
    assert _same_snapshot(_snapshot(b, qs), before)


def test_torch_sgd_state_into_adamw_is_refused():
    qs = [torch.nn.Parameter(p.detach().clone()) for p in _params()]
    t = torch.optim.SGD(qs, lr=0.1, momentum=0.9)
    _run(t, qs, 2)
    ps = _params()
    b = rt.AdamW(ps, lr=1e-2)
    _run(b, ps, 1)
    before = _snapshot(b, ps)
    with pytest.raises(ValueError, match="param group 0 does not fit AdamW: .*SGD state dict"):
        b.load_state_dict(t.state_dict())
    assert _same_snapshot(_snapshot(b, ps), before)


def test_foreign_state_keys_are_refused():
    """The groups alone may not tell (an Adam dict into LAMB's keys edited to fit, say): the
    per-parameter state keys are checked too."""
    ps, qs = _params(), _params()
    a = rt.SGD(ps, lr=0.1, momentum=0.9)
    _run(a, ps, 2)
    b = rt.SGD(qs, lr=0.1, momentum=0.9)
    _run(b, qs, 1)
    sd = a.state_dict()
    sd["state"][1]["exp_avg_sq"] = torch.zeros(5)
    before = _snapshot(b, qs)
    with pytest.raises(ValueError, match=r"parameter 1 of param group 0 has state 'exp_avg_sq'"):
        b.load_state_dict(sd)
    assert _same_snapshot(_snapshot(b, qs), before)


@pytest.mark.parametrize("dst,decoupled", [(ADAM, True), (ADAMW, False)])
def test_torch26_decoupled_weight_decay_flag_is_checked(dst, decoupled):
    """torch >= 2.6 writes 'decoupled_weight_decay' into Adam's and AdamW's groups: an AdamW dict
    (True) into an L2 Adam or an Adam dict (False) into AdamW asks for the other kind's compiled
    step, and is refused (nothing changed)."""
    qs = [torch.nn.Parameter(p.detach().clone()) for p in _params()]
    t = (torch.optim.AdamW if decoupled else torch.optim.Adam)(qs, lr=1e-2, weight_decay=0.1)
    _run(t, qs, 2)
    sd = t.state_dict()
    for g in sd["param_groups"]:
        g["decoupled_weight_decay"] = decoupled  # as torch >= 2.6 writes it
    ps = _params()
    b = dst[0](ps, **dst[1])
    _run(b, ps, 1)
    before = _snapshot(b, ps)
    want, have = ("adamw", "adam") if decoupled else ("adam", "adamw")
    with pytest.raises(ValueError, match=r"param group 0 needs another compiled step \(%s\) than this optimizer's "
                                         r"\(%s\)" % (want, have)):
        b.load_state_dict(sd)
    assert _same_snapshot(_snapshot(b, ps), before)
    sd_ok = t.state_dict()
    for g in sd_ok["param_groups"]:
        g.pop("decoupled_weight_decay", None)  # as torch < 2.6 writes it (no flag): loads
    b.load_state_dict(sd_ok)
    for g in sd_ok["param_groups"]:
        g["decoupled_weight_decay"] = not decoupled  # the matching flag: loads too
    b.load_state_dict(sd_ok)


@pytest.mark.parametrize("cls,tcls,kw", [(rt.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
                                         (rt.Adam, torch.optim.Adam, dict(lr=1e-2)),
                                         (rt.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9))])
def test_same_algorithm_still_loads(cls, tcls, kw):
    qs = [torch.nn.Parameter(p.detach().clone()) for p in _params()]
    t = tcls(qs, **kw)
    _run(t, qs, 2)
    ps = _params()
    b = cls(ps, **kw)
    b.load_state_dict(t.state_dict())
    t.load_state_dict(b.state_dict())
    c = cls(_params(), **kw)
    c.load_state_dict(b.state_dict())
