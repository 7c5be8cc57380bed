"""renaissance.torch: common torch idioms that must not change state silently (the state-dict
round trip, frozen parameters) and torch's argument rules at every entry point (the constructor
and param_groups edits before a step). Bit-pattern comparisons against a second optimizer that
did not take the idiom."""
import pytest
import torch

import renaissance.torch as rt


def _model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).to(dtype)


def _train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 6, generator=g).to(next(model.parameters()).dtype)
        opt.zero_grad()
        model(x).float().square().mean().backward()
        opt.step()


def _bits(t):
    t = t.detach().contiguous()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_own_state_dict_is_a_no_op(dtype):
    a, b = _model(dtype), _model(dtype)
    oa = rt.AdamW(a.parameters(), lr=1e-2, weight_decay=0.1)
    ob = rt.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
    _train(a, oa, 3)
    _train(b, ob, 3)
    before = {k: {n: _bits(v) for n, v in s.items() if isinstance(v, torch.Tensor)}
              for k, s in oa.state_dict()["state"].items()}
    oa.load_state_dict(oa.state_dict())  # torch: a no-op
    after = oa.state_dict()["state"]
    for k, s in before.items():
        for n, bits in s.items():
            assert torch.equal(_bits(after[k][n]), bits), (k, n)
    _train(a, oa, 2, seed=7)
    _train(b, ob, 2, seed=7)
    assert oa.fingerprint() == ob.fingerprint()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(_bits(p), _bits(q))


@pytest.mark.parametrize("cls,kw", [(rt.AdamW, dict(lr=1e-2, weight_decay=0.5)),
                                    (rt.SGD, dict(lr=1e-2, momentum=0.9, weight_decay=0.5)),
                                    (rt.Lion, dict(lr=1e-3, weight_decay=0.5))])
def test_frozen_parameters_are_never_updated(cls, kw):
    model = _model()
    first = model[0]
    for p in first.parameters():
        p.requires_grad_(False)
    frozen = [_bits(p) for p in first.parameters()]
    opt = cls(model.parameters(), **kw)  # all parameters, as fine-tuning code passes them
    for p in first.parameters():
        assert p.grad is None
    trained = [_bits(p) for p in model[2].parameters()]
    _train(model, opt, 3)
    opt.zero_grad(set_to_none=False)
    _train(model, opt, 1)
    for p, bits in zip(first.parameters(), frozen):
        assert p.grad is None
        assert torch.equal(_bits(p), bits)
    assert any(not torch.equal(_bits(p), bits) for p, bits in zip(model[2].parameters(), trained))


@pytest.mark.parametrize("cls,kw,match", [
    (rt.SGD, dict(lr=0.1, momentum=-0.5), "Invalid momentum value: -0.5"),
    (rt.SGD, dict(lr=-0.1), "Invalid learning rate: -0.1"),
    (rt.SGD, dict(lr=0.1, weight_decay=-1.0), "Invalid weight_decay value: -1.0"),
    (rt.Adam, dict(lr=-1e-3), "Invalid learning rate: -0.001"),
    (rt.AdamW, dict(eps=-1e-8), "Invalid epsilon value: -1e-08"),
    (rt.AdamW, dict(betas=(1.0, 0.999)), "Invalid beta parameter at index 0: 1.0"),
    (rt.Adam, dict(betas=(0.9, -0.1)), "Invalid beta parameter at index 1: -0.1"),
    (rt.AdamW, dict(weight_decay=-0.01), "Invalid weight_decay value: -0.01"),
])
def test_constructor_refuses_what_torch_refuses(cls, kw, match):
    with pytest.raises(ValueError, match=match):
        cls(_model().parameters(), **kw)


@pytest.mark.parametrize("cls,kw", [(rt.AdamW, dict(lr=True)), (rt.SGD, dict(lr="0.1")), (rt.SGD, dict(lr=None)),
                                    (rt.Adam, dict(betas=("0.9", 0.999))), (rt.SGD, dict(lr=0.1, momentum="0.9"))])
def test_a_hyperparameter_that_is_not_a_number_is_a_type_error(cls, kw):
    # torch refuses a str lr with a TypeError (its range check compares it with a float); a bool,
    # which torch takes as 0 or 1, is refused the same way (a stricter rule, docs/python.md).
    with pytest.raises(TypeError, match="expected a number"):
        cls(_model().parameters(), **kw)
    model = _model()
    opt = cls(model.parameters(), lr=0.1)
    fp = opt.fingerprint()
    opt.param_groups[0].update(kw)
    for _ in range(2):  # at every step while it stands, nothing changed
        with pytest.raises(TypeError, match="expected a number"):
            _train(model, opt, 1)
        assert opt.fingerprint() == fp


def test_sparse_parameters_are_a_value_error():
    p = torch.zeros(4, 3).to_sparse().requires_grad_()
    with pytest.raises(ValueError, match="sparse"):
        rt.SGD([p], lr=0.1)
    model = _model()
    opt = rt.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="sparse"):
        opt.add_param_group({"params": [p]})
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("threads", [2 ** 40, 2 ** 31, -1, True, 1.5])
def test_threads_out_of_range_is_a_clear_value_error(threads):
    with pytest.raises(ValueError, match=r"threads.*\[0, 2\*\*31\)"):
        rt.SGD(_model().parameters(), lr=0.1, threads=threads)


def test_bare_tensor_params_is_a_type_error():
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts"):
        rt.SGD(torch.zeros(3, requires_grad=True), lr=0.1)


@pytest.mark.parametrize("key,value,match", [("momentum", -0.5, "Invalid momentum value"),
                                             ("lr", -1.0, "Invalid learning rate"),
                                             ("lr", float("inf"), "must be finite")])
def test_bad_param_groups_edit_is_refused_at_every_step_and_changes_nothing(key, value, match):
    model = _model()
    opt = rt.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, opt, 1)
    good = opt.param_groups[0][key]
    fp = opt.fingerprint()
    opt.param_groups[0][key] = value
    for _ in range(2):  # refused again while the bad value stands, not replaced by the old one
        with pytest.raises(ValueError, match=match):
            _train(model, opt, 1)
        assert opt.fingerprint() == fp
        assert opt.param_groups[0][key] == value
    opt.param_groups[0][key] = good
    _train(model, opt, 1)
    assert opt.fingerprint() != fp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepcopy_gives_a_working_independent_optimizer(dtype):
    import copy
    model = _model(dtype)
    opt = rt.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    _train(model, opt, 3)
    model2, opt2 = copy.deepcopy((model, opt))
    assert opt2.fingerprint() == opt.fingerprint()
    assert all(p2 is not p for p2, p in zip(model2.parameters(), model.parameters()))
    assert all(a is b for a, b in zip([p for g in opt2.param_groups for p in g["params"]], model2.parameters()))
    fp = opt.fingerprint()
    _train(model2, opt2, 2, seed=5)  # the copy steps; the original is untouched
    assert opt.fingerprint() == fp
    _train(model, opt, 2, seed=5)  # the same gradients: the same bits
    assert opt.fingerprint() == opt2.fingerprint()
    for p, q in zip(model.parameters(), model2.parameters()):
        assert torch.equal(_bits(p), _bits(q))


def test_pickling_is_refused_when_pickling():
    import pickle
    opt = rt.SGD(_model().parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(TypeError, match="cannot pickle a SGD"):
        pickle.dumps(opt)
    pickle.dumps(opt.state_dict())  # the documented way


@pytest.mark.parametrize("step", [-3.0, 2.5, float("nan"), 2.0 ** 31, "2"])
def test_refused_load_state_dict_changes_nothing(step):
    import copy
    model = _model()
    opt = rt.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, 2)
    fp, sd = opt.fingerprint(), opt.state_dict()
    steps = [int(s["step"]) for s in sd["state"].values()]
    bad = copy.deepcopy(sd)
    bad["param_groups"][0]["lr"] = 0.5
    bad["state"][0]["step"] = torch.tensor(step) if isinstance(step, float) else step
    with pytest.raises(ValueError, match="step="):
        opt.load_state_dict(bad)
    assert opt.param_groups[0]["lr"] == 1e-2
    assert opt.fingerprint() == fp
    assert [int(s["step"]) for s in opt.state_dict()["state"].values()] == steps


@pytest.mark.parametrize("key,bad", [("momentum", 0.0), ("max_grad_norm", 1.0), ("lr", -1.0)])
def test_a_refused_param_groups_edit_loses_no_other_groups_edit(key, bad):
    # param_groups edited in two groups, the second edit one the step refuses: the first group's
    # new lr must still reach the next step once the bad value is put back (it was recorded as
    # applied while the device kept the old lr).
    def run(refuse_once):
        model = _model()
        opt = rt.SGD([{"params": model[0].parameters()}, {"params": model[2].parameters()}], lr=0.01, momentum=0.9)
        _train(model, opt, 1)
        opt.param_groups[0]["lr"] = 0.3
        if refuse_once:
            fp = opt.fingerprint()
            good = opt.param_groups[1].get(key)
            opt.param_groups[1][key] = bad
            for _ in range(2):
                with pytest.raises(ValueError):
                    _train(model, opt, 1)
                assert opt.fingerprint() == fp
            opt.param_groups[1][key] = good
        _train(model, opt, 2, seed=3)
        return opt.fingerprint(), [p.detach().clone() for p in model.parameters()]

    fp_plain, w_plain = run(False)
    fp_refused, w_refused = run(True)
    assert fp_refused == fp_plain
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(w_plain, w_refused))


@pytest.mark.parametrize("cls,key,bad", [(rt.LARS, "momentum", -1.0), (rt.LARS, "trust_coefficient", -1.0),
                                         (rt.LAMB, "eps", -1.0), (rt.Lion, "lr", -1.0)])
def test_a_value_only_the_core_refuses_leaves_load_state_dict_without_effect(cls, key, bad):
    # The kinds without a torch counterpart take their range rules from the core: a loaded
    # group's value must be checked there before the load changes any state or group.
    model = _model()
    opt = cls([{"params": model[0].parameters()}, {"params": model[2].parameters()}])
    _train(model, opt, 2)
    fp, groups = opt.fingerprint(), [dict(g) for g in opt.param_groups]
    import copy
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][0]["lr"] = 0.5
    sd["param_groups"][1][key] = bad
    for s in sd["state"].values():
        for v in s.values():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                v.add_(1.0)
    with pytest.raises(ValueError, match="load_state_dict: param group 1: invalid %s" % key):
        opt.load_state_dict(sd)
    assert opt.fingerprint() == fp
    assert [dict(g) for g in opt.param_groups] == groups
