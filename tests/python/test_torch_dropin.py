"""renaissance.torch as a drop-in for torch.optim: the API points torch's own tests exercise (named
parameters, the foreach/fused/capturable/differentiable flags, optimizer hooks, Tensor
hyperparameters, non-contiguous and complex parameters), with torch's error types and messages.
The installed torch may predate a feature (CI has torch 1.13): the behaviour is the library's own
and tested against torch's documented semantics; where the installed torch has the feature too,
the same calls are compared with torch.optim."""
import pytest
import torch

import renaissance.torch as rt

_TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def _bits(t):
    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).clone()


def _untouched(params):
    """A check that a refused call changed no parameter: address, bits and .grad as they were."""
    before = [(p.data_ptr(), _bits(p), p.grad) for p in params]

    def check():
        for p, (ptr, bits, grad) in zip(params, before):
            assert p.data_ptr() == ptr and torch.equal(_bits(p), bits) and p.grad is grad
    return check


# ---- named parameters ---------------------------------------------------------------------------
def test_named_parameters_are_kept_as_param_names():
    a, b = _model(), _model()
    names = [n for n, _ in a.named_parameters()]
    oa = rt.AdamW(a.named_parameters(), lr=1e-2)
    ob = rt.AdamW(b.parameters(), lr=1e-2)
    group = oa.param_groups[0]
    assert group["param_names"] == names
    assert all(p is q for p, q in zip(group["params"], a.parameters()))
    assert "param_names" not in ob.param_groups[0]
    assert oa.state_dict()["param_groups"][0]["param_names"] == names
    _train(a, oa, 3)
    _train(b, ob, 3)
    assert oa.fingerprint() == ob.fingerprint()  # the names change nothing of the step


def test_named_parameter_groups_and_add_param_group():
    model = _model()
    (n0, p0), (n1, p1), (n2, p2), (n3, p3) = model.named_parameters()
    opt = rt.SGD([{"params": [(n0, p0), (n1, p1)], "lr": 0.1}, {"params": [(n2, p2)]}], lr=0.01, momentum=0.9)
    opt.add_param_group({"params": [(n3, p3)], "lr": 0.5})
    assert [g["param_names"] for g in opt.param_groups] == [[n0, n1], [n2], [n3]]
    assert [g["params"] for g in opt.state_dict()["param_groups"]] == [[0, 1], [2], [3]]
    assert [g["param_names"] for g in opt.state_dict()["param_groups"]] == [[n0, n1], [n2], [n3]]
    _train(model, opt, 2)


def test_named_and_unnamed_mixed_is_refused():
    model = _model()
    (n0, p0), (n1, p1), (n2, p2), (n3, p3) = model.named_parameters()
    ps = [p0, p1, p2, p3]
    check = _untouched(ps)
    with pytest.raises(ValueError, match="all optimizer params should be with/without names. Some param names "
                                         "are missing"):
        rt.AdamW([(n0, p0), p1])
    with pytest.raises(ValueError, match="all optimizer param groups should be with/without names. cannot add "
                                         "param group with names to the optimizer"):
        rt.AdamW([{"params": [p0], "lr": 1e-2}, {"params": [(n1, p1)]}])
    with pytest.raises(ValueError, match="cannot add param group without names"):
        rt.AdamW([{"params": [(n0, p0)]}, {"params": [p1]}])
    check()
    opt = rt.AdamW([(n0, p0), (n1, p1)])
    check = _untouched(ps)
    with pytest.raises(ValueError, match="cannot add param group without names"):
        opt.add_param_group({"params": [p2]})
    with pytest.raises(ValueError, match="Some param names are missing"):
        opt.add_param_group({"params": [(n2, p2), p3]})
    check()
    assert len(opt.param_groups) == 1 and len(opt._bindings) == 1


def test_load_state_dict_follows_torch_for_param_names():
    """torch >= 2.6: names in the loaded groups replace the optimizer's; a state dict without
    names leaves the optimizer's names as they are."""
    named, plain = _model(), _model()
    on = rt.AdamW(named.named_parameters(), lr=1e-2)
    op = rt.AdamW(plain.parameters(), lr=1e-2)
    _train(named, on, 2)
    _train(plain, op, 2)
    names = list(on.param_groups[0]["param_names"])
    on.load_state_dict(op.state_dict())  # no names in it: kept
    assert on.param_groups[0]["param_names"] == names
    op.load_state_dict(on.state_dict())  # names in it: taken
    assert op.param_groups[0]["param_names"] == names
    other = on.state_dict()
    other["param_groups"][0]["param_names"] = ["w%d" % i for i in range(4)]
    on.load_state_dict(other)
    assert on.param_groups[0]["param_names"] == ["w0", "w1", "w2", "w3"]


@pytest.mark.skipif(_TORCH < (2, 6), reason="torch.optim takes named parameters from torch 2.6")
def test_param_names_match_torch_optim():
    a, b = _model(), _model()
    ours = rt.AdamW(a.named_parameters()).state_dict()["param_groups"][0]
    theirs = torch.optim.AdamW(b.named_parameters()).state_dict()["param_groups"][0]
    assert ours["param_names"] == theirs["param_names"] and ours["params"] == theirs["params"]
