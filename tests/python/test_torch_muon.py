"""renaissance.torch.Muon and MuonWithAuxAdam (docs/python.md, "Muon"): the step against a float64
reference of torch.optim.Muon's math written here (Newton–Schulz in float64, torch's lerp, the
decay, the adjusted lr; runs on any torch), against torch.optim.Muon itself where torch has it
(torch >= 2.9; Debian's 1.13 has none), torch's construction errors and texts, the refusal of
non-2-D parameters, the state dict in torch's names, and MuonWithAuxAdam's groups (the Muon
package's keys and defaults, one Task for both kinds, per-group state), and muon_mode="fast" (against
the float64 reference within the weights' rounding, not exact mode's bits, deterministic, fixed at
construction, its ValueError)."""
import copy
import math
import re

import numpy as np
import pytest

import torch  # noqa: E402  (CI installs it: scripts/test_python.sh)

import renaissance.torch as rt  # noqa: E402

HAS_TORCH_MUON = hasattr(torch.optim, "Muon")
needs_torch_muon = pytest.mark.skipif(not HAS_TORCH_MUON, reason="torch %s has no torch.optim.Muon (added in "
                                      "torch 2.9; Debian's 1.13 has none): the float64 reference tests "
                                      "stand in" % torch.__version__)

COEFFS = (3.4445, -4.775, 2.0315)
SHAPES = [(6, 5), (4, 7), (8, 8)]  # rows > cols (NS on the transpose), rows < cols, square
STEPS = 20

# Our exact Newton–Schulz against a float64 one: the most one step may move |w_ours - w_f64|, in
# units of the step's largest adjusted lr. Measured on REF_CASES (kind muon's exact mode with the
# diagonal split of its products): up to 1.6e-3 (original_named; ns_3_steps_coeffs: 9.6e-5),
# 2.7e-3 before the split; set with a 1.5x margin.
F64_TOL = 2.4e-3
# torch's bf16 Newton–Schulz against float64 on the same inputs (this file's shapes, 5 steps):
# up to 0.05 absolute on an element of X (typically 0.01; X's elements are below 1). Against
# torch.optim.Muon (test_matches_torch_optim_muon), at every step of REF_CASES, measured with
# torch 2.11 (mkind f9ee177, c081264), before exact mode's diagonal split brought ours closer to
# float64: |ours - f64| <= 0.133 |torch - f64| and |ours - torch| <= 1.09 |torch - f64|; the test
# holds 0.5 and 2.


def matrices(seed=0, shapes=SHAPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def grads(step, shapes=SHAPES, seed=100):
    g = torch.Generator().manual_seed(seed + step)
    return [torch.randn(*s, generator=g) for s in shapes]


def feed(ps, gs):
    for p, g in zip(ps, gs):
        p.grad = g.clone()


# ---- the float64 reference of torch.optim.Muon's math ---------------------------------------------
def ns64(u, coeffs=COEFFS, steps=5, eps=1e-7):
    """torch's _zeropower_via_newtonschulz in float64: on the transpose when rows > cols,
    X / max(||X||_F, eps), then `steps` times A = X X^T, B = b A + c A A, X = a X + B X."""
    x = u.double()
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / max(float(x.norm()), eps)
    a, b, c = coeffs
    for _ in range(steps):
        A = x @ x.T
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x.T if transposed else x


def lerp64(a, b, w):
    return a + w * (b - a)


def adjusted(lr, shape, fn):
    A, B = shape[0], int(np.prod(shape[1:]))
    if fn in (None, "original"):
        return lr * math.sqrt(max(1.0, A / B))
    return lr * 0.2 * math.sqrt(max(A, B))


class Ref:
    """torch.optim.Muon's step in float64 (per tensor: buf, then the update)."""

    def __init__(self, ps, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, ns_coefficients=COEFFS,
                 eps=1e-7, ns_steps=5, adjust_lr_fn=None):
        self.w = [p.detach().double().clone() for p in ps]
        self.buf = [torch.zeros_like(w) for w in self.w]
        self.kw = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                       ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)

    def step(self, gs):
        k = self.kw
        self.last = [None] * len(gs)  # (decay, adjusted lr, X) of this step per tensor
        for i, g in enumerate(gs):
            if g is None:
                continue
            g = g.double()
            self.buf[i] = lerp64(self.buf[i], g, 1 - k["momentum"])
            u = lerp64(g, self.buf[i], k["momentum"]) if k["nesterov"] else self.buf[i]
            shape = tuple(self.w[i].shape)
            x = ns64(u.reshape(shape[0], -1), k["ns_coefficients"], k["ns_steps"], k["eps"]).reshape(shape)
            self.last[i] = (1 - k["lr"] * k["weight_decay"], adjusted(k["lr"], shape, k["adjust_lr_fn"]), x)
            self.w[i] = self.w[i] * self.last[i][0]
            self.w[i] = self.w[i] - self.last[i][1] * x

    def from_(self, ws):
        """This step's update applied to other weights (ours before the step): the step's own error."""
        return [w if last is None else w * last[0] - last[1] * last[2] for w, last in zip(ws, self.last)]


def worst(ps, ws):
    return max(float((p.detach().double() - w).abs().max()) for p, w in zip(ps, ws))


REF_CASES = {
    "defaults": dict(),
    "lr_wd": dict(lr=0.02, weight_decay=0.05),
    "no_nesterov": dict(lr=0.02, nesterov=False),
    "match_rms_adamw": dict(lr=0.01, adjust_lr_fn="match_rms_adamw"),
    "original_named": dict(lr=0.01, adjust_lr_fn="original", momentum=0.9),
    "ns_3_steps_coeffs": dict(lr=0.01, ns_steps=3, ns_coefficients=(2.0, -1.5, 0.5), eps=1e-5),
}


@pytest.mark.parametrize("name", sorted(REF_CASES))
def test_matches_float64_reference(name):
    kw = REF_CASES[name]
    ps = matrices()
    ref = Ref(ps, **kw)
    opt = rt.Muon(ps, **kw)
    step_lr = max(adjusted(ref.kw["lr"], s, ref.kw["adjust_lr_fn"]) for s in SHAPES)
    for t in range(STEPS):
        gs = grads(t)
        feed(ps, gs)
        before = [p.detach().double().clone() for p in ps]
        opt.step()
        ref.step(gs)
        one = worst(ps, ref.from_(before))  # this step's error alone
        assert one <= F64_TOL * step_lr, (name, t, one / step_lr)
        # The trajectory: at most one step's worth more per step (the gradients do not depend on
        # the weights, so nothing feeds the error back).
        err = worst(ps, ref.w)
        assert err <= F64_TOL * step_lr * (t + 1), (name, t, err, F64_TOL * step_lr * (t + 1))
    moved = max(float((p.detach().double() - w0.detach().double()).abs().max()) for p, w0 in zip(ps, matrices()))
    assert moved > 10 * step_lr  # the parameters did move by many steps' worth


def test_none_gradient_is_skipped_and_lr_edit_applies():
    ps = matrices()
    ref = Ref(ps, lr=0.02)
    opt = rt.Muon(ps, lr=0.02)
    for t in range(6):
        gs = grads(t)
        if t % 2 == 1:
            gs[1] = None  # torch: no gradient, no step (no decay, no momentum) for that parameter
        if t == 3:
            opt.param_groups[0]["lr"] = 0.005
            ref.kw["lr"] = 0.005
        for p, g in zip(ps, gs):
            p.grad = None if g is None else g.clone()
        before = ps[1].detach().clone()
        opt.step()
        ref.step(gs)
        if gs[1] is None:
            assert torch.equal(ps[1].detach(), before)
        assert worst(ps, ref.w) <= F64_TOL * 0.02 * 2 * (t + 1)


def test_zero_update_is_eps_floored():
    # A zero update: X = 0 / max(0, eps) = 0 (torch's clamp), so only the decay moves the
    # weights: w * float32(1 - lr * wd), one rounded product.
    ps = matrices()
    opt = rt.Muon(ps, lr=0.1, weight_decay=0.5)
    w0 = [p.detach().clone() for p in ps]
    feed(ps, [torch.zeros_like(p) for p in ps])
    opt.step()
    decay = torch.tensor(1 - 0.1 * 0.5, dtype=torch.float32)
    for p, w in zip(ps, w0):
        assert torch.equal(p.detach(), w * decay)


def test_bf16_parameters_step_fp32_masters():
    """bf16 parameters: fp32 masters (state 'master_weight') follow the float64 reference fed the
    bf16 gradients; each parameter is its master rounded to bf16 (nearest even)."""
    ps = [torch.nn.Parameter(p.detach().to(torch.bfloat16)) for p in matrices()]
    ref = Ref(ps, lr=0.02)
    opt = rt.Muon(ps, lr=0.02)
    step_lr = max(adjusted(0.02, s, None) for s in SHAPES)
    for t in range(5):
        gs = [g.to(torch.bfloat16) for g in grads(t)]
        feed(ps, gs)
        opt.step()
        ref.step(gs)
    sd = opt.state_dict()
    masters = [sd["state"][i]["master_weight"] for i in range(len(ps))]
    assert all(m.dtype == torch.float32 for m in masters)
    assert worst(masters, ref.w) <= F64_TOL * step_lr * 5
    for p, m in zip(ps, masters):
        assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), m.to(torch.bfloat16))


def test_maximize_is_minimizing_the_negated_gradient():
    a, b = matrices(), matrices()
    oa = rt.Muon(a, lr=0.02, maximize=True)
    ob = rt.Muon(b, lr=0.02)
    for t in range(4):
        gs = grads(t)
        feed(a, gs)
        feed(b, [-g for g in gs])
        oa.step()
        ob.step()
    for x, y in zip(a, b):
        assert torch.equal(x.detach(), y.detach())


@needs_torch_muon
@pytest.mark.parametrize("name", sorted(REF_CASES))
def test_matches_torch_optim_muon(name):
    """Per-step parameters against torch.optim.Muon over 20 steps, within twice the distance of
    torch's own (bf16 Newton–Schulz) parameters from the float64 reference at that step, and
    closer to that reference than half torch's distance."""
    kw = REF_CASES[name]
    ours, theirs = matrices(), matrices()
    ref = Ref(ours, **kw)
    opt = rt.Muon(ours, **kw)
    topt = torch.optim.Muon(theirs, **kw)
    for t in range(STEPS):
        gs = grads(t)
        feed(ours, gs)
        feed(theirs, gs)
        opt.step()
        topt.step()
        ref.step(gs)
        torch_vs_f64 = worst(theirs, ref.w)
        assert torch_vs_f64 > 0  # torch's bf16 NS is not exact: the measure is real
        diff = max(float((x.detach().double() - y.detach().double()).abs().max()) for x, y in zip(ours, theirs))
        assert diff <= 2 * torch_vs_f64, (name, t, diff, torch_vs_f64)
        assert worst(ours, ref.w) <= 0.5 * torch_vs_f64, (name, t, worst(ours, ref.w), torch_vs_f64)


# ---- construction: torch's checks and texts -------------------------------------------------------
TORCH_ERRORS = [
    (dict(lr=-1.0), "Learning rate should be >= 0 but is: -1.0"),
    (dict(momentum=-0.5), "momentum should be >= 0 but is: -0.5"),
    (dict(weight_decay=-0.1), "weight decay should be >= 0 but is: -0.1"),
    (dict(adjust_lr_fn="cosine"), "Adjust learning rate function cosine is not supported"),
    (dict(lr=torch.tensor([0.1, 0.2])), "Tensor lr must be 1-element"),
]


@pytest.mark.parametrize("kw,text", TORCH_ERRORS, ids=[t for _, t in TORCH_ERRORS])
def test_construction_errors_are_torchs(kw, text):
    with pytest.raises(ValueError) as e:
        rt.Muon(matrices(), **kw)
    assert str(e.value) == text
    if HAS_TORCH_MUON:
        with pytest.raises(ValueError) as t:
            torch.optim.Muon(matrices(), **kw)
        assert str(t.value) == str(e.value)


@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), ()])
def test_non_2d_parameters_are_refused_as_torch_refuses_them(shape):
    ps = matrices() + [torch.nn.Parameter(torch.ones(shape))]
    with pytest.raises(ValueError) as e:
        rt.Muon(ps)
    assert str(e.value) == "Muon only supports 2D parameters whereas we found a parameter with size: %s" % (
        torch.Size(shape),)
    if HAS_TORCH_MUON:
        with pytest.raises(ValueError) as t:
            torch.optim.Muon(ps)
        assert str(t.value) == str(e.value)
    # add_param_group too (torch would wait for the step): the group is not added.
    opt = rt.Muon(matrices())
    with pytest.raises(ValueError, match="^Muon only supports 2D parameters"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(shape))]})
    assert len(opt.param_groups) == 1


# torch refuses these at the first step, renaissance.torch at construction (docs/python.md).
STEP_ERRORS = [
    (dict(ns_steps=100), ValueError, "Number of steps must be less than 100 for computational efficiency"),
    (dict(ns_coefficients=(3.4, -4.7)), ValueError, "Coefficients must be a tuple of exactly 3 values"),
]


@pytest.mark.parametrize("kw,kind,text", STEP_ERRORS, ids=[t for _, _, t in STEP_ERRORS])
def test_newton_schulz_errors_are_torchs_at_construction(kw, kind, text):
    with pytest.raises(kind) as e:
        rt.Muon(matrices(), **kw)
    assert str(e.value) == text
    if HAS_TORCH_MUON:
        ps = matrices()
        topt = torch.optim.Muon(ps, **kw)
        feed(ps, grads(0))
        with pytest.raises(kind) as t:
            topt.step()
        assert str(t.value) == text


def test_complex_parameters_and_other_refusals():
    with pytest.raises(RuntimeError, match="^Muon does not support complex parameters$"):
        rt.Muon([torch.nn.Parameter(torch.zeros(3, 4, dtype=torch.complex64))])
    with pytest.raises(ValueError, match="1 to 99 Newton-Schulz steps"):
        rt.Muon(matrices(), ns_steps=0)
    with pytest.raises(TypeError, match="ns_steps=2.5: expected an int"):
        rt.Muon(matrices(), ns_steps=2.5)
    with pytest.raises(ValueError, match="eps > 0"):
        rt.Muon(matrices(), eps=0.0)
    # The distributed arguments are checked as every class checks them (test_torch_dist_muon.py
    # runs them under a process group).
    with pytest.raises(ValueError, match="grad_reduce='sum'"):
        rt.Muon(matrices(), grad_reduce="sum")
    with pytest.raises(ValueError, match="needs a process_group"):
        rt.Muon(matrices(), grad_reduce="ordered")
    with pytest.raises(ValueError, match="needs a process_group"):
        rt.MuonWithAuxAdam([dict(params=matrices(), use_muon=True)], grad_reduce="fast")


def test_sparse_gradient_is_torchs_error():
    ps = matrices()
    opt = rt.Muon(ps)
    feed(ps, grads(0))
    ps[0].grad = ps[0].grad.to_sparse()
    with pytest.raises(RuntimeError, match="^Muon does not support sparse gradients"):
        opt.step()


def test_adjust_lr_fn_is_fixed_after_construction():
    ps = matrices()
    opt = rt.Muon(ps, lr=0.02)
    feed(ps, grads(0))
    opt.step()
    w = [p.detach().clone() for p in ps]
    opt.param_groups[0]["adjust_lr_fn"] = "match_rms_adamw"
    with pytest.raises(ValueError, match="cannot change adjust_lr_fn after construction"):
        opt.step()
    assert all(torch.equal(p.detach(), x) for p, x in zip(ps, w))
    opt.param_groups[0]["adjust_lr_fn"] = "original"  # the same adjustment as None: accepted
    opt.step()


def test_groups_with_another_adjustment_get_a_task_of_their_own():
    ps = matrices()
    opt = rt.Muon([{"params": ps[:2]}, {"params": ps[2:], "adjust_lr_fn": "match_rms_adamw"}], lr=0.01)
    assert len(opt.backends) == 2
    ref_a, ref_b = Ref(ps[:2], lr=0.01), Ref(ps[2:], lr=0.01, adjust_lr_fn="match_rms_adamw")
    for t in range(3):
        gs = grads(t)
        feed(ps, gs)
        opt.step()
        ref_a.step(gs[:2])
        ref_b.step(gs[2:])
    assert worst(ps, ref_a.w + ref_b.w) <= F64_TOL * 0.01 * 2 * 3


# ---- state ----------------------------------------------------------------------------------------
TORCH_GROUP_KEYS = {"lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps",
                    "adjust_lr_fn", "params"}


def test_state_dict_has_torchs_names():
    ps = matrices()
    opt = rt.Muon(ps)
    assert opt.state_dict()["state"] == {}
    feed(ps, grads(0))
    opt.step()
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2]
    for i, st in sd["state"].items():
        # torch's Muon keeps momentum_buffer alone; `step` is this package's, as for its SGD.
        assert set(st) == {"momentum_buffer", "step"}
        assert st["momentum_buffer"].shape == ps[i].shape and float(st["step"]) == 1
    # The first buffer is (1 - momentum) * g (lerp from zero): float32 of that product.
    g0 = grads(0)
    for i, st in sd["state"].items():
        assert torch.allclose(st["momentum_buffer"], g0[i] * 0.05, rtol=1e-6, atol=0)
    assert TORCH_GROUP_KEYS <= set(sd["param_groups"][0])
    assert sd["param_groups"][0]["ns_coefficients"] == COEFFS


def torch_format_state_dict(ps, bufs, **kw):
    """A torch.optim.Muon state dict as torch 2.11 writes it (its keys; no step)."""
    group = dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, ns_coefficients=COEFFS, eps=1e-7,
                 ns_steps=5, adjust_lr_fn=None, params=list(range(len(ps))))
    group.update(kw)
    return {"state": {i: {"momentum_buffer": b.clone()} for i, b in enumerate(bufs)}, "param_groups": [group]}


def test_a_torch_muon_state_dict_loads_and_the_steps_continue():
    ps = matrices()
    g = torch.Generator().manual_seed(7)
    bufs = [torch.randn(p.shape, generator=g) * 0.1 for p in ps]
    if HAS_TORCH_MUON:  # torch's own dict, its buffers as written by its steps
        theirs = matrices()
        topt = torch.optim.Muon(theirs, lr=0.02)
        for t in range(3):
            feed(theirs, grads(t))
            topt.step()
        sd = topt.state_dict()
        bufs = [sd["state"][i]["momentum_buffer"].clone() for i in range(len(ps))]
        with torch.no_grad():
            for p, q in zip(ps, theirs):
                p.copy_(q)
    else:
        sd = torch_format_state_dict(ps, bufs, lr=0.02)
    opt = rt.Muon(ps)  # lr 1e-3: the loaded group's 0.02 replaces it
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["lr"] == 0.02
    for p, b in zip(ps, bufs):
        assert torch.equal(opt.state[p]["momentum_buffer"], b)
    ref = Ref(ps, lr=0.02)
    ref.buf = [b.double() for b in bufs]
    for t in range(3, 6):
        gs = grads(t)
        feed(ps, gs)
        opt.step()
        ref.step(gs)
    assert worst(ps, ref.w) <= F64_TOL * 0.02 * 2 * 3
    if HAS_TORCH_MUON:  # and ours loads into torch's
        back = torch.optim.Muon(matrices(), lr=1e-3)
        back.load_state_dict(opt.state_dict())
        for i, p in enumerate(ps):
            assert torch.equal(back.state_dict()["state"][i]["momentum_buffer"], opt.state[p]["momentum_buffer"])


def test_deepcopy_keeps_every_count_and_steps_alike():
    muon, aux = aux_model()
    opt = rt.MuonWithAuxAdam([dict(params=muon, use_muon=True), dict(params=aux, use_muon=False)])
    for t in range(3):
        gm, ga = aux_grads(t)
        if t == 1:
            gm[2] = None
        for p, g in zip(muon + aux, gm + ga):
            p.grad = None if g is None else g.clone()
        opt.step()
    clone = copy.deepcopy(opt)
    assert clone.fingerprint() == opt.fingerprint()
    gm, ga = aux_grads(3)
    for o in (opt, clone):
        ps = [p for g in o.param_groups for p in g["params"]]
        feed(ps, gm + ga)
        o.step()
    assert clone.fingerprint() == opt.fingerprint()


def test_another_class_state_dict_is_refused():
    ps = matrices()
    sgd = rt.SGD(ps, lr=0.1, momentum=0.9)
    feed(ps, grads(0))
    sgd.step()
    opt = rt.Muon(matrices())
    with pytest.raises(ValueError, match="does not fit Muon"):
        opt.load_state_dict(sgd.state_dict())
    with pytest.raises(ValueError, match="does not fit SGD"):
        rt.SGD(matrices(), lr=0.1, momentum=0.9).load_state_dict(torch_format_state_dict(ps, [p.detach() for p in ps]))


# ---- MuonWithAuxAdam ------------------------------------------------------------------------------
AUX_SHAPES = [(7,), (5, 3)]  # a bias and an embedding-like matrix: the aux AdamW's
CONV = (4, 2, 3, 3)  # a conv weight, viewed as the 4 x 18 matrix


def aux_model(seed=0):
    g = torch.Generator().manual_seed(seed)
    muon = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES + [CONV]]
    aux = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in AUX_SHAPES]
    return muon, aux


def aux_grads(step, seed=300):
    g = torch.Generator().manual_seed(seed + step)
    return ([torch.randn(*s, generator=g) for s in SHAPES + [CONV]], [torch.randn(*s, generator=g) for s in AUX_SHAPES])


def step_on_aux_grads(opt, muon, aux, t):
    """Step t of opt over aux_model()'s tensors: aux_grads(t) fed, then opt.step(). Returns them."""
    gm, ga = aux_grads(t)
    feed(muon, gm)
    feed(aux, ga)
    opt.step()
    return gm, ga


class AdamRef:
    """torch's AdamW (decoupled decay p *= 1 - lr * weight_decay first), float64 (the aux groups)."""

    def __init__(self, ps, lr, betas, eps, weight_decay=0.0):
        self.w = [p.detach().double().clone() for p in ps]
        self.m = [torch.zeros_like(w) for w in self.w]
        self.v = [torch.zeros_like(w) for w in self.w]
        self.t = [0] * len(ps)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay

    def step(self, gs):
        b1, b2 = self.betas
        for i, g in enumerate(gs):
            if g is None:
                continue
            g = g.double()
            self.t[i] += 1
            self.w[i] = self.w[i] * (1 - self.lr * self.weight_decay)
            self.m[i] = lerp64(self.m[i], g, 1 - b1)
            self.v[i] = self.v[i] * b2 + (1 - b2) * g * g
            bc1, bc2 = 1 - b1 ** self.t[i], 1 - b2 ** self.t[i]
            self.w[i] = self.w[i] - self.lr / bc1 * self.m[i] / ((self.v[i] / bc2).sqrt() + self.eps)


def test_muon_with_aux_adam_defaults_one_task_and_the_step():
    muon, aux = aux_model()
    opt = rt.MuonWithAuxAdam([dict(params=muon, use_muon=True), dict(params=aux, use_muon=False)])
    g0, g1 = opt.param_groups
    # The Muon package's defaults (SingleDeviceMuonWithAuxAdam).
    assert (g0["lr"], g0["momentum"], g0["weight_decay"]) == (0.02, 0.95, 0)
    assert (g1["lr"], g1["betas"], g1["eps"], g1["weight_decay"]) == (3e-4, (0.9, 0.95), 1e-10, 0)
    assert len(opt.backends) == 1  # both kinds in one Task, one step
    mref = Ref(muon, lr=0.02, weight_decay=0.0, momentum=0.95)
    aref = AdamRef(aux, 3e-4, (0.9, 0.95), 1e-10)
    for t in range(10):
        gm, ga = step_on_aux_grads(opt, muon, aux, t)
        mref.step(gm)
        aref.step(ga)
        step_lr = max(adjusted(0.02, tuple(p.shape), None) for p in muon)
        assert worst(muon, mref.w) <= F64_TOL * step_lr * (t + 1), t
        assert worst(aux, aref.w) <= 1e-6 * (t + 1), t
    sd = opt.state_dict()
    assert all(set(sd["state"][i]) == {"momentum_buffer", "step"} for i in range(len(muon)))
    for i in range(len(muon), len(muon) + len(aux)):
        assert set(sd["state"][i]) == {"exp_avg", "exp_avg_sq", "step"}
        assert float(sd["state"][i]["step"]) == 10
    assert sd["param_groups"][0]["use_muon"] is True and sd["param_groups"][1]["use_muon"] is False


def test_muon_with_aux_adam_groups_lrs_and_none_gradients():
    muon, aux = aux_model()
    opt = rt.MuonWithAuxAdam([dict(params=aux[:1], use_muon=False, lr=1e-2, betas=(0.8, 0.95)),
                              dict(params=muon, use_muon=True, lr=0.05, momentum=0.9, weight_decay=0.01),
                              dict(params=aux[1:], use_muon=False, lr=2e-2, eps=1e-8)])
    assert len(opt.backends) == 1
    mref = Ref(muon, lr=0.05, weight_decay=0.01, momentum=0.9)
    aref0 = AdamRef(aux[:1], 1e-2, (0.8, 0.95), 1e-10)
    aref1 = AdamRef(aux[1:], 2e-2, (0.9, 0.95), 1e-8)
    for t in range(6):
        gm, ga = aux_grads(t)
        if t == 2:
            gm[0], ga[1] = None, None  # not stepped this time: no decay, no moments, no count
        if t == 4:
            opt.param_groups[1]["lr"] = 0.01
            mref.kw["lr"] = 0.01
            opt.param_groups[0]["lr"] = 5e-3
            aref0.lr = 5e-3
        for p, g in zip(muon + aux, gm + ga):
            p.grad = None if g is None else g.clone()
        opt.step()
        mref.step(gm)
        aref0.step(ga[:1])
        aref1.step(ga[1:])
    assert worst(muon, mref.w) <= F64_TOL * 0.05 * 2 * 6
    assert worst(aux, aref0.w + aref1.w) <= 1e-5
    sd = opt.state_dict()  # indices in group order: aux[0], the matrices, aux[1]
    assert float(sd["state"][0]["step"]) == 6 and float(sd["state"][len(muon) + 1]["step"]) == 5
    assert float(sd["state"][1]["step"]) == 5 and float(sd["state"][2]["step"]) == 6


def test_muon_with_aux_adam_one_clip_norm_over_both_kinds():
    """max_grad_norm clips the global norm over the Muon and the aux parameters together
    (torch's clip_grad_norm_ over all of them: coef = min(1, max_norm / (total + 1e-6)))."""
    muon, aux = aux_model()
    opt = rt.MuonWithAuxAdam([dict(params=muon, use_muon=True), dict(params=aux, use_muon=False, lr=1e-2)],
                             max_grad_norm=1.0)
    mref = Ref(muon, lr=0.02, weight_decay=0.0)
    aref = AdamRef(aux, 1e-2, (0.9, 0.95), 1e-10)
    for t in range(6):
        gm, ga = aux_grads(t)
        gm, ga = [g * (1 + 2 * t) for g in gm], [g * (1 + 2 * t) for g in ga]  # a growing norm
        feed(muon, gm)
        feed(aux, ga)
        opt.step()
        total = math.sqrt(sum(float((g.double() ** 2).sum()) for g in gm + ga))
        coef = min(1.0, 1.0 / (total + 1e-6))
        assert coef < 0.2  # the clip is active
        mref.step([g.double() * coef for g in gm])
        aref.step([g.double() * coef for g in ga])
    assert worst(muon, mref.w) <= F64_TOL * 0.02 * 6
    assert worst(aux, aref.w) <= 1e-5


def test_muon_with_aux_adam_refusals():
    muon, aux = aux_model()
    with pytest.raises(ValueError, match="has no use_muon"):
        rt.MuonWithAuxAdam([dict(params=muon)])
    with pytest.raises(ValueError, match="has no use_muon"):
        rt.MuonWithAuxAdam(muon)
    with pytest.raises(ValueError, match="use_muon=1: expected True or False"):
        rt.MuonWithAuxAdam([dict(params=muon, use_muon=1)])
    with pytest.raises(ValueError, match="a use_muon=True group takes lr, momentum, weight_decay; got 'betas'"):
        rt.MuonWithAuxAdam([dict(params=muon, use_muon=True, betas=(0.9, 0.95))])
    with pytest.raises(ValueError, match="a use_muon=False group takes lr, betas, eps, weight_decay; got 'momentum'"):
        rt.MuonWithAuxAdam([dict(params=aux, use_muon=False, momentum=0.9)])
    with pytest.raises(ValueError, match="Invalid weight_decay value: -0.1"):
        rt.MuonWithAuxAdam([dict(params=aux, use_muon=False, weight_decay=-0.1)])
    with pytest.raises(ValueError, match="a parameter has size torch.Size\\(\\[7\\]\\)"):
        rt.MuonWithAuxAdam([dict(params=muon + aux[:1], use_muon=True)])
    with pytest.raises(ValueError, match="Learning rate should be >= 0 but is: -1"):
        rt.MuonWithAuxAdam([dict(params=muon, use_muon=True, lr=-1)])
    with pytest.raises(ValueError, match="Invalid beta parameter at index 1: 1.5"):
        rt.MuonWithAuxAdam([dict(params=aux, use_muon=False, betas=(0.9, 1.5))])
    # A negative aux weight decay edited in later is refused at the step, nothing changed.
    opt = rt.MuonWithAuxAdam([dict(params=aux, use_muon=False)])
    opt.param_groups[0]["weight_decay"] = -0.1
    feed(aux, aux_grads(0)[1])
    w = [p.detach().clone() for p in aux]
    with pytest.raises(ValueError, match="Invalid weight_decay value"):
        opt.step()
    assert all(torch.equal(p.detach(), x) for p, x in zip(aux, w))


def test_muon_with_aux_adam_aux_weight_decay_is_adamws():
    """A use_muon=False group's weight_decay is torch's AdamW decay with that group's lr (not the
    Muon group's), per group, and an edit applies from the next step."""
    muon, aux = aux_model()
    opt = rt.MuonWithAuxAdam([dict(params=muon, use_muon=True, lr=0.05, weight_decay=0.01),
                              dict(params=aux[:1], use_muon=False, lr=1e-2, weight_decay=0.5),
                              dict(params=aux[1:], use_muon=False, lr=2e-2, weight_decay=0.1)])
    assert len(opt.backends) == 1
    mref = Ref(muon, lr=0.05, weight_decay=0.01, momentum=0.95)
    aref0 = AdamRef(aux[:1], 1e-2, (0.9, 0.95), 1e-10, weight_decay=0.5)
    aref1 = AdamRef(aux[1:], 2e-2, (0.9, 0.95), 1e-10, weight_decay=0.1)
    nodecay = AdamRef(aux, 1e-2, (0.9, 0.95), 1e-10)
    for t in range(6):
        gm, ga = aux_grads(t)
        if t == 3:
            opt.param_groups[2]["weight_decay"] = 0.3
            aref1.weight_decay = 0.3
        feed(muon, gm)
        feed(aux, ga)
        opt.step()
        mref.step(gm)
        aref0.step(ga[:1])
        aref1.step(ga[1:])
        nodecay.step(ga)
        assert worst(aux, aref0.w + aref1.w) <= 1e-6 * (t + 1), t
    assert worst(muon, mref.w) <= F64_TOL * 0.05 * 2 * 6
    # The decay moved the aux weights far beyond the tolerance (the check above can fail).
    assert worst(aux[:1], nodecay.w[:1]) > 1e-3


def test_muon_with_aux_adam_state_dict_round_trip_and_the_packages_format():
    muon, aux = aux_model()
    groups = lambda m, a: [dict(params=m, use_muon=True), dict(params=a, use_muon=False)]  # noqa: E731
    opt = rt.MuonWithAuxAdam(groups(muon, aux))
    for t in range(3):
        step_on_aux_grads(opt, muon, aux, t)
    sd = opt.state_dict()
    # The Muon package's format: the aux step a Python int, the buffers as tensors.
    pkg = {"state": {i: dict(st) for i, st in sd["state"].items()}, "param_groups": sd["param_groups"]}
    for i in range(len(muon), len(muon) + len(aux)):
        pkg["state"][i]["step"] = int(pkg["state"][i]["step"])
    m2, a2 = aux_model()
    with torch.no_grad():
        for p, q in zip(m2 + a2, muon + aux):
            p.copy_(q)
    opt2 = rt.MuonWithAuxAdam(groups(m2, a2))
    opt2.load_state_dict(pkg)
    for t in range(3, 5):
        gm, ga = aux_grads(t)
        for o, ms, as_ in ((opt, muon, aux), (opt2, m2, a2)):
            feed(ms, gm)
            feed(as_, ga)
            o.step()
    for p, q in zip(muon + aux, m2 + a2):
        assert torch.equal(p.detach(), q.detach())
    # A Muon group's dict into an aux group (use_muon differs): another compiled role, refused.
    swapped = opt.state_dict()
    swapped["param_groups"] = [dict(g) for g in swapped["param_groups"]]
    swapped["param_groups"][1]["use_muon"] = True
    with pytest.raises(ValueError):
        opt2.load_state_dict(swapped)


# ---- CUDA: exact mode is the same bits as the CPU ---------------------------------------------------
def _have_cuda():
    import renaissance
    return torch.cuda.is_available() and renaissance.with_cuda


@pytest.mark.skipif(not _have_cuda(), reason="needs a CUDA device and a CUDA build of renaissance")
def test_cuda_steps_are_the_cpus_bit_for_bit():
    """Exact mode: Muon and MuonWithAuxAdam on CUDA give the CPU's bits (weights and state)."""
    runs = {}
    for device in ("cpu", "cuda"):
        muon, aux = aux_model()
        muon = [torch.nn.Parameter(p.detach().to(device)) for p in muon]
        aux = [torch.nn.Parameter(p.detach().to(device)) for p in aux]
        solo = [torch.nn.Parameter(p.detach().to(device)) for p in matrices()]
        both = rt.MuonWithAuxAdam([dict(params=muon, use_muon=True, weight_decay=0.01),
                                   dict(params=aux, use_muon=False)], max_grad_norm=5.0)
        one = rt.Muon(solo, lr=0.02, adjust_lr_fn="match_rms_adamw")
        for t in range(4):
            gm, ga = aux_grads(t)
            feed(muon + aux, [g.to(device) for g in gm + ga])
            feed(solo, [g.to(device) for g in grads(t)])
            both.step()
            one.step()
        runs[device] = ([p.detach().cpu() for p in muon + aux + solo], both.fingerprint(), one.fingerprint())
    for a, b in zip(runs["cpu"][0], runs["cuda"][0]):
        assert torch.equal(a, b)
    assert runs["cpu"][1:] == runs["cuda"][1:]


def test_muon_with_aux_adam_trains_the_digits_cnn_as_well_as_adamw():
    """test_torch_train's CNN on scikit-learn's digits, 200 steps from the same weights: the conv
    weights on Muon (viewed as 8 x 9 and 16 x 72 matrices), the biases and the linear head on the
    aux AdamW, against torch.optim.AdamW on everything; the test accuracy within 1 point of
    AdamW's (measured: 93.7 % against 91.2 %)."""
    from test_torch_train import train_pair

    def ours(params):
        ps = list(params)
        return rt.MuonWithAuxAdam([dict(params=[p for p in ps if p.ndim == 4], use_muon=True, lr=0.02),
                                   dict(params=[p for p in ps if p.ndim != 4], use_muon=False, lr=2e-3)])

    _, acc_ours, acc_adamw, opt = train_pair(ours, lambda p: torch.optim.AdamW(p, lr=2e-3, weight_decay=0.05))
    assert len(opt.backends) == 1
    assert acc_ours >= acc_adamw - 1.0, (acc_ours, acc_adamw)


# ---- fast mode (muon_mode="fast": fp32 products on the CPU, docs/math.md "Muon: fast mode") --------
# Its step against the float64 reference: at most two roundings of the largest fp32 weight (the
# decayed weight and the difference, `rounding` below) plus FAST_TOL of the step's largest adjusted
# lr. Measured on REF_CASES: 0 beyond the roundings (fp32 products are within ~2e-6 of float64,
# tests/cpu/test_newton_schulz_fast_cpu.cc), where exact mode needs 9.6e-5 (ns_3_steps_coeffs) to
# 1.6e-3; FAST_TOL is that Newton-Schulz error with a margin of about 5.
FAST_TOL = 1e-5


def rounding(ps):
    return 2 * max(float(p.detach().abs().max()) for p in ps) * 2.0 ** -24


@pytest.mark.parametrize("name", sorted(REF_CASES))
def test_fast_mode_matches_float64_reference_closer_than_exact_mode(name):
    kw = REF_CASES[name]
    ps, exact_ps = matrices(), matrices()
    ref = Ref(ps, **kw)
    opt = rt.Muon(ps, **kw, muon_mode="fast")
    exact = rt.Muon(exact_ps, **kw)
    step_lr = max(adjusted(ref.kw["lr"], s, ref.kw["adjust_lr_fn"]) for s in SHAPES)
    worst_one = 0.0
    for t in range(STEPS):
        gs = grads(t)
        feed(ps, gs)
        feed(exact_ps, gs)
        before = [p.detach().double().clone() for p in ps]
        opt.step()
        exact.step()
        ref.step(gs)
        one = worst(ps, ref.from_(before))  # this step's error alone
        worst_one = max(worst_one, max(0.0, one - rounding(ps)) / step_lr)
        assert one <= rounding(ps) + FAST_TOL * step_lr, (name, t, one, rounding(ps), one / step_lr)
        assert worst(ps, ref.w) <= (rounding(ps) + FAST_TOL * step_lr) * (t + 1), (name, t)
    print("%s: fast mode's worst step error beyond the weights' rounding / step lr %.3g" % (name, worst_one))
    # The mode really switches: exact mode's weights are other bits.
    assert not all(torch.equal(a.detach(), b.detach()) for a, b in zip(ps, exact_ps))
    assert opt.param_groups[0]["muon_mode"] == "fast" and exact.param_groups[0]["muon_mode"] == "exact"


def test_fast_mode_is_deterministic_on_any_thread_count():
    runs = []
    for threads in (1, 2, 2):
        ps = matrices()
        opt = rt.Muon(ps, lr=0.02, muon_mode="fast", threads=threads)
        for t in range(4):
            feed(ps, grads(t))
            opt.step()
        runs.append([p.detach().clone() for p in ps])
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))


@pytest.mark.parametrize("bad", ["bf16", "Fast", 1, None])
def test_a_bad_muon_mode_is_a_value_error(bad):
    text = "muon_mode %r is not supported: expected 'exact' or 'fast'" % (bad,)
    with pytest.raises(ValueError, match=re.escape(text)):
        rt.Muon(matrices(), muon_mode=bad)
    muon, aux = aux_model()
    with pytest.raises(ValueError, match=re.escape(text)):
        rt.MuonWithAuxAdam([dict(params=muon, use_muon=True), dict(params=aux, use_muon=False)], muon_mode=bad)


def test_muon_mode_is_fixed_after_construction_and_kept_by_the_state_dict():
    ps = matrices()
    opt = rt.Muon(ps, lr=0.02, muon_mode="fast")
    feed(ps, grads(0))
    opt.step()
    sd = opt.state_dict()
    assert sd["param_groups"][0]["muon_mode"] == "fast"
    # The state dict loads into a fast optimizer and the steps continue as the original's.
    other_ps = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    other = rt.Muon(other_ps, lr=0.02, muon_mode="fast")
    other.load_state_dict(sd)
    for t in (1, 2):
        feed(ps, grads(t))
        feed(other_ps, grads(t))
        opt.step()
        other.step()
    assert all(torch.equal(a.detach(), b.detach()) for a, b in zip(ps, other_ps))
    # A torch.optim.Muon state dict (no muon_mode) loads into it and keeps its mode.
    other.load_state_dict(torch_format_state_dict(other_ps, [torch.zeros_like(p) for p in other_ps], lr=0.02))
    assert other.param_groups[0]["muon_mode"] == "fast"
    # An exact-mode state dict does not: its compiled step is the other mode's.
    with pytest.raises(ValueError, match="cannot change muon_mode after construction"):
        other.load_state_dict(rt.Muon(matrices(), lr=0.02).state_dict())
    w = [p.detach().clone() for p in other_ps]
    other.param_groups[0]["muon_mode"] = "exact"
    feed(other_ps, grads(3))
    with pytest.raises(ValueError, match="cannot change muon_mode after construction"):
        other.step()
    assert all(torch.equal(p.detach(), x) for p, x in zip(other_ps, w))


def test_muon_with_aux_adam_fast_mode_changes_the_matrices_only():
    runs = {}
    for mode in ("exact", "fast"):
        muon, aux = aux_model()
        opt = rt.MuonWithAuxAdam([dict(params=muon, use_muon=True), dict(params=aux, use_muon=False)],
                                 muon_mode=mode)
        assert len(opt.backends) == 1  # both kinds in one Task, as in exact mode
        mref = Ref(muon, lr=0.02, weight_decay=0.0, momentum=0.95)
        for t in range(5):
            mref.step(step_on_aux_grads(opt, muon, aux, t)[0])
        step_lr = max(adjusted(0.02, tuple(p.shape), None) for p in muon)
        if mode == "fast":
            assert worst(muon, mref.w) <= (rounding(muon) + FAST_TOL * step_lr) * 5
        runs[mode] = ([p.detach().clone() for p in muon], [p.detach().clone() for p in aux])
    assert all(not torch.equal(a, b) for a, b in zip(runs["exact"][0], runs["fast"][0]))
    assert all(torch.equal(a, b) for a, b in zip(runs["exact"][1], runs["fast"][1]))  # the aux AdamW's alike
