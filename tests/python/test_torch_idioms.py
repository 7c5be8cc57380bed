"""renaissance.torch against torch.optim on idioms of torch's own optimizer tests: a parameter is
stepped iff its .grad is not None (requires_grad is not looked at), a parameter that has not
stepped has no state in state_dict() (and a dict without state for a parameter gives it fresh
state), a sparse gradient is refused at step() with nothing changed, and a fractional loaded
`step` is refused. The references are torch.optim itself, within the 1e-5 of the other torch
comparisons (torch's float arithmetic is not ours bit for bit)."""
import copy
import warnings

import numpy as np
import pytest
import torch

import renaissance.torch as rt

CASES = [
    (rt.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.5, weight_decay=0.1)),
    (rt.Adam, torch.optim.Adam, dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)),
    (rt.AdamW, torch.optim.AdamW, dict(lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1)),
]
IDS = ["SGD", "Adam", "AdamW"]


def close(a, b, tol=1e-5):
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return float((a - b).norm()) <= tol * max(float(b.norm()), 1e-30)


def bits(t):
    return t.detach().contiguous().view(torch.int32).clone()


def randn(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def step(opt):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # renaissance: "a foreign .grad is copied in"
        opt.step()


def moved_copies(params):
    """test_state_dict_with_cuda_params's copies: made under no_grad (requires_grad=False), each
    given the original's gradient."""
    with torch.no_grad():
        copies = [p.detach().clone() for p in params]
        for c, p in zip(copies, params):
            c.grad = p.grad.detach().clone()
    assert not any(c.requires_grad for c in copies)
    return copies


@pytest.mark.parametrize("ours,theirs,kw", CASES, ids=IDS)
def test_state_dict_with_copied_params_steps_them_as_torch(ours, theirs, kw):
    """torch's test_state_dict_with_cuda_params on one device: the copies have requires_grad=False
    and a .grad, which torch steps; after loading the original's state both move alike, and like
    torch's optimizers doing the same."""
    runs = {}
    for name, cls in (("ours", ours), ("torch", theirs)):
        params = [torch.nn.Parameter(randn((2, 3), j)) for j in range(2)]
        for j, p in enumerate(params):
            p.grad = randn((2, 3), 10 + j)
        opt = cls(params, **kw)
        for _ in range(3):
            step(opt)
        copies = moved_copies(params)
        opt_copies = cls(copies, **kw)
        opt_copies.load_state_dict(copy.deepcopy(opt.state_dict()))
        start = [bits(c) for c in copies]
        for _ in range(5):
            step(opt)
            step(opt_copies)
        assert not any(torch.equal(bits(c), s) for c, s in zip(copies, start)), name
        runs[name] = (params, copies, opt_copies.state_dict())
    params, copies, sd = runs["ours"]
    for p, c in zip(params, copies):
        assert torch.equal(bits(p), bits(c))  # ours against ours: the same bits
    tparams, tcopies, tsd = runs["torch"]
    for c, t in zip(copies, tcopies):
        assert close(c, t)
    for k, st in tsd["state"].items():
        for key, value in st.items():
            assert close(torch.as_tensor(sd["state"][k][key]).float(), torch.as_tensor(value).float()), (k, key)


@pytest.mark.parametrize("ours,theirs,kw", CASES, ids=IDS)
def test_a_frozen_parameter_given_a_grad_is_stepped_and_one_without_is_not(ours, theirs, kw):
    """requires_grad=False at construction: no .grad is given to it (weight decay never touches it
    while .grad is None); once the user assigns one it is stepped as torch steps it; frozen after
    construction with a (zeroed) .grad still there, it is stepped too, as in torch."""
    results = []
    for cls in (ours, theirs):
        ps = [torch.nn.Parameter(randn((4, 3), j)) for j in range(3)]
        ps[1].requires_grad_(False)
        opt = cls(ps, **kw)
        assert ps[1].grad is None
        frozen = bits(ps[1])
        for s in range(2):
            ps[0].grad, ps[2].grad = randn((4, 3), 100 + s), randn((4, 3), 200 + s)
            step(opt)
        assert torch.equal(bits(ps[1]), frozen)  # no .grad: not stepped, weight decay included
        ps[1].grad = randn((4, 3), 300)  # assigned by the user: stepped from now on
        step(opt)
        assert not torch.equal(bits(ps[1]), frozen)
        ps[2].requires_grad_(False)
        opt.zero_grad(set_to_none=False)  # ps[2] keeps a zeroed .grad: torch steps it (decay)
        ps[0].grad.copy_(randn((4, 3), 400))
        before = bits(ps[2])
        step(opt)
        assert not torch.equal(bits(ps[2]), before)
        results.append(ps)
    for p, q in zip(*results):
        assert close(p, q)


@pytest.mark.parametrize("ours,theirs,kw", CASES, ids=IDS)
def test_state_dict_has_no_state_for_parameters_that_never_stepped(ours, theirs, kw):
    ps, qs = ([torch.nn.Parameter(randn((3, 2), j)) for j in range(3)] for _ in range(2))
    opt, topt = ours(ps, **kw), theirs(qs, **kw)
    assert opt.state_dict()["state"] == {} == topt.state_dict()["state"]
    for s in range(2):
        for group in (ps, qs):
            group[0].grad, group[1].grad, group[2].grad = randn((3, 2), s), None, randn((3, 2), 50 + s)
        step(opt), step(topt)
    sd, tsd = opt.state_dict()["state"], topt.state_dict()["state"]
    assert sorted(sd) == sorted(tsd) == [0, 2]
    assert ps[1] not in opt.state or not opt.state[ps[1]]


def _sgd_run(load_from, params, grads_at, steps, kw):
    opt = torch.optim.SGD(params, **kw)
    if load_from is not None:
        opt.load_state_dict(load_from)
    for s in steps:
        for j, p in enumerate(params):
            p.grad = grads_at(j, s)
        opt.step()


def test_torch_sgd_loading_our_state_dict_matches_torch_from_scratch():
    """torch's SGD with dampening loads our state dict, taken before any step and after steps in
    which one parameter never had a gradient, and goes on as torch's own run would: a parameter
    with a zero momentum buffer in the dict would be dampened at its first step instead."""
    kw = dict(lr=0.1, momentum=0.9, dampening=0.5)
    def grad(j, s):
        return None if (j == 1 and s < 3) else randn((3, 2), 10 * s + j)
    # Before any step.
    ps, qs = ([torch.nn.Parameter(randn((3, 2), j)) for j in range(2)] for _ in range(2))
    sd = rt.SGD(ps, **kw).state_dict()
    _sgd_run(copy.deepcopy(sd), ps, grad, range(3, 6), kw)
    _sgd_run(None, qs, grad, range(3, 6), kw)
    for p, q in zip(ps, qs):
        assert close(p, q)
    # After three steps in which parameter 1 had no gradient.
    ps, qs = ([torch.nn.Parameter(randn((3, 2), j)) for j in range(2)] for _ in range(2))
    opt = rt.SGD(ps, **kw)
    for s in range(3):
        for j, p in enumerate(ps):
            p.grad = grad(j, s)
        step(opt)
    sd = copy.deepcopy(opt.state_dict())
    fresh = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    _sgd_run(sd, fresh, grad, range(3, 6), kw)
    _sgd_run(None, qs, grad, range(6), kw)
    for p, q in zip(fresh, qs):
        assert close(p, q)


@pytest.mark.parametrize("ours,theirs,kw", CASES, ids=IDS)
def test_loading_a_dict_without_state_for_a_parameter_gives_it_fresh_state(ours, theirs, kw):
    """Our optimizer loads a state dict (ours or torch's) in which parameter 1 has no state, after
    its own parameter 1 had stepped: that parameter's next step is a first step, as torch's."""
    def grad(j, s):
        return None if (j == 1 and s < 2) else randn((3, 2), 10 * s + j)
    for source in (ours, theirs):
        src = [torch.nn.Parameter(randn((3, 2), j)) for j in range(2)]
        sopt = source(src, **kw)
        for s in range(2):
            for j, p in enumerate(src):
                p.grad = grad(j, s)
            step(sopt)
        sd = copy.deepcopy(sopt.state_dict())
        assert 1 not in sd["state"]
        ps = [torch.nn.Parameter(p.detach().clone()) for p in src]
        qs = [torch.nn.Parameter(p.detach().clone()) for p in src]
        opt = ours(ps, **kw)
        for p in ps:  # parameter 1 steps here first: its state must not survive the load
            p.grad = randn((3, 2), 99)
        step(opt)
        with torch.no_grad():
            for p, q in zip(ps, qs):
                p.copy_(q)
        opt.load_state_dict(sd)
        assert 1 not in opt.state_dict()["state"]
        topt = theirs(qs, **kw)
        topt.load_state_dict(copy.deepcopy(sd))
        for s in range(2, 5):
            for group in (ps, qs):
                for j, p in enumerate(group):
                    p.grad = grad(j, s)
            step(opt), step(topt)
        for p, q in zip(ps, qs):
            assert close(p, q), source


@pytest.mark.parametrize("ours,kw,match", [
    (rt.SGD, dict(lr=0.1, momentum=0.9), r"SGD: sparse gradients are not supported by renaissance\.torch "
                                         r"\(parameter 1 of param_groups\[0\]\); use torch\.optim\.SparseAdam"),
    (rt.Adam, dict(lr=1e-2), r"Adam does not support sparse gradients, please consider SparseAdam instead"),
    (rt.AdamW, dict(lr=1e-2), r"AdamW does not support sparse gradients.*parameter 1 of param_groups\[0\]"),
])
def test_a_sparse_gradient_is_refused_at_step_with_nothing_changed(ours, kw, match):
    ps = [torch.nn.Parameter(randn((2,), j)) for j in range(2)]
    opt = ours(ps, **kw)
    for p in ps:
        p.grad = randn((2,), 7)
    step(opt)
    sd_before, fp = copy.deepcopy(opt.state_dict()), opt.fingerprint()
    ps[0].grad = randn((2,), 8)
    ps[1].grad = randn((2,), 9).to_sparse()  # test_rosenbrock_sparse's gradient
    with pytest.raises(RuntimeError, match=match):
        opt.step()
    assert opt.fingerprint() == fp
    sd = opt.state_dict()
    for k, st in sd_before["state"].items():
        for key, value in st.items():
            assert torch.equal(torch.as_tensor(sd["state"][k][key]), torch.as_tensor(value))


def test_a_sparse_embedding_is_refused_at_step():
    emb = torch.nn.Embedding(5, 3, sparse=True)
    opt = rt.SGD(emb.parameters(), lr=0.1)
    before = bits(emb.weight)
    opt.zero_grad()  # .grad None: backward then hands over its sparse gradient
    emb(torch.tensor([0, 2])).sum().backward()
    assert emb.weight.grad.is_sparse
    with pytest.raises(RuntimeError, match=r"sparse gradients are not supported by renaissance\.torch"):
        opt.step()
    assert torch.equal(bits(emb.weight), before)


@pytest.mark.parametrize("ours,theirs,kw", CASES[1:], ids=IDS[1:])
def test_a_fractional_step_is_refused_clearly(ours, theirs, kw):
    """torch keeps a loaded step of 2.5 as it is (its bias corrections then use 2.5); the core counts
    whole steps, so the load is refused before anything changes."""
    qs = [torch.nn.Parameter(randn((3,), 0))]
    topt = theirs(qs, **kw)
    qs[0].grad = randn((3,), 1)
    topt.step()
    sd = copy.deepcopy(topt.state_dict())
    sd["state"][0]["step"] = torch.tensor(2.5)
    ps = [torch.nn.Parameter(randn((3,), 0))]
    opt = ours(ps, **kw)
    fp = opt.fingerprint()
    with pytest.raises(ValueError, match=r"step=tensor\(2\.5000\): expected a whole number"):
        opt.load_state_dict(sd)
    assert opt.fingerprint() == fp
