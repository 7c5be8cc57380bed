#!/usr/bin/env python3
"""Generates the replay cases under testdata/replay/ (format renaissance-replay/1, docs/replay-format.md).

Every case runs a small CNN-like layout (all six roles, one zero-size tensor) for six steps with a
learning-rate and loss-scale schedule: step 2 applies lr = 0, step 4 carries a non-finite gradient
and is skipped. Gradient regimes make every term of the rules matter: fc.* gradients sit near
Adam's eps, fc.weight's LARS trust ratio hits the clamp at 100, and layer2.downsample.weight is so
small that LARS's eps dominates its ratio.

The expected values are computed here in float64 from docs/math.md, never by the project's code.
Where torch is importable, the reference is cross-checked against torch.optim in float64 (the SGD
kinds in l2 mode or without weight decay, adam, adamw; adamw_clip with
torch.nn.utils.clip_grad_norm_ before each step), lion and lamb against timm's Lion and Lamb
(max_grad_norm=None, other arguments at their defaults, bias-like parameters in a group with weight
decay 0; timm's optim modules are loaded without the rest of timm, which needs torchvision) when
timm is installed, and LARS against a second, independently written float64 implementation; the
agreement goes to testdata/replay/calibration.json.

The muon cases (weight-role tensors as shape[0] x prod(shape[1:]) matrices, the auxiliary AdamW on
the bias-like ones) are checked against a second float64 Muon written separately here (the tight
check) and, where torch.optim.Muon exists (torch >= 2.9), against it: its momentum and the aux
AdamW agree to float64 rounding, its weights only to about 3e-3, because torch orthogonalises in
bf16. Their case.json carries a `tolerance` (muon_tolerance): the library's exact-mode
Newton–Schulz is not within 1e-6 of a float64 one.

Usage (numpy required, torch optional; torch >= 2.9 for the Muon cross-check):
    /usr/bin/python3 scripts/make_testdata.py                 # (re)write testdata/replay
    /usr/bin/python3 scripts/make_testdata.py --check         # regenerate into a temp dir and
                                                              # compare with the committed files
"""
import argparse
import datetime
import filecmp
import json
import math
import os
import struct
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "testdata", "replay")
FORMAT = "renaissance-replay/1"
WEIGHT_ROLES = ("fc_weight", "first_conv", "deep_conv")  # the rest are bias-like (docs/design.md)
STEPS = 6
NONFINITE_STEP = 4

# name, shape, role, weight init (kind, scale), gradient magnitude range (log10 lo, hi)
LAYOUT = [
    ("conv1.weight", [8, 3, 3, 3], "first_conv", ("uniform", 0.3), (-3.0, -0.5)),
    ("bn1.weight", [8], "bn_weight", ("around_one", 0.1), (-3.0, -0.5)),
    ("bn1.bias", [8], "bn_bias", ("uniform", 0.1), (-3.0, -0.5)),
    ("layer1.conv.weight", [16, 8, 3, 3], "deep_conv", ("uniform", 0.3), (-3.0, -0.5)),
    ("layer1.bn.weight", [16], "bn_weight", ("around_one", 0.1), (-3.0, -0.5)),
    ("layer1.bn.bias", [16], "bn_bias", ("uniform", 0.1), (-3.0, -0.5)),
    ("layer2.conv.weight", [16, 16, 3, 3], "deep_conv", ("uniform", 0.3), (-3.0, -0.5)),
    ("layer2.bn.weight", [16], "bn_weight", ("around_one", 0.1), (-3.0, -0.5)),
    ("layer2.bn.bias", [16], "bn_bias", ("uniform", 0.1), (-3.0, -0.5)),
    ("layer2.downsample.weight", [16, 8, 1, 1], "deep_conv", ("uniform", 1e-6), (-11.0, -9.0)),
    ("layer3.conv.weight", [0, 16, 3, 3], "deep_conv", ("uniform", 0.3), (-3.0, -0.5)),
    ("fc.weight", [10, 16], "fc_weight", ("uniform", 0.2), (-8.0, -6.0)),
    ("fc.bias", [10], "fc_bias", ("uniform", 0.1), (-8.0, -6.0)),
]


def sgd_case(kind, lr, momentum, wd, mode):
    o = {"kind": kind, "lr": lr, "weight_decay": wd, "weight_decay_mode": mode}
    if kind != "sgd":
        o["momentum"] = momentum
    return o


CLIP_MAX_NORM = 5.66  # the applied steps' norms are 5.647, 5.665, 5.665, 5.638, 5.798
ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
LARS = {"lr": 0.5, "momentum": 0.9, "weight_decay": 5e-5, "trust_coefficient": 0.02, "eps": 1e-8}
MUON = {"kind": "muon", "lr": 0.02, "weight_decay": 0.1, "momentum": 0.95, "ns_steps": 5, "ns_eps": 1e-7,
        "aux_lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-10}
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's defaults (docs/math.md)
CASES = [
    ("sgd_decoupled", sgd_case("sgd", 0.1, 0.0, 0.01, "decoupled")),
    ("sgd_l2", sgd_case("sgd", 0.1, 0.0, 0.01, "l2")),
    ("sgd_nowd", sgd_case("sgd", 0.1, 0.0, 0.0, "decoupled")),
    ("sgd_momentum_decoupled", sgd_case("sgd_momentum", 0.05, 0.9, 5e-3, "decoupled")),
    ("sgd_momentum_l2", sgd_case("sgd_momentum", 0.05, 0.9, 5e-3, "l2")),
    ("sgd_momentum_nowd", sgd_case("sgd_momentum", 0.05, 0.9, 0.0, "decoupled")),
    ("sgd_nesterov_decoupled", sgd_case("sgd_nesterov", 0.05, 0.9, 5e-3, "decoupled")),
    ("sgd_nesterov_l2", sgd_case("sgd_nesterov", 0.05, 0.9, 5e-3, "l2")),
    ("sgd_nesterov_nowd", sgd_case("sgd_nesterov", 0.05, 0.9, 0.0, "decoupled")),
    ("adam", dict(kind="adam", weight_decay=0.01, **ADAM)),
    ("adamw", dict(kind="adamw", weight_decay=0.05, **ADAM)),
    ("lars", dict(kind="lars", **LARS)),
    ("lars_nesterov", dict(kind="lars_nesterov", **LARS)),
    # New cases go last: a case's inputs depend on its index.
    ("lion", dict(kind="lion", lr=1e-3, beta1=0.9, beta2=0.99, weight_decay=0.1)),
    ("lamb", dict(kind="lamb", lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.01)),
    # Global clipping, active on some applied steps and not on others (checked in write_case).
    ("adamw_clip", dict(kind="adamw", weight_decay=0.05, max_grad_norm=CLIP_MAX_NORM, **ADAM)),
    # Muon on the weight-role tensors (each a shape[0] x prod(shape[1:]) matrix), the auxiliary
    # AdamW on the bias-like ones; tolerance: muon_tolerance().
    ("muon", dict(MUON, nesterov=True, adjust_lr=0)),
    ("muon_match_rms", dict(MUON, nesterov=False, adjust_lr=1)),
]


# ---- deterministic inputs: splitmix64, so the bits do not depend on numpy's generators ----

def uniform01(seed, n):
    """n doubles in [0, 1) from splitmix64 keyed by seed (53 random bits each)."""
    with np.errstate(over="ignore"):
        x = np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def make_inputs(case_index):
    """init (float32 per parameter) and grads[step][param] (float32, already times the loss scale)."""
    base = 1000003 * (case_index + 1)
    init = []
    for p, (_, shape, _, (how, scale), _) in enumerate(LAYOUT):
        n = int(np.prod(shape))
        u = uniform01(base + 7919 * p, n) * 2.0 - 1.0
        w = (1.0 + scale * u) if how == "around_one" else scale * u
        init.append(w.astype(np.float32).reshape(shape))
    grads = []
    for t in range(STEPS):
        row = []
        for p, (_, shape, _, _, (lo, hi)) in enumerate(LAYOUT):
            n = int(np.prod(shape))
            u = uniform01(base + 104729 * (t + 1) + 7919 * p + 17, 2 * n)
            sign = np.where(u[:n] < 0.5, -1.0, 1.0)
            g_hat = sign * 10.0 ** (lo + (hi - lo) * u[n:])
            row.append((g_hat * LOSS_SCALES[t]).astype(np.float32).reshape(shape))
        grads.append(row)
    bad = [float("nan"), float("inf"), float("-inf")][case_index % 3]
    target = [name for name, *_ in LAYOUT].index("layer2.conv.weight")
    flat = grads[NONFINITE_STEP][target].reshape(-1)
    flat[(37 * case_index) % flat.size] = bad
    return init, grads


LR_FACTORS = [1.0, 1.0, 0.0, 0.9, 0.8, 0.7]  # step 2 applies lr = 0; step 4 is skipped
LOSS_SCALES = [1024.0, 1024.0, 512.0, 512.0, 65536.0, 256.0]


# ---- float64 reference, written from docs/math.md ----

def bias_correction(beta, t):
    """1/(1 - beta^t) in double; beta^t by repeated multiplication (the exact product is not the
    point here, a deterministic one is)."""
    power = 1.0
    for _ in range(t):
        power *= beta
    return 1.0 / (1.0 - power)


def norm(x):
    """L2 norm in double, correctly rounded sum (math.fsum), so it is the same on every machine."""
    return math.sqrt(math.fsum((x.reshape(-1) * x.reshape(-1)).tolist()))


def clip_coefficient(ghs, max_norm):
    """torch.nn.utils.clip_grad_norm_ (norm 2) over every parameter: (coefficient, total)."""
    total = math.sqrt(math.fsum(float(x) * float(x) for g in ghs for x in g.reshape(-1)))
    return min(1.0, max_norm / (total + 1e-6)), total


def lerp(a, b, weight):
    """torch.lerp's formula (docs/math.md, "Muon: the kind"), in double."""
    return a + weight * (b - a) if abs(weight) < 0.5 else b - (b - a) * (1.0 - weight)


def muon_matrix_shape(shape):
    """The matrix Muon sees: shape[0] rows, prod(shape[1:]) columns (a 1-D tensor is one row)."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, int(shape[0])
    return int(shape[0]), int(np.prod(shape[1:]))


def muon_lr_factor(adjust_lr, rows, cols):
    """torch's adjust_lr_fn: 0 original, sqrt(max(1, A/B)); 1 match_rms_adamw, 0.2 sqrt(max(A, B))."""
    if adjust_lr == 1:
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1.0, rows / cols)) if cols > 0 else 1.0


def matmul_f64(x, y):
    """x @ y in double, each element summed over k in increasing order by element-wise numpy
    operations (no BLAS, whose order may change between machines): the same bits everywhere."""
    out = np.zeros((x.shape[0], y.shape[1]))
    for k in range(x.shape[1]):
        out = out + np.multiply.outer(x[:, k], y[k, :])
    return out


def newton_schulz_f64(u, steps, eps, coefficients=NS_COEFFICIENTS):
    """docs/math.md's Newton–Schulz in double: X = u/max(||u||_F, eps) (on u^T when rows > cols),
    then `steps` times A = X X^T, B = b A + c A A, X = a X + B X."""
    a, b, c = coefficients
    if u.size == 0:
        return u.copy()
    tall = u.shape[0] > u.shape[1]
    x = u.T.copy() if tall else u.copy()
    x = x / max(norm(x), eps)
    for _ in range(steps):
        g = matmul_f64(x, x.T)
        x = a * x + matmul_f64(b * g + c * matmul_f64(g, g), x)
    return x.T.copy() if tall else x


def reference(opt, init, grads, lrs, scales, norms=None, paths=None):
    """Runs the case in float64. Returns (w, m, v, applied_steps) with lists per parameter; the
    applied steps' total gradient norms go to `norms` when clipping is on, and for muon each
    parameter's path sum over steps of adjusted lr * ||X||_F (0 for the bias-like ones) to `paths`."""
    if paths is not None:
        paths[:] = [0.0] * len(init)
    kind = opt["kind"]
    wd_cfg = opt.get("weight_decay", 0.0)
    l2 = opt.get("weight_decay_mode", "decoupled") == "l2"
    mom = opt.get("momentum", 0.0)
    w = [x.astype(np.float64) for x in init]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    t = 0
    for step in range(len(grads)):
        if not all(np.all(np.isfinite(g)) for g in grads[step]):
            continue  # skipped as a whole: nothing changes, t does not advance
        t += 1
        lr, scale = lrs[step], scales[step]
        ghs = [g.astype(np.float64) / scale for g in grads[step]]
        if opt.get("max_grad_norm", 0.0) > 0.0:
            coefficient, total = clip_coefficient(ghs, opt["max_grad_norm"])
            ghs = [g * coefficient for g in ghs]
            if norms is not None:
                norms.append(total)
        for i, (_, _, role, _, _) in enumerate(LAYOUT):
            weight_group = role in WEIGHT_ROLES
            wd = wd_cfg if weight_group else 0.0
            gh = ghs[i]
            if kind == "sgd":
                w[i] = w[i] - lr * (gh + wd * w[i]) if l2 else w[i] * (1.0 - lr * wd) - lr * gh
            elif kind in ("sgd_momentum", "sgd_nesterov") or (kind.startswith("lars") and not weight_group):
                nesterov = kind.endswith("nesterov")
                gp = gh + wd * w[i] if l2 else gh
                m[i] = mom * m[i] + gp
                step_dir = mom * m[i] + gp if nesterov else m[i]
                w[i] = w[i] - lr * step_dir if l2 else w[i] * (1.0 - lr * wd) - lr * step_dir
            elif kind in ("adam", "adamw"):
                b1, b2, eps = opt["beta1"], opt["beta2"], opt["eps"]
                if kind == "adam":
                    gp = gh + wd * w[i]
                else:
                    w[i] = w[i] * (1.0 - lr * wd)
                    gp = gh
                m[i] = b1 * m[i] + (1.0 - b1) * gp
                v[i] = b2 * v[i] + (1.0 - b2) * gp * gp
                w[i] = w[i] - lr * (m[i] * bias_correction(b1, t)) / (np.sqrt(v[i] * bias_correction(b2, t)) + eps)
            elif kind in ("lars", "lars_nesterov"):
                tc, eps = opt["trust_coefficient"], opt["eps"]
                w_norm, g_norm = norm(w[i]), norm(gh)
                eta = 1.0
                if w_norm >= 1e-12 and g_norm >= 1e-12:
                    eta = tc * w_norm / (g_norm + wd * w_norm + eps)
                eta = min(eta, 100.0)
                p = gh + wd * w[i]
                m[i] = mom * m[i] + lr * eta * p
                w[i] = w[i] - (mom * m[i] + lr * eta * p) if kind == "lars_nesterov" else w[i] - m[i]
            elif kind == "lion":
                b1, b2 = opt["beta1"], opt["beta2"]
                c = b1 * m[i] + (1.0 - b1) * gh
                w[i] = w[i] * (1.0 - lr * wd) - lr * np.sign(c)  # sign(0) = 0
                m[i] = b2 * m[i] + (1.0 - b2) * gh
            elif kind == "muon" and weight_group:
                mu = opt["momentum"]
                m[i] = lerp(m[i], gh, 1.0 - mu)
                u = lerp(gh, m[i], mu) if opt["nesterov"] else m[i]
                rows, cols = muon_matrix_shape(w[i].shape)
                x = newton_schulz_f64(u.reshape(rows, cols), opt["ns_steps"], opt["ns_eps"]).reshape(w[i].shape)
                # decay with the unadjusted lr, then the update with the adjusted one (torch.optim.Muon)
                adjusted = lr * muon_lr_factor(opt["adjust_lr"], rows, cols)
                w[i] = w[i] * (1.0 - lr * wd) - adjusted * x
                if paths is not None:
                    paths[i] += adjusted * norm(x)
            elif kind == "muon":  # the auxiliary AdamW: lr aux_lr (no schedule), no weight decay
                b1, b2, eps = opt["beta1"], opt["beta2"], opt["eps"]
                m[i] = b1 * m[i] + (1.0 - b1) * gh
                v[i] = b2 * v[i] + (1.0 - b2) * gh * gh
                w[i] = w[i] - opt["aux_lr"] * (m[i] * bias_correction(b1, t)) / (np.sqrt(v[i] * bias_correction(b2, t)) + eps)
            elif kind == "lamb":
                b1, b2, eps = opt["beta1"], opt["beta2"], opt["eps"]
                m[i] = b1 * m[i] + (1.0 - b1) * gh
                v[i] = b2 * v[i] + (1.0 - b2) * gh * gh
                u = (m[i] * bias_correction(b1, t)) / (np.sqrt(v[i] * bias_correction(b2, t)) + eps) + wd * w[i]
                r = 1.0  # the bias-like group is not adapted
                if weight_group:
                    w_norm, u_norm = norm(w[i]), norm(u)
                    r = w_norm / u_norm if w_norm > 0.0 and u_norm > 0.0 else 1.0
                w[i] = w[i] - lr * r * u
            else:
                raise ValueError(kind)
    return w, m, v, t


# ---- independent checks ----

def lars_second_opinion(opt, init, grads, lrs, scales):
    """LARS once more, element by element in plain Python floats, organised the way timm's Lars
    is (scale the decayed gradient by the local lr, then momentum), with this project's
    semantics: lr inside the momentum, bias-like tensors not adapted and not decayed, ratio
    clamped at 100. Shares no code with reference()."""
    nesterov = opt["kind"] == "lars_nesterov"
    params = [[float(x) for x in a.reshape(-1)] for a in init]
    bufs = [[0.0] * len(p) for p in params]
    for step, row in enumerate(grads):
        flat = [[float(x) for x in g.reshape(-1)] for g in row]
        if any(not math.isfinite(x) for g in flat for x in g):
            continue
        lr = lrs[step]
        for i, (_, _, role, _, _) in enumerate(LAYOUT):
            p, buf = params[i], bufs[i]
            d = [x / scales[step] for x in flat[i]]
            if role in WEIGHT_ROLES:
                wd = opt["weight_decay"]
                pn = math.sqrt(sum(x * x for x in p)) if p else 0.0
                gn = math.sqrt(sum(x * x for x in d)) if d else 0.0
                trust = opt["trust_coefficient"] * pn / (gn + wd * pn + opt["eps"]) if pn >= 1e-12 and gn >= 1e-12 else 1.0
                local = lr * (trust if trust < 100.0 else 100.0)
                for j in range(len(p)):
                    dp = (d[j] + wd * p[j]) * local
                    buf[j] = opt["momentum"] * buf[j] + dp
                    p[j] -= dp + opt["momentum"] * buf[j] if nesterov else buf[j]
            else:
                for j in range(len(p)):
                    buf[j] = opt["momentum"] * buf[j] + d[j]
                    p[j] -= lr * (d[j] + opt["momentum"] * buf[j] if nesterov else buf[j])
    return params, bufs


def muon_second_opinion(opt, init, grads, lrs, scales):
    """Muon once more in plain Python floats, sharing no code with reference(): the momentum as
    mu*m + (1-mu)*g (torch's lerp in another form), Nesterov as g + mu*(m - g), and Newton–Schulz
    without transposing: a wide matrix as X <- a X + b (X X^T) X + c (X X^T)(X X^T) X, a tall one
    with the Gram matrix on the other side, X <- a X + b X (X^T X) + c X (X^T X)(X^T X). The
    bias-like tensors take AdamW with lr aux_lr. Returns (w, m, v) as flat lists per parameter."""
    a, b, c = 3.4445, -4.7750, 2.0315
    mu, steps, ns_eps = opt["momentum"], opt["ns_steps"], opt["ns_eps"]

    def mat(x, y):  # lists of rows
        yt = list(zip(*y))
        return [[sum(p * q for p, q in zip(row, col)) for col in yt] for row in x]

    def transpose(x):
        return [list(r) for r in zip(*x)]

    params = [[float(x) for x in a_.reshape(-1)] for a_ in init]
    ms = [[0.0] * len(p) for p in params]
    vs = [[0.0] * len(p) for p in params]
    applied = 0
    for step, row in enumerate(grads):
        flat = [[float(x) for x in g.reshape(-1)] for g in row]
        if any(not math.isfinite(x) for g in flat for x in g):
            continue
        applied += 1
        lr = lrs[step]
        for i, (_, shape, role, _, _) in enumerate(LAYOUT):
            p, m_, v_ = params[i], ms[i], vs[i]
            d = [x / scales[step] for x in flat[i]]
            if role not in WEIGHT_ROLES:
                b1, b2 = opt["beta1"], opt["beta2"]
                for j in range(len(p)):
                    m_[j] = b1 * m_[j] + (1.0 - b1) * d[j]
                    v_[j] = b2 * v_[j] + (1.0 - b2) * d[j] * d[j]
                    mhat = m_[j] / (1.0 - b1 ** applied)
                    vhat = v_[j] / (1.0 - b2 ** applied)
                    p[j] -= opt["aux_lr"] * mhat / (math.sqrt(vhat) + opt["eps"])
                continue
            if not p:
                continue
            rows = shape[0] if shape else 1
            cols = len(p) // rows
            for j in range(len(p)):
                m_[j] = mu * m_[j] + (1.0 - mu) * d[j]
            upd = [d[j] + mu * (m_[j] - d[j]) for j in range(len(p))] if opt["nesterov"] else list(m_)
            x = [upd[r * cols:(r + 1) * cols] for r in range(rows)]
            scale = max(math.sqrt(sum(e * e for e in upd)), ns_eps)
            x = [[e / scale for e in r] for r in x]
            for _ in range(steps):
                if rows <= cols:
                    g = mat(x, transpose(x))
                    y = mat(g, x)
                    z = mat(g, y)
                else:
                    g = mat(transpose(x), x)
                    y = mat(x, g)
                    z = mat(y, g)
                x = [[a * x[r][k] + b * y[r][k] + c * z[r][k] for k in range(cols)] for r in range(rows)]
            if opt["adjust_lr"] == 1:
                factor = 0.2 * math.sqrt(max(rows, cols))
            else:
                factor = math.sqrt(max(1.0, rows / cols))
            wd = opt["weight_decay"]
            for j in range(len(p)):
                p[j] = p[j] * (1.0 - lr * wd) - lr * factor * x[j // cols][j % cols]
    return params, ms, vs


def torch_steps(torch, optimizers, scheduled, ps, grads, lrs, scales, max_grad_norm=0.0):
    """The case's steps through torch.optim: a step with a non-finite gradient left out, the
    scheduled optimizers' lr set to the step's, each gradient unscaled (in float64, shaped as its
    parameter), clipped when max_grad_norm > 0, then every optimizer stepped in order."""
    for step, row in enumerate(grads):
        if not all(np.all(np.isfinite(g)) for g in row):
            continue
        for o in scheduled:
            for group in o.param_groups:
                group["lr"] = lrs[step]
        for p, g in zip(ps, row):
            p.grad = torch.tensor(g.astype(np.float64).reshape(tuple(p.shape)) / scales[step])
        if max_grad_norm > 0.0:
            torch.nn.utils.clip_grad_norm_(ps, max_grad_norm)
        for o in optimizers:
            o.step()


def torch_muon_opinion(torch, opt, init, grads, lrs, scales):
    """torch.optim.Muon (its bf16 Newton–Schulz) on the weight-role tensors viewed as
    shape[0] x prod(shape[1:]) float64 matrices, torch.optim.AdamW (lr aux_lr, weight decay 0) on
    the bias-like ones. Returns (w, m, v) lists of numpy arrays; v is None for the matrices."""
    ps, matrices, biases = [], [], []
    for x, (_, shape, role, _, _) in zip(init, LAYOUT):
        if role in WEIGHT_ROLES:
            p = torch.tensor(x.astype(np.float64).reshape(muon_matrix_shape(shape)), requires_grad=True)
            matrices.append(p)
        else:
            p = torch.tensor(x.astype(np.float64), requires_grad=True)
            biases.append(p)
        ps.append(p)
    muon = torch.optim.Muon(matrices, lr=opt["lr"], weight_decay=opt["weight_decay"], momentum=opt["momentum"],
                            nesterov=opt["nesterov"], ns_steps=opt["ns_steps"], eps=opt["ns_eps"],
                            adjust_lr_fn="match_rms_adamw" if opt["adjust_lr"] == 1 else "original")
    aux = torch.optim.AdamW(biases, lr=opt["aux_lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"],
                            weight_decay=0.0)
    torch_steps(torch, [muon, aux], [muon], ps, grads, lrs, scales)
    w = [p.detach().numpy().reshape(x.shape).copy() for p, x in zip(ps, init)]
    m = [(muon.state[p]["momentum_buffer"] if p in muon.state else aux.state[p]["exp_avg"]).numpy().reshape(x.shape).copy()
         for p, x in zip(ps, init)]
    v = [None if spec[2] in WEIGHT_ROLES else aux.state[p]["exp_avg_sq"].numpy().copy() for p, spec in zip(ps, LAYOUT)]
    return w, m, v


def torch_opinion(torch, opt, init, grads, lrs, scales):
    """The same run through torch.optim in float64 (skipped steps left out). Returns (w, m, v)
    lists of numpy arrays, m/v None where the optimizer keeps no such state."""
    kind = opt["kind"]
    ps = [torch.tensor(x.astype(np.float64), requires_grad=True) for x in init]
    weights = [p for p, spec in zip(ps, LAYOUT) if spec[2] in WEIGHT_ROLES]
    biases = [p for p, spec in zip(ps, LAYOUT) if spec[2] not in WEIGHT_ROLES]
    groups = [{"params": weights, "weight_decay": opt.get("weight_decay", 0.0)}, {"params": biases, "weight_decay": 0.0}]
    if kind.startswith("sgd"):
        o = torch.optim.SGD(groups, lr=opt["lr"], momentum=opt.get("momentum", 0.0), nesterov=kind == "sgd_nesterov")
    elif kind == "adam":
        o = torch.optim.Adam(groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    elif kind == "adamw":
        o = torch.optim.AdamW(groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"])
    elif kind == "lion":
        o = timm_optim("lion").Lion(groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]))
    else:
        o = timm_optim("lamb").Lamb(groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"],
                                    max_grad_norm=None)
    torch_steps(torch, [o], [o], ps, grads, lrs, scales, opt.get("max_grad_norm", 0.0))
    w = [p.detach().numpy().copy() for p in ps]
    key_m = "momentum_buffer" if kind.startswith("sgd") else "exp_avg"
    m = None if kind == "sgd" else [o.state[p][key_m].numpy().copy() for p in ps]
    v = [o.state[p]["exp_avg_sq"].numpy().copy() for p in ps] if kind in ("adam", "adamw", "lamb") else None
    return w, m, v


def timm_optim(module):
    """timm.optim.<module> without importing timm itself (its __init__ needs torchvision): the
    optim folder as a stand-alone package. Raises ImportError when timm is not installed."""
    import importlib
    import importlib.util
    import types
    spec = importlib.util.find_spec("timm")
    if spec is None or spec.origin is None:
        raise ImportError("timm is not installed")
    if "timm_optim_only" not in sys.modules:
        pkg = types.ModuleType("timm_optim_only")
        pkg.__path__ = [os.path.join(os.path.dirname(spec.origin), "optim")]
        sys.modules["timm_optim_only"] = pkg
    return importlib.import_module("timm_optim_only." + module)


def max_rel_diff(ours, theirs):
    """Largest per-tensor max|a - b| / max|b| (max|a - b| where b is all zero)."""
    worst = 0.0
    for a, b in zip(ours, theirs):
        a, b = np.asarray(a, dtype=np.float64).reshape(-1), np.asarray(b, dtype=np.float64).reshape(-1)
        if a.size == 0:
            continue
        scale = np.max(np.abs(b))
        d = np.max(np.abs(a - b))
        worst = max(worst, float(d / scale if scale > 0 else d))
    return worst


# ---- files ----

def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, numpy array); F32 or F64, little-endian, data in list order."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, a in tensors:
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}[a.dtype]
        data = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# docs/math.md "Muon: the kind", Against float64: the bound on the share of a matrix's path that
# exact mode's Newton-Schulz adds before its diagonal split. The tests now hold the split to
# kMuonNsRelError = 1e-3; the cases keep 1e-2, since one tolerance for the whole case (the
# strictest matrix's bound) at 1e-3 would be 3.0e-5, under muon's fc.weight error of 3.14e-5.
MUON_NS_REL_ERROR = 1e-2


def muon_tolerance(w, paths):
    """The muon cases' tolerance: docs/math.md's bound on how far the exact-mode Newton–Schulz
    may take a matrix from the float64 one, MUON_NS_REL_ERROR * path / ||w|| (path: sum over
    applied steps of adjusted lr * ||X||_F), at its strictest over the case's matrices and
    rounded down to two digits, so one number that no matrix's own bound is below. Measured by
    `renaissance replay` (CPU, exact mode with the diagonal split): muon's worst matrix 3.14e-5
    (fc.weight) under 3.0e-4, muon_match_rms's 2.85e-5 under 7.3e-4 (1.13e-4 and 1.19e-4
    before the split)."""
    bounds = [MUON_NS_REL_ERROR * p / norm(x) for x, p in zip(w, paths) if p > 0.0]
    t = min(bounds)
    exponent = math.floor(math.log10(t)) - 1
    return float(f"{math.floor(t / 10.0 ** exponent)}e{exponent}")  # parsed: the shortest double


def write_case(out_dir, index, name, opt):
    init, grads = make_inputs(index)
    lrs = [opt["lr"] * f for f in LR_FACTORS]
    norms, paths = [], []
    w, m, v, applied = reference(opt, init, grads, lrs, LOSS_SCALES, norms, paths)
    assert applied == STEPS - 1
    if opt.get("max_grad_norm", 0.0) > 0.0:
        clipped = sum(1 for x in norms if x > opt["max_grad_norm"])
        assert 0 < clipped < len(norms), "%s: the clip must be active on some steps only: %s" % (name, norms)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    case = {
        "format": FORMAT,
        "name": name,
        "optimizer": opt,
        "steps": STEPS,
        "lr_per_step": lrs,
        "loss_scale_per_step": LOSS_SCALES,
        "params": [{"name": n, "shape": s, "role": r} for n, s, r, _, _ in LAYOUT],
    }
    if opt["kind"] == "muon":
        case["tolerance"] = muon_tolerance(w, paths)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
        f.write("\n")
    write_safetensors(os.path.join(d, "init.safetensors"), [(n, a) for (n, *_), a in zip(LAYOUT, init)])
    write_safetensors(os.path.join(d, "grads.safetensors"),
                      [(f"step{t}/{n}", grads[t][i]) for t in range(STEPS) for i, (n, *_) in enumerate(LAYOUT)])
    expected = [(n, w[i]) for i, (n, *_) in enumerate(LAYOUT)]
    if opt["kind"] != "sgd":
        expected += [(f"m/{n}", m[i]) for i, (n, *_) in enumerate(LAYOUT)]
    if opt["kind"] in ("adam", "adamw", "lamb", "muon"):  # muon: the aux AdamW's; zero for the matrices
        expected += [(f"v/{n}", v[i]) for i, (n, *_) in enumerate(LAYOUT)]
    write_safetensors(os.path.join(d, "expected.safetensors"), expected,
                      {"generator": "scripts/make_testdata.py", "precision": "float64"})
    return init, grads, lrs, (w, m, v)


def calibrate(torch, index, name, opt, init, grads, lrs, ours):
    """One calibration.json entry, or None where no outside reference applies."""
    w, m, v = ours
    kind = opt["kind"]
    if kind.startswith("lars"):
        pw, pm = lars_second_opinion(opt, init, grads, lrs, LOSS_SCALES)
        return {"against": "second float64 LARS implementation in scripts/make_testdata.py",
                "max_rel_diff_w": max_rel_diff(w, pw), "max_rel_diff_m": max_rel_diff(m, pm)}
    if kind == "muon":
        return calibrate_muon(torch, opt, init, grads, lrs, ours)
    if torch is None:
        return None
    if opt.get("weight_decay_mode") == "decoupled" and opt.get("weight_decay", 0.0) > 0.0:
        return None  # torch.optim.SGD has no decoupled weight decay
    if kind in ("lion", "lamb"):
        try:
            timm_optim(kind)
        except ImportError as e:
            print(f"{name}: timm not importable ({e}): no cross-check", file=sys.stderr)
            return None
    tw, tm, tv = torch_opinion(torch, opt, init, grads, lrs, LOSS_SCALES)
    against = {"adam": "torch.optim.Adam", "adamw": "torch.optim.AdamW", "lion": "timm.optim.Lion",
               "lamb": "timm.optim.Lamb(max_grad_norm=None)"}.get(kind, "torch.optim.SGD")
    if opt.get("max_grad_norm", 0.0) > 0.0:
        against = "torch.nn.utils.clip_grad_norm_ + " + against
    entry = {"against": against + " float64", "max_rel_diff_w": max_rel_diff(w, tw)}
    if tm is not None:
        entry["max_rel_diff_m"] = max_rel_diff(m, tm)
    if tv is not None:
        entry["max_rel_diff_v"] = max_rel_diff(v, tv)
    return entry


def calibrate_muon(torch, opt, init, grads, lrs, ours):
    """Muon's entry: the second float64 implementation (the tight check: float64 both sides, the
    same math), and where torch.optim.Muon exists (torch >= 2.9) torch's run: its momentum
    buffers and the aux AdamW agree to float64 rounding, its weights only to what its bf16
    Newton–Schulz keeps (bf16_ns_*: about 1e-2 relative, the gap docs/math.md measures)."""
    w, m, v = ours
    sw, sm, sv = muon_second_opinion(opt, init, grads, lrs, LOSS_SCALES)
    entry = {"against": "second float64 Muon implementation in scripts/make_testdata.py",
             "max_rel_diff_w": max_rel_diff(w, sw), "max_rel_diff_m": max_rel_diff(m, sm),
             "max_rel_diff_v": max_rel_diff(v, sv)}
    if torch is None or not hasattr(torch.optim, "Muon"):
        print(f"muon: torch.optim.Muon not importable (torch >= 2.9): no torch cross-check", file=sys.stderr)
        return entry
    tw, tm, tv = torch_muon_opinion(torch, opt, init, grads, lrs, LOSS_SCALES)
    matrix = [spec[2] in WEIGHT_ROLES for spec in LAYOUT]
    pick = lambda xs, want: [x for x, is_matrix in zip(xs, matrix) if is_matrix == want]
    entry["torch"] = {
        "against": "torch.optim.Muon (bf16 Newton-Schulz) + torch.optim.AdamW, float64 parameters, torch " +
                   torch.__version__,
        "max_rel_diff_m": max_rel_diff(m, tm),
        "max_rel_diff_w_aux": max_rel_diff(pick(w, False), pick(tw, False)),
        "max_rel_diff_v_aux": max_rel_diff(pick(v, False), pick(tv, False)),
        "bf16_ns_rel_diff_w_matrices": max_rel_diff(pick(w, True), pick(tw, True)),
    }
    return entry


def tight_diffs(entry):
    """The float64-against-float64 figures of a calibration entry (keys max_rel*, nested too)."""
    for k, x in entry.items():
        if isinstance(x, dict):
            yield from tight_diffs(x)
        elif k.startswith("max_rel"):
            yield x


def generate(out_dir, use_torch):
    torch = None
    if use_torch:
        try:
            import torch as torch_module
            torch_module.set_default_dtype(torch_module.float64)
            torch = torch_module
        except ImportError:
            print("torch not importable: the torch.optim cross-check is left out", file=sys.stderr)
    calibration = {}
    for index, (name, opt) in enumerate(CASES):
        init, grads, lrs, ours = write_case(out_dir, index, name, opt)
        if use_torch:
            entry = calibrate(torch, index, name, opt, init, grads, lrs, ours)
            if entry is not None:
                calibration[name] = entry
    if not use_torch:
        return 0
    worst = max(x for e in calibration.values() for x in tight_diffs(e))
    doc = {
        "generated": datetime.date.today().isoformat(),
        "numpy": np.__version__,
        "torch": torch.__version__ if torch is not None else None,
        "note": "max over tensors of max|ours - theirs| / max|theirs|, float64 both sides; "
                "decoupled-weight-decay SGD cases have no torch.optim counterpart; muon's torch entry: "
                "torch.optim.Muon orthogonalises in bf16, so its weights (bf16_ns_rel_diff_w_matrices) "
                "differ at the bf16 level, not at float64 rounding",
        "cases": calibration,
    }
    with open(os.path.join(out_dir, "calibration.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for name, e in calibration.items():
        for sub in (e, e.get("torch", {})):
            if sub:
                print(f"{name:24s} {sub['against']:60s} " +
                      " ".join(f"{k}={x:.3g}" for k, x in sub.items() if k not in ("against", "torch")))
    # float64 against float64 with the same formula: anything above a few ulps of accumulated
    # rounding means the reference and the outside implementation disagree on the math.
    if worst > 1e-12:
        print(f"error: a cross-check differs by {worst:.3g} (> 1e-12)", file=sys.stderr)
        return 1
    return 0


def check(out_dir):
    """Regenerates without torch into a temporary folder and compares every case file byte for byte."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp, use_torch=False)
        bad = []
        for name, _ in CASES:
            for f in ("case.json", "init.safetensors", "grads.safetensors", "expected.safetensors"):
                a, b = os.path.join(tmp, name, f), os.path.join(out_dir, name, f)
                if not os.path.exists(b) or not filecmp.cmp(a, b, shallow=False):
                    bad.append(os.path.join(name, f))
        for b in bad:
            print(f"differs from a fresh generation: {b}", file=sys.stderr)
        print(f"{len(CASES)} cases regenerated, {len(bad)} files differ")
        return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output folder (default testdata/replay)")
    ap.add_argument("--check", action="store_true", help="compare a fresh generation with --out, write nothing")
    ap.add_argument("--no-torch", action="store_true", help="skip the cross-checks and calibration.json")
    args = ap.parse_args()
    if args.check:
        return check(args.out)
    os.makedirs(args.out, exist_ok=True)
    return generate(args.out, use_torch=not args.no_torch)


if __name__ == "__main__":
    sys.exit(main())
