"""renaissance.torch as a drop-in for torch.optim: the API points torch's own tests exercise (named
parameters, the foreach/fused/capturable/differentiable flags, optimizer hooks, Tensor
hyperparameters, non-contiguous and complex parameters), with torch's error types and messages.
The installed torch may predate a feature (CI has torch 1.13): the behaviour is the library's own
and tested against torch's documented semantics; where the installed torch has the feature too,
the same calls are compared with torch.optim."""
import pytest
import torch
import torch.optim.optimizer as torch_optimizer  # torch.optim deletes the attribute on some versions

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


# ---- foreach, fused, capturable, differentiable ---------------------------------------------------
_FLAG_CLASSES = [(rt.SGD, dict(lr=0.1, momentum=0.9), ("foreach", "fused")),
                 (rt.Adam, dict(lr=1e-2), ("foreach", "fused", "capturable")),
                 (rt.AdamW, dict(lr=1e-2), ("foreach", "fused", "capturable"))]


@pytest.mark.parametrize("cls,kw,flags", _FLAG_CLASSES)
def test_foreach_fused_capturable_are_accepted_and_kept(cls, kw, flags):
    """Every value torch takes is accepted and kept where torch keeps it (defaults, each group,
    the state dict's groups); the step is the library's one fused step whatever they say."""
    values = {"foreach": [None, False, True], "fused": [None, False, True], "capturable": [False, True]}
    ref_model = _model()
    ref = cls(ref_model.parameters(), **kw)
    _train(ref_model, ref, 2)
    for flag in flags:
        for value in values[flag]:
            if flag == "foreach" and value:
                extra = {"fused": False}
            else:
                extra = {}
            model = _model()
            opt = cls(model.parameters(), **kw, **{flag: value}, **extra)
            assert opt.defaults[flag] is value and opt.param_groups[0][flag] is value
            assert opt.state_dict()["param_groups"][0][flag] is value
            _train(model, opt, 2)
            assert opt.fingerprint() == ref.fingerprint(), (flag, value)
    models = [_model(), _model()]
    ps, qs = (list(m.parameters()) for m in models)
    opt = cls([{"params": ps[:2], "fused": True}, {"params": ps[2:], "foreach": False}], **kw)
    plain = cls([{"params": qs[:2]}, {"params": qs[2:]}], **kw)
    assert opt.param_groups[0]["fused"] is True and opt.param_groups[0]["foreach"] is None
    assert opt.param_groups[1]["foreach"] is False and opt.param_groups[1]["fused"] is None
    _train(models[0], opt, 2)
    _train(models[1], plain, 2)
    assert opt.fingerprint() == plain.fingerprint()


@pytest.mark.parametrize("cls,kw,flags", _FLAG_CLASSES)
def test_state_dict_with_torch_flags_loads(cls, kw, flags):
    """A torch state dict of a fused / foreach / capturable torch optimizer loads, its flags kept."""
    a, b = _model(), _model()
    oa, ob = cls(a.parameters(), **kw), cls(b.parameters(), **kw)
    _train(a, oa, 2)
    sd = oa.state_dict()
    for flag in flags:
        sd["param_groups"][0][flag] = True if flag != "foreach" else False
    ob.load_state_dict(sd)
    for flag in flags:
        assert ob.param_groups[0][flag] is sd["param_groups"][0][flag]
    got, want = ob.state_dict()["state"], oa.state_dict()["state"]
    for k in want:
        for key, t in want[k].items():
            assert torch.equal(_bits(got[k][key]), _bits(t)), (k, key)


@pytest.mark.parametrize("cls,kw,flags", _FLAG_CLASSES)
def test_flag_errors_are_torchs(cls, kw, flags):
    ps = list(_model().parameters())
    check = _untouched(ps)
    with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together"):
        cls(ps, **kw, fused=True, foreach=True)
    with pytest.raises(RuntimeError, match="`fused` does not support `differentiable`"):
        cls(ps, **kw, differentiable=True)
    with pytest.raises(ValueError, match="fused='yes': expected True, False or None"):
        cls(ps, **kw, fused="yes")
    check()
    opt = cls(ps, **kw)
    opt.param_groups[0]["differentiable"] = True
    w = [_bits(p) for p in ps]
    for p in ps:
        p.grad = torch.ones_like(p)
    with pytest.raises(RuntimeError, match="`fused` does not support `differentiable`"):
        opt.step()
    assert all(torch.equal(_bits(p), x) for p, x in zip(ps, w))


# ---- hooks ----------------------------------------------------------------------------------------
def _loss_of(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 6, generator=g)
    return model(x).square().mean()


def test_step_hooks_run_in_torchs_order_once_each():
    model = _model()
    opt = rt.AdamW(model.parameters(), lr=1e-2)
    w = model[0].weight
    seen = []

    def hook(name):
        def run(o, args, kwargs):
            assert o is opt and args[0] is opt  # torch passes the optimizer first in args
            seen.append((name, torch.equal(_bits(w), before), len(args), dict(kwargs)))
        return run
    handles = [rt.register_optimizer_step_post_hook(hook("global post")),
               opt.register_step_post_hook(hook("post")),
               opt.register_step_pre_hook(hook("pre")),
               rt.register_optimizer_step_pre_hook(hook("global pre"))]
    try:
        _loss_of(model).backward()
        before = _bits(w)
        opt.step()
        # Pre-hooks before the step (weights as they were), post-hooks after it.
        assert seen == [("global pre", True, 1, {}), ("pre", True, 1, {}), ("post", False, 1, {}),
                        ("global post", False, 1, {})]
        seen.clear()
        before = _bits(w)
        loss = opt.step(closure=lambda: torch.tensor(3.0))
        assert float(loss) == 3.0 and [s[0] for s in seen] == ["global pre", "pre", "post", "global post"]
        assert all(len(s[3]) == 1 for s in seen)  # the closure keyword, as passed
    finally:
        for h in handles:
            h.remove()
    seen.clear()
    before = _bits(w)
    opt.step()
    assert seen == []  # removed


def test_step_pre_hook_can_replace_the_arguments():
    model = _model()
    opt = rt.SGD(model.parameters(), lr=0.1)
    calls = []

    def closure():
        calls.append(1)
        return torch.tensor(7.0)
    h = opt.register_step_pre_hook(lambda o, args, kwargs: (args, {"closure": closure}))
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    assert float(opt.step()) == 7.0 and calls == [1]
    h.remove()
    opt.register_step_pre_hook(lambda o, args, kwargs: 5)
    w = [_bits(p) for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"must return None or a tuple of \(new_args, new_kwargs\), but got 5"):
        opt.step()
    assert all(torch.equal(_bits(p), x) for p, x in zip(model.parameters(), w))


@pytest.mark.skipif(not hasattr(torch_optimizer, "register_optimizer_step_pre_hook"),
                    reason="torch's global step hooks exist from torch 2.0")
def test_torchs_global_step_hooks_reach_these_optimizers_once():
    model = _model()
    opt = rt.AdamW(model.parameters())
    seen = []
    handles = [torch_optimizer.register_optimizer_step_pre_hook(lambda o, a, k: seen.append("pre")),
               torch_optimizer.register_optimizer_step_post_hook(lambda o, a, k: seen.append("post"))]
    try:
        opt.step()
    finally:
        for h in handles:
            h.remove()
    assert seen == ["pre", "post"]


def test_state_dict_hooks():
    model = _model()
    opt = rt.AdamW(model.parameters(), lr=1e-2)
    _train(model, opt, 1)
    order = []
    opt.register_state_dict_pre_hook(lambda o: order.append("pre"))
    opt.register_state_dict_pre_hook(lambda o: order.append("pre first"), prepend=True)

    def post(o, sd):
        order.append("post")
        sd["param_groups"][0]["note"] = "edited"

    def replace(o, sd):
        order.append("replace")
        return {"state": sd["state"], "param_groups": sd["param_groups"], "extra": 1}
    opt.register_state_dict_post_hook(replace)
    opt.register_state_dict_post_hook(post, prepend=True)
    sd = opt.state_dict()
    assert order == ["pre first", "pre", "post", "replace"]
    assert sd["extra"] == 1 and sd["param_groups"][0]["note"] == "edited"
    assert "note" not in opt.param_groups[0]  # the state dict's groups are copies


def test_load_state_dict_hooks_and_their_effects_stay():
    """The pre-hook sees a shallow copy and may return the dict to load; the post-hook runs after
    everything is loaded, so what it writes into opt.state (the arena's views) and param_groups
    is what the next step uses."""
    src_model = _model()
    src = rt.AdamW(src_model.parameters(), lr=1e-2)
    _train(src_model, src, 2)
    sd = src.state_dict()

    def pre(o, d):
        d["extra"] = 1  # the shallow copy, not the caller's dict
        groups = [dict(g, lr=0.05) for g in d["param_groups"]]
        return {"state": d["state"], "param_groups": groups}

    def post(o):
        first = o.param_groups[0]["params"][0]
        o.state[first]["exp_avg"].zero_()
        o.param_groups[0]["lr"] = 0.02

    a_model, b_model = _model(), _model()
    a = rt.AdamW(a_model.parameters(), lr=1e-2)
    b = rt.AdamW(b_model.parameters(), lr=1e-2)
    a.register_load_state_dict_pre_hook(pre)
    a.register_load_state_dict_post_hook(post)
    a.load_state_dict(sd)
    assert "extra" not in sd
    # The same edits by hand after a plain load:
    b.load_state_dict(sd)
    b.state[b.param_groups[0]["params"][0]]["exp_avg"].zero_()
    b.param_groups[0]["lr"] = 0.02
    assert a.param_groups[0]["lr"] == 0.02
    assert torch.count_nonzero(a.state_dict()["state"][0]["exp_avg"]) == 0
    assert a.fingerprint() == b.fingerprint()
    _train(a_model, a, 2)
    _train(b_model, b, 2)
    assert a.fingerprint() == b.fingerprint()
    c_model = _model()
    c = rt.AdamW(c_model.parameters(), lr=1e-2)
    c.load_state_dict(sd)
    _train(c_model, c, 2)
    assert c.fingerprint() != a.fingerprint()  # the post-hook's edits changed the run
    order = []
    c.register_load_state_dict_post_hook(lambda o: order.append("second"))
    c.register_load_state_dict_post_hook(lambda o: order.append("first"), prepend=True)
    c.register_load_state_dict_pre_hook(lambda o, d: order.append("pre"))
    c.load_state_dict(sd)
    assert order == ["pre", "first", "second"]


# ---- Tensor hyperparameters -------------------------------------------------------------------------
@pytest.mark.parametrize("cls,kw", [(rt.SGD, dict(momentum=0.9)), (rt.Adam, {}), (rt.AdamW, {}),
                                    (rt.Lion, {}), (rt.LAMB, {}), (rt.LARS, {})])
def test_tensor_lr_steps_as_its_value(cls, kw):
    """A 1-element Tensor lr is kept in param_groups (the same object) and read at every step:
    the bits of the same float, and an in-place edit (torch 2.x's schedulers fill_ it) takes
    effect at the next step as editing a float lr does."""
    lr = torch.tensor([0.01], dtype=torch.float64)  # exact: the same double as the float below
    ta, fa = _model(), _model()
    ot = cls(ta.parameters(), lr=lr, **kw)
    of = cls(fa.parameters(), lr=0.01, **kw)
    assert ot.param_groups[0]["lr"] is lr and ot.state_dict()["param_groups"][0]["lr"] is lr
    _train(ta, ot, 2)
    _train(fa, of, 2)
    assert ot.fingerprint() == of.fingerprint()
    lr.fill_(0.003)
    of.param_groups[0]["lr"] = 0.003
    _train(ta, ot, 2, seed=5)
    _train(fa, of, 2, seed=5)
    assert ot.fingerprint() == of.fingerprint()
    lr.fill_(0.5)
    _train(ta, ot, 1, seed=6)
    _train(fa, of, 1, seed=6)
    assert ot.fingerprint() != of.fingerprint()  # the edit is read, not a value taken once


@pytest.mark.parametrize("cls", [rt.Adam, rt.AdamW])
def test_tensor_betas_step_as_their_values(cls):
    ta, fa = _model(), _model()
    ot = cls(ta.parameters(), lr=1e-2, betas=(torch.tensor(0.8, dtype=torch.float64),
                                              torch.tensor(0.95, dtype=torch.float64)))
    of = cls(fa.parameters(), lr=1e-2, betas=(0.8, 0.95))
    _train(ta, ot, 3)
    _train(fa, of, 3)
    assert ot.fingerprint() == of.fingerprint()
    capturable = cls(_model().parameters(), lr=torch.tensor(0.01), betas=(torch.tensor(0.9), torch.tensor(0.99)),
                     foreach=True, capturable=True)  # torch takes Tensors with foreach when capturable
    assert capturable.param_groups[0]["foreach"] is True


def test_tensor_hyperparameter_errors_are_torchs():
    ps = list(_model().parameters())
    check = _untouched(ps)
    t = torch.tensor
    for cls, kw, error in [
            (rt.SGD, dict(lr=t([0.1, 0.2])), "Tensor lr must be 1-element"),
            (rt.AdamW, dict(lr=t([0.1, 0.2])), "Tensor lr must be 1-element"),
            (rt.Lion, dict(lr=t([0.1, 0.2])), "Tensor lr must be 1-element"),
            (rt.Adam, dict(lr=t(0.001), foreach=True),
             "lr as a Tensor is not supported for capturable=False and foreach=True"),
            (rt.AdamW, dict(lr=t(-0.1)), "Invalid learning rate: tensor"),
            (rt.AdamW, dict(betas=(t(0.9), 0.99)), "betas must be either both floats or both Tensors"),
            (rt.Adam, dict(betas=(t([0.9, 0.8]), t(0.99))), r"Tensor betas\[0\] must be 1-element"),
            (rt.AdamW, dict(betas=(t(0.9), t(0.99)), foreach=True),
             r"betas\[0\] as a Tensor is not supported for capturable=False and foreach=True"),
            (rt.AdamW, dict(betas=(t(0.9), t(1.0))), "Invalid beta parameter at index 1"),
            (rt.SGD, dict(lr=0.1, momentum=t(0.9)), "momentum as a tensor is not supported")]:
        with pytest.raises(ValueError, match=error):
            cls(ps, **kw)
        check()
    opt = rt.AdamW(ps, lr=t(0.01))
    opt.param_groups[0]["lr"] = t([0.01, 0.02])
    for p in ps:
        p.grad = torch.ones_like(p)
    w = [_bits(p) for p in ps]
    with pytest.raises(ValueError, match="Tensor lr must be 1-element"):
        opt.step()
    assert all(torch.equal(_bits(p), x) for p, x in zip(ps, w))


# ---- non-contiguous and complex parameters -----------------------------------------------------------
def _strided_params(seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3).t()),                               # transposed
            torch.nn.Parameter(torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)),
            torch.nn.Parameter(torch.randn(12)[::3]),                                 # a stride of 3
            torch.nn.Parameter(torch.randn(4))]


def _feed(ps, seed):
    g = torch.Generator().manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)


@pytest.mark.parametrize("cls,kw", [(rt.AdamW, dict(lr=1e-2, weight_decay=0.1)),
                                    (rt.SGD, dict(lr=0.1, momentum=0.9)), (rt.LAMB, {})])
def test_non_contiguous_parameters_are_copied_in_and_become_contiguous(cls, kw):
    """torch takes them; here they are copied into the arena like the others and then view it:
    the same values, contiguous from then on, and the steps of contiguous copies bit for bit."""
    ps = _strided_params()
    assert not any(p.is_contiguous() for p in ps[:3])
    values = [p.detach().clone() for p in ps]
    qs = [torch.nn.Parameter(p.detach().contiguous()) for p in ps]
    op, oq = cls(ps, **kw), cls(qs, **kw)
    for p, v in zip(ps, values):
        assert p.is_contiguous() and torch.equal(p.detach(), v)
    for s in range(3):
        _feed(ps, s)
        _feed(qs, s)
        op.step()
        oq.step()
    assert op.fingerprint() == oq.fingerprint()
    assert all(torch.equal(_bits(p), _bits(q)) for p, q in zip(ps, qs))


def test_parameter_whose_elements_share_memory_is_refused():
    ps = _strided_params()
    shared = torch.nn.Parameter(torch.zeros(1).expand(3))
    check = _untouched(ps)
    with pytest.raises(ValueError, match="has elements that share memory"):
        rt.AdamW(ps + [shared])
    check()


def _complex_pair(seed=0):
    torch.manual_seed(seed)
    z = torch.nn.Parameter(torch.randn(3, 4, dtype=torch.complex64))
    w = torch.nn.Parameter(torch.randn(5))
    pair = [z, w], [torch.nn.Parameter(torch.view_as_real(z.detach()).clone()), torch.nn.Parameter(w.detach().clone())]
    for p in pair[0] + pair[1]:
        p.grad = torch.zeros_like(p)  # construction points it at the arena's G (complex: its complex view)
    return pair


def _complex_backward(ps, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 2, generator=g)
    z, w = ps
    z = z if z.is_complex() else torch.view_as_complex(z)
    ((z @ torch.view_as_complex(x)).abs().square().sum() + (w * w).sum()).backward()


@pytest.mark.parametrize("cls,kw", [(rt.AdamW, dict(lr=1e-2, weight_decay=0.1)), (rt.Adam, dict(lr=1e-2)),
                                    (rt.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.1))])
@pytest.mark.parametrize("set_to_none", [True, False])
def test_complex_parameters_step_as_their_real_view(cls, kw, set_to_none):
    """torch's rule (view_as_real): a complex64 parameter steps as its real view, with the bits
    of a float32 parameter holding that view; it stays complex (.data, .grad, its state), and a
    float32 parameter can share its group."""
    ps, rs = _complex_pair()
    op, orr = cls(ps, **kw), cls(rs, **kw)
    z = ps[0]
    assert z.dtype == torch.complex64 and z.grad.dtype == torch.complex64
    for s in range(4):
        for o in (op, orr):
            o.zero_grad(set_to_none=set_to_none)
        _complex_backward(ps, s)
        _complex_backward(rs, s)
        op.step()
        orr.step()
    assert z.dtype == torch.complex64 and z.grad.dtype == torch.complex64 and z.is_complex()
    assert torch.equal(_bits(torch.view_as_real(z.detach())), _bits(rs[0])) and torch.equal(_bits(ps[1]), _bits(rs[1]))
    assert op.fingerprint() == orr.fingerprint()
    for key, t in op.state[z].items():
        if key != "step":
            assert t.dtype == torch.complex64 and torch.equal(_bits(t), _bits(orr.state[rs[0]][key])), key
    if set_to_none:
        assert op._shared()[0].in_place_steps == 4  # the complex .grad autograd made, read where it is


def test_complex_parameters_against_torch_optim():
    torch.manual_seed(0)
    z = torch.nn.Parameter(torch.randn(3, 4, dtype=torch.complex64))
    q = torch.nn.Parameter(z.detach().clone())
    ours, theirs = rt.AdamW([z], lr=1e-2, weight_decay=0.1), torch.optim.AdamW([q], lr=1e-2, weight_decay=0.1)
    for s in range(5):
        x = torch.randn(4, dtype=torch.complex64)
        for a, o in ((z, ours), (q, theirs)):
            o.zero_grad()
            (a @ x).abs().square().sum().backward()
            o.step()
    assert float((z - q).abs().max()) < 1e-5
    sd = ours.state_dict()
    assert sd["state"][0]["exp_avg"].dtype == torch.complex64
    assert float((sd["state"][0]["exp_avg"] - theirs.state[q]["exp_avg"]).abs().max()) < 1e-5
    # torch's state dict loads (the complex buffers as their real view), and ours into torch.
    z2 = torch.nn.Parameter(q.detach().clone())
    back = rt.AdamW([z2], lr=1e-2, weight_decay=0.1)
    back.load_state_dict(theirs.state_dict())
    assert torch.equal(_bits(back.state[z2]["exp_avg_sq"]), _bits(theirs.state[q]["exp_avg_sq"]))
    q2 = torch.nn.Parameter(z.detach().clone())
    torch_back = torch.optim.AdamW([q2], lr=1e-2, weight_decay=0.1)
    torch_back.load_state_dict(ours.state_dict())
    assert torch.equal(_bits(torch_back.state[q2]["exp_avg"]), _bits(ours.state[z]["exp_avg"]))


def test_complex_errors():
    ps, _ = _complex_pair()
    check = _untouched(ps)
    with pytest.raises(ValueError, match="complex128: renaissance.torch takes float32, bfloat16, float16 and complex64"):
        rt.AdamW(ps + [torch.nn.Parameter(torch.zeros(2, dtype=torch.complex128))])
    check()
    a = rt.AdamW([ps[0]])
    ps[0].grad = torch.ones_like(ps[0])
    a.step()  # the state exists from the first step on, as in torch
    sd = a.state_dict()
    sd["state"][0] = dict(sd["state"][0], exp_avg=torch.zeros(3, 4))  # real where complex belongs
    before = _bits(a.state[ps[0]]["exp_avg"])
    with pytest.raises(ValueError, match="'exp_avg' is torch.float32 for a torch.complex64 parameter"):
        a.load_state_dict(sd)
    assert torch.equal(_bits(a.state[ps[0]]["exp_avg"]), before)


@pytest.mark.parametrize("cls", [rt.SGD, rt.Adam, rt.AdamW, rt.LARS, rt.Lion, rt.LAMB])
def test_step_runs_through_torchs_default_implementation_name(cls):
    """torch's classes step through a module-level function (torch.optim.adamw._multi_tensor_adamw
    by default), and torch's test_defaults_changed_to_foreach patches it in the optimizer's module
    and asserts that step() called it: ours is renaissance.torch._multi_tensor_<class>."""
    from unittest import mock
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 5)
    opt = cls(model.parameters(), lr=0.1)
    model(torch.rand(2, 5)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    with mock.patch.object(rt, "_multi_tensor_" + cls.__name__.lower()) as mocked:
        opt.step()
    assert mocked.called
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # the mock ran instead
    opt.step()  # unpatched: the real step runs
    assert not all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
