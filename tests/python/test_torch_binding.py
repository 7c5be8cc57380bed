"""renaissance.torch: the binding between param_groups, the parameters and the Task's arena is
checked at every step. `p.data = tensor`, a second optimizer over the same parameters, reordered
or deleted groups and requires_grad turned off after construction either behave as in torch or
raise, never step a stale arena. Each test compares bits against a run that did not take the
idiom (or against torch's semantics spelled out with a second optimizer)."""
import pytest
import torch

import renaissance.torch as rt


def _params(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(dtype)) for s in ((5, 6), (5,), (3, 5), (3,))]


def _feed(ps, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        grad = torch.randn(p.shape, generator=g).to(p.dtype)
        if p.grad is None:
            p.grad = grad
        else:
            p.grad.copy_(grad)


def _bits(t):
    t = t.detach().contiguous()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).clone()


def _same(ps, qs):
    return all(torch.equal(_bits(p), _bits(q)) for p, q in zip(ps, qs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_assigning_p_data_is_followed(dtype):
    """p.data = new tensor: the next step updates the new values (torch steps whatever p.data
    is), as an in-place write of the same values does."""
    ps, qs = _params(dtype=dtype), _params(dtype=dtype)
    a, b = rt.AdamW(ps, lr=1e-2, weight_decay=0.1), rt.AdamW(qs, lr=1e-2, weight_decay=0.1)
    for s in range(2):
        _feed(ps, s), a.step()
        _feed(qs, s), b.step()
    new = torch.randn(ps[0].shape, generator=torch.Generator().manual_seed(9)).to(dtype)
    ps[0].data = new.clone()  # a new tensor: not the arena's view any more
    with torch.no_grad():
        qs[0].copy_(new)  # the reference writes the same values in place
        if dtype != torch.float32:  # in place, the copy alone changes: set the master too
            b.state[qs[0]]["master_weight"].copy_(new.float())
    for s in range(2, 4):
        _feed(ps, s), a.step()
        _feed(qs, s), b.step()
    assert _same(ps, qs)
    assert a.fingerprint() == b.fingerprint()
    assert ps[0].data_ptr() == a._bindings[0].shared.weights[0].data_ptr()  # re-bound to the arena


@pytest.mark.parametrize("new", [lambda p: torch.zeros(3, 3), lambda p: p.detach().double(),
                                 lambda p: p.detach().reshape(-1).clone()])
def test_assigning_p_data_of_another_shape_or_dtype_raises_and_changes_nothing(new):
    ps, qs = _params(), _params()
    opt, ref = rt.SGD(ps, lr=0.1, momentum=0.9), rt.SGD(qs, lr=0.1, momentum=0.9)
    _feed(ps, 0), opt.step()
    _feed(qs, 0), ref.step()
    kept = ps[0].detach().clone()
    others = [_bits(p) for p in ps[1:]]
    buffers = [_bits(opt.state[p]["momentum_buffer"]) for p in ps]
    ps[0].data = new(ps[0])
    _feed(ps[1:], 1)
    with pytest.raises(ValueError, match=r"param group 0, parameter 0 \(shape \(5, 6\)\): p.data was replaced"):
        opt.step()
    assert all(torch.equal(_bits(p), b) for p, b in zip(ps[1:], others))
    assert all(torch.equal(_bits(opt.state[p]["momentum_buffer"]), b) for p, b in zip(ps, buffers))
    ps[0].data = kept  # a tensor of the right kind again: followed, and the run goes on as the reference's
    _feed(ps, 1), opt.step()
    _feed(qs, 1), ref.step()
    assert _same(ps, qs) and opt.fingerprint() == ref.fingerprint()


def test_second_optimizer_over_the_same_parameters():
    """Two optimizers over one set of parameters: each step updates the parameters as they are
    now, with that optimizer's own state (torch's behaviour). The reference runs two optimizers
    over separate copies and hands the weights over between them."""
    ps = _params()
    first = rt.AdamW(ps, lr=1e-2, weight_decay=0.1)
    _feed(ps, 0), first.step()
    second = rt.SGD(ps, lr=0.05, momentum=0.9)  # over the same parameters
    q1, q2 = _params(), _params()
    r1, r2 = rt.AdamW(q1, lr=1e-2, weight_decay=0.1), rt.SGD(q2, lr=0.05, momentum=0.9)

    def hand_over(src, dst):
        with torch.no_grad():
            for s, d in zip(src, dst):
                d.copy_(s)

    _feed(q1, 0), r1.step()
    hand_over(q1, q2)  # the second optimizer starts from the weights as they are
    for s, (opt, ref, qs, other) in enumerate([(first, r1, q1, q2), (second, r2, q2, q1), (first, r1, q1, q2),
                                               (second, r2, q2, q1), (first, r1, q1, q2)], start=1):
        _feed(ps, s), opt.step()
        _feed(qs, s), ref.step()
        hand_over(qs, other)
        assert _same(ps, qs), s


def test_reversed_param_groups_keep_their_lrs():
    """param_groups.reverse() (or any reordering): every group keeps its own hyperparameters."""
    ps, qs = _params(), _params()
    a = rt.AdamW([{"params": ps[:2], "lr": 1e-2}, {"params": ps[2:], "lr": 1e-4}], weight_decay=0.1)
    b = rt.AdamW([{"params": qs[:2], "lr": 1e-2}, {"params": qs[2:], "lr": 1e-4}], weight_decay=0.1)
    a.param_groups.reverse()
    for s in range(3):
        if s == 1:  # an lr change through the reordered list
            a.param_groups[1]["lr"] = 5e-3
            b.param_groups[0]["lr"] = 5e-3
        _feed(ps, s), a.step()
        _feed(qs, s), b.step()
    assert _same(ps, qs)
    sa, sb = a.state_dict(), b.state_dict()
    assert [g["lr"] for g in sa["param_groups"]] == [1e-4, 5e-3]
    assert [len(g["params"]) for g in sa["param_groups"]] == [2, 2]
    # state_dict indexes the parameters in param_groups order, as torch does
    assert torch.equal(sa["state"][0]["exp_avg"], sb["state"][2]["exp_avg"])


def test_deleted_param_group_stops_stepping():
    """A group removed from param_groups is no longer stepped (torch steps what param_groups
    holds); the other groups step as before and state_dict() covers the groups left."""
    ps, qs = _params(), _params()
    a = rt.AdamW([{"params": ps[:2]}, {"params": ps[2:], "lr": 1e-3}], lr=1e-2)
    b = rt.AdamW([{"params": qs[:2]}, {"params": qs[2:], "lr": 1e-3}], lr=1e-2)
    _feed(ps, 0), a.step()
    _feed(qs, 0), b.step()
    del a.param_groups[1]
    kept = [_bits(p) for p in ps[2:]]
    for s in range(1, 3):
        _feed(ps, s), a.step()
        _feed(qs, s), b.step()
    assert all(torch.equal(_bits(p), k) for p, k in zip(ps[2:], kept))
    assert _same(ps[:2], qs[:2])
    sd = a.state_dict()
    assert len(sd["param_groups"]) == 1 and sorted(sd["state"]) == [0, 1]


def test_edited_group_params_raise():
    ps = _params()
    opt = rt.AdamW([{"params": ps[:2]}, {"params": ps[2:]}], lr=1e-2)
    _feed(ps, 0)
    before = [_bits(p) for p in ps]
    opt.param_groups[0]["params"].pop()
    with pytest.raises(ValueError, match=r"param group 0, parameter 1 \(shape \(5,\)\): the group's parameters changed"):
        opt.step()
    assert all(torch.equal(_bits(p), b) for p, b in zip(ps, before))
    opt.param_groups[0]["params"].append(ps[1])  # as it was: steps again
    opt.step()
    extra = torch.nn.Parameter(torch.zeros(2))
    opt.param_groups.append({"params": [extra], "lr": 1e-2})  # not through add_param_group
    with pytest.raises(ValueError, match="add_param_group"):
        opt.step()


@pytest.mark.parametrize("cls,ref,kw", [(rt.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.5)),
                                        (rt.SGD, torch.optim.SGD, dict(lr=1e-2, momentum=0.9, weight_decay=0.5))])
def test_requires_grad_turned_off_after_construction_steps_as_torch(cls, ref, kw):
    """A parameter frozen after construction is stepped while it has a .grad (zeroed or stale), as
    torch steps every parameter whose .grad is not None; with .grad None it stays where it is."""
    runs = []
    for make in (cls, ref):
        ps = _params()
        opt = make(ps, **kw)
        _feed(ps, 0), opt.step()
        ps[0].requires_grad_(False)
        for s in range(1, 3):
            opt.zero_grad(set_to_none=False)  # the frozen parameter keeps a zeroed .grad: stepped
            _feed(ps[1:], s)
            opt.step()
        _feed(ps, 3)  # a stale non-zero .grad on the frozen parameter
        opt.step()
        ps[0].grad = None
        held = _bits(ps[0])
        _feed(ps[1:], 4)
        opt.step()
        assert torch.equal(_bits(ps[0]), held)
        runs.append((ps, opt.state_dict()["state"]))
    (ps, steps), (qs, _) = runs
    for p, q in zip(ps, qs):
        assert float((p - q).norm()) <= 1e-5 * float(q.norm())
    assert float(steps[0]["step"]) == 4 and float(steps[1]["step"]) == 5
