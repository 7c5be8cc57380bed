"""bf16/fp16 parameters in renaissance.torch: fp32 masters in the arena, .data a view of
the bf16/fp16 model copy, .grad a view of the model-dtype gradients.

The references are written here without the library: fp32 masters updated by docs/math.md's
AdamW rule op by op (one numpy float32 operation per operation, no fused op), then copied to the
model dtype with torch's .to() (round to nearest even). The library's parameters must equal
them BIT FOR BIT. torch.optim.AdamW computes the update in another operation order (sqrt(v)/
sqrt(1-b2^t), lr/(1-b1^t), fused multiply-adds on the CPU), so against it the test holds a
tolerance (measured: see test_bf16_cnn_against_torch_adamw). Runs on CUDA too when the machine has
one and the build has the CUDA backend (scripts/gpu.sh python)."""
import json
import os
import struct

import numpy as np
import pytest
import torch
from sklearn import datasets

import renaissance
import renaissance.torch as rt

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and renaissance.with_cuda else [])



def set_grad(p, g):
    """p's gradient for the next step: written into its .grad (the arena's view, or a tensor of
    autograd's) when it has one, else handed over as a fresh tensor on p's device (read in place
    by the step), as backward does."""
    if p.grad is None:
        p.grad = g.detach().to(p.device).clone()
    else:
        p.grad.copy_(g)


def f32(x):
    """x rounded to float32 (the library's float slots), as a Python float."""
    return struct.unpack("f", struct.pack("f", x))[0]


def pow_d(base, t):
    """base^t by binary exponentiation in double, as docs/math.md's bias corrections form it."""
    result = 1.0
    while t:
        if t & 1:
            result *= base
        base *= base
        t >>= 1
    return result


class MathAdamW:
    """docs/math.md's adamw on fp32 masters, one numpy float32 operation per operation. numpy, not
    torch: on the H200 host (Xeon, torch 2.11) torch's own CPU kernels gave other bits for the
    same ops, while numpy's float32 +, -, *, / and sqrt are single IEEE operations.
    w, m, v are CPU torch tensors sharing the arrays' memory."""

    def __init__(self, masters, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        self._w = [w.detach().cpu().float().numpy().copy() for w in masters]
        self._m = [np.zeros_like(w) for w in self._w]
        self._v = [np.zeros_like(w) for w in self._w]
        self.w = [torch.from_numpy(a) for a in self._w]
        self.m = [torch.from_numpy(a) for a in self._m]
        self.v = [torch.from_numpy(a) for a in self._v]
        self.t = 0
        self.b1d, self.b2d = betas
        f = np.float32
        self.lr, self.decay = f(f32(lr)), f(f32(1.0 - lr * weight_decay))
        self.b1, self.b2 = f(f32(betas[0])), f(f32(betas[1]))
        self.omb1, self.omb2 = f(f32(1.0 - betas[0])), f(f32(1.0 - betas[1]))
        self.eps = f(f32(eps))

    def step(self, grads, inv_scale=1.0):
        self.t += 1
        f = np.float32
        bc1 = f(f32(1.0 / (1.0 - pow_d(self.b1d, self.t))))
        bc2 = f(f32(1.0 / (1.0 - pow_d(self.b2d, self.t))))
        for w, m, v, g in zip(self._w, self._m, self._v, grads):
            g = g.detach().float().cpu().numpy() * f(f32(inv_scale))
            w[...] = w * self.decay
            m[...] = (m * self.b1) + (g * self.omb1)
            v[...] = (v * self.b2) + ((g * g) * self.omb2)
            w[...] = w - ((m * bc1) * self.lr) / (np.sqrt(v * bc2) + self.eps)


def bits(t):
    """The raw bits of a tensor (bf16/fp16 as int16, fp32 as int32) on the host."""
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def digits(device, dtype):
    d = datasets.load_digits()
    x = torch.tensor(d.images / 16.0, dtype=torch.float32).unsqueeze(1).to(device=device, dtype=dtype)
    return x, torch.tensor(d.target, dtype=torch.int64, device=device)


def mlp():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 48), torch.nn.Tanh(), torch.nn.Linear(48, 10))


def cnn():
    # A strided conv rather than pooling (see test_torch_train.py).
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.Tanh(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.Tanh(), torch.nn.Flatten(),
        torch.nn.Linear(16 * 4 * 4, 10))


def twins(make, device, dtype=torch.bfloat16):
    if device == "cuda":  # the twins' backward must be bit-identical: no nondeterministic conv kernels
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    a = make().to(device=device, dtype=dtype)
    b = make().to(device=device, dtype=dtype)
    b.load_state_dict(a.state_dict())
    return a, b


def batches(n, x, y, size=64):
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        idx = torch.randint(0, x.shape[0], (size,), generator=gen).to(x.device)
        yield x[idx], y[idx]


def backward(model, xb, yb):
    model.zero_grad(set_to_none=False)
    torch.nn.functional.cross_entropy(model(xb).float(), yb).backward()


# ---- nearest: bit for bit against the plain-torch reference ------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("make", [mlp, cnn], ids=["mlp", "cnn"])
def test_bf16_bitwise_against_masters_reference(device, make):
    """30 steps of bf16 training: every parameter (the bf16 copy) and every master equal the
    reference's bits after every step. The reference is fed our gradients: a twin model's own
    backward is not bit-identical on every machine (on the H200 host's Xeon, torch 2.11's CPU
    bf16 matmuls gave the twin different gradients), and the optimizer is what is
    under test here."""
    torch.manual_seed(0)
    ours_model = make().to(device=device, dtype=torch.bfloat16)
    x, y = digits(device, torch.bfloat16)
    ref = MathAdamW([p.detach().float().clone() for p in ours_model.parameters()], lr=3e-3, weight_decay=0.05)
    opt = rt.AdamW(ours_model.parameters(), lr=3e-3, weight_decay=0.05, threads=1)
    for step, (xb, yb) in enumerate(batches(30, x, y)):
        backward(ours_model, xb, yb)
        ref.step([p.grad for p in ours_model.parameters()])
        opt.step()
        for j, p in enumerate(ours_model.parameters()):
            assert p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16
            assert same_bits(p, ref.w[j].to(torch.bfloat16)), "step %d parameter %d: the bf16 copy differs" % (step, j)
            assert same_bits(opt.state[p]["master_weight"], ref.w[j]), "step %d parameter %d: master" % (step, j)
            assert same_bits(opt.state[p]["exp_avg_sq"], ref.v[j])


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_cnn_against_torch_adamw(device):
    """Against torch.optim.AdamW on fp32 masters (+ .to(bfloat16)): the masters are not bitwise
    equal (torch's operation order differs: sqrt(v)/sqrt(1-b2^t), lr/(1-b1^t), fused multiply-adds
    on the CPU; after step 1 about 15 % of the master elements differ by an ulp, after 20 steps
    46 %), but stay within 1e-6 relative L2 over 20 steps (measured 7.5e-8 on the CPU), and the bf16
    parameters differ only where a master sits at a rounding boundary (measured: none in 20
    steps; held: at least 99.9 % bitwise equal). The model trains."""
    ours_model, ref_model = twins(cnn, device)
    x, y = digits(device, torch.bfloat16)
    opt = rt.AdamW(ours_model.parameters(), lr=2e-3, weight_decay=0.05)
    ref_params = list(ref_model.parameters())
    masters = [p.detach().float().clone().requires_grad_(True) for p in ref_params]
    topt = torch.optim.AdamW(masters, lr=2e-3, weight_decay=0.05)
    worst, equal, total = 0.0, 0, 0
    for xb, yb in batches(20, x, y):
        for model in (ours_model, ref_model):
            backward(model, xb, yb)
        opt.step()
        for w, p in zip(masters, ref_params):
            w.grad = p.grad.float()
        topt.step()
        with torch.no_grad():
            for p, w in zip(ref_params, masters):
                p.copy_(w.to(torch.bfloat16))
        for p, q, w in zip(ours_model.parameters(), ref_params, masters):
            ours_w = opt.state[p]["master_weight"].double()
            worst = max(worst, float((ours_w - w.detach().double()).norm() / w.detach().double().norm()))
            equal += int((bits(p) == bits(q)).sum())
            total += p.numel()
    assert worst < 1e-6, worst
    assert equal >= 0.999 * total, (equal, total)
    with torch.no_grad():
        acc = float((ours_model(x).argmax(1) == y).float().mean())
    assert acc > 0.5, acc


# ---- master_weights=False -----------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_no_master_weights_bitwise_against_reference(device, dtype):
    """master_weights=False: every step starts from the bf16/fp16 parameters widened (no fp32
    master carried over), so after each step every parameter equals, bit for bit, the plain
    reference whose masters are replaced by its own rounded weights before each step (M and V
    stay fp32). With masters (the default) the same run ends elsewhere: the residuals matter.
    Synthetic gradients (torch 1.13 has no CPU fp16 matmul): the optimizer is under test."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(48, 64), (48,), (10, 48), (10,), (3, 3, 5, 7)]
    init = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    params = [torch.nn.Parameter(t.clone().to(device)) for t in init]
    params_m = [torch.nn.Parameter(t.clone().to(device)) for t in init]
    ref = MathAdamW([t.float() for t in init], lr=3e-3, weight_decay=0.05)
    opt = rt.AdamW(params, lr=3e-3, weight_decay=0.05, threads=1, master_weights=False)
    opt_m = rt.AdamW(params_m, lr=3e-3, weight_decay=0.05, threads=1)
    for step in range(20):
        grads = [(0.1 * torch.randn(s, generator=gen)).to(dtype) for s in shapes]
        for p, q, g in zip(params, params_m, grads):
            set_grad(p, g)
            set_grad(q, g)
        for w in ref._w:  # the reference without masters: its weights rounded, widened back
            w[...] = torch.from_numpy(w).to(dtype).float().numpy()
        ref.step(grads)
        opt.step()
        opt_m.step()
        for j, p in enumerate(params):
            assert same_bits(p, ref.w[j].to(dtype)), "step %d parameter %d differs" % (step, j)
    differ = sum(int((bits(p) != bits(q)).sum()) for p, q in zip(params, params_m))
    assert differ > 0, "master_weights=False ran the same steps as master_weights=True"


def test_no_master_weights_takes_the_parameter_as_written():
    """Without masters, writing p.data between steps is what the next step starts from (with
    masters the step starts from the master and overwrites the write); stochastic rounding is
    reproducible for a seed and independent of the thread count; the Recorder refuses the mode."""
    def run(threads, write, masters=False):
        torch.manual_seed(3)
        p = torch.nn.Parameter(torch.randn(300, 70).to(torch.bfloat16))
        opt = rt.SGD([p], lr=0.01, momentum=0.9, threads=threads, master_weights=masters,
                     stochastic_rounding=True, seed=5)
        gen = torch.Generator().manual_seed(4)
        for k in range(3):
            set_grad(p, torch.randn(300, 70, generator=gen).to(torch.bfloat16))
            opt.step()
            if write and k == 1:
                with torch.no_grad():
                    p.data.mul_(0.5)
        return bits(p).clone(), opt
    a, opt = run(1, False)
    b, _ = run(2, False)
    assert torch.equal(a, b)
    c, _ = run(1, True)
    assert not torch.equal(a, c), "the halving written between steps 2 and 3 was lost"
    # With masters the third step starts from the master and the write is overwritten.
    assert torch.equal(run(1, True, masters=True)[0], run(1, False, masters=True)[0])
    with pytest.raises(ValueError, match="master_weights=False"):
        rt.Recorder(opt, "/nonexistent-case-dir", steps=1)


# ---- stochastic rounding ------------------------------------------------------------------------
def sr_run(seed, threads=1, stochastic=True, steps=3, device="cpu"):
    """Three SGD steps of one big bf16 tensor (several CPU chunks); returns the copy's bits."""
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.randn(512, 640).to(device=device, dtype=torch.bfloat16))
    opt = rt.SGD([p], lr=0.01, momentum=0.9, threads=threads if device == "cpu" else 0,
                 stochastic_rounding=stochastic, seed=seed)
    gen = torch.Generator().manual_seed(4)
    for _ in range(steps):
        set_grad(p, torch.randn(512, 640, generator=gen).to(device=device, dtype=torch.bfloat16))
        opt.step()
    return bits(p).clone(), opt.fingerprint()


def test_stochastic_rounding_seed_and_threads():
    a, fa = sr_run(seed=1)
    b, fb = sr_run(seed=1)
    c, fc = sr_run(seed=2)
    d, fd = sr_run(seed=1, threads=2)
    n, fn = sr_run(seed=1, stochastic=False)
    assert torch.equal(a, b) and fa == fb, "the same seed must reproduce the bits"
    assert torch.equal(a, d) and fa == fd, "the thread count must not change the bits"
    assert int((a != c).sum()) > 1000 and fa != fc, "another seed must round other elements the other way"
    assert int((a != n).sum()) > 1000, "stochastic rounding must differ from nearest"


@pytest.mark.parametrize("device", DEVICES)
def test_stochastic_rounding_is_unbiased(device):
    """1 + d with d = 0.296875 bf16 ulps: nearest rounds every element down to 1; stochastic
    rounds a fraction d/ulp up, so the mean copy is 1 + d (within 5 standard errors)."""
    n = 1 << 17
    ulp = 2.0 ** -7  # bf16 spacing in [1, 2)
    d = 0.296875 * ulp  # exact in bf16 and in 1 + d in float32
    means = {}
    for stochastic in (False, True):
        p = torch.nn.Parameter(torch.ones(n, device=device, dtype=torch.bfloat16))
        opt = rt.SGD([p], lr=1.0, stochastic_rounding=stochastic, seed=11)
        set_grad(p, torch.full_like(p, -d))
        opt.step()
        assert float(opt.state[p]["master_weight"][0]) == 1.0 + d  # the master holds it exactly
        means[stochastic] = float(p.detach().double().mean())
    assert means[False] == 1.0
    sigma = ulp * (0.296875 * (1 - 0.296875) / n) ** 0.5
    assert abs(means[True] - (1.0 + d)) < 5 * sigma, (means[True], 1.0 + d, sigma)


# ---- fp16 with loss scaling ---------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_fp16_loss_scale_and_injected_inf(device):
    """fp16 parameters under a loss scale (torch 2.x's GradScaler protocol: opt.grad_scale): an
    applied step unscales exactly (the reference divides by the power-of-two scale); a gradient
    that overflows fp16 (inf) skips the step and writes nothing: copy, masters, state, count."""
    torch.manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(33, 17).to(device=device, dtype=torch.float16)),
              torch.nn.Parameter(torch.randn(5).to(device=device, dtype=torch.float16))]
    start = [p.detach().clone() for p in params]
    opt = rt.AdamW(params, lr=1e-2, weight_decay=0.01)
    ref = MathAdamW([p.float() for p in start], lr=1e-2, weight_decay=0.01)
    scale = 1024.0
    gen = torch.Generator().manual_seed(6)
    for step in range(3):
        grads = [(torch.randn(p.shape, generator=gen) * 1e-2 * scale).to(device=device, dtype=torch.float16)
                 for p in params]
        for p, g in zip(params, grads):
            set_grad(p, g)
        opt.grad_scale = torch.tensor(scale, device=device)
        opt.step()
        ref.step(grads, inv_scale=1.0 / scale)
        for p, w in zip(params, ref.w):
            assert same_bits(p, w.to(torch.float16)), step
    task = opt._bindings[0].shared.task
    before = [bits(t).clone() for t in params + [opt.state[p][k] for p in params
                                                   for k in ("master_weight", "exp_avg", "exp_avg_sq")]]
    set_grad(params[0], torch.full((33, 17), 1e-2 * scale, device=device).to(torch.float16))
    # 70000 is beyond fp16's 65504: it rounds to inf, as an overflowing backward writes it.
    params[0].grad[3, 4] = torch.tensor(70000.0).to(torch.float16)
    assert torch.isinf(params[0].grad[3, 4])
    opt.step()
    after = [bits(t) for t in params + [opt.state[p][k] for p in params for k in ("master_weight", "exp_avg", "exp_avg_sq")]]
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "a skipped step wrote something"
    assert (task.step_count, task.skipped_steps) == (3, 1)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA GPU and the CUDA backend")
def test_fp16_grad_scaler_cuda():
    """torch's own GradScaler on an fp16 model on the GPU: the scaled fp16 gradients reach the
    fused unscale; an overflowing step is skipped (copy unchanged) and the scaler backs off."""
    torch.manual_seed(7)
    model = torch.nn.Linear(32, 8).to(device="cuda", dtype=torch.float16)
    opt = rt.AdamW(model.parameters(), lr=1e-3)
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch 2.x
        scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, growth_interval=1000)
    else:
        scaler = torch.cuda.amp.GradScaler(init_scale=1024.0, growth_interval=1000)
    x = torch.randn(16, 32, device="cuda", dtype=torch.float16)
    for step in range(3):
        opt.zero_grad()
        loss = model(x).float().pow(2).mean()
        if step == 1:
            loss = loss * 1e4  # scaled by 1024 the gradients overflow fp16
        before = bits(model.weight).clone()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.cuda.synchronize()
        changed = not torch.equal(before, bits(model.weight))
        assert changed == (step != 1), step
    assert scaler.get_scale() == 512.0
    assert opt._bindings[0].shared.task.skipped_steps == 1


# ---- None gradients, groups, refusals -----------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_none_gradient_leaves_bf16_parameter_alone(device):
    """A bf16 parameter whose .grad is None keeps its copy, master and state bits; the others
    step exactly as an optimizer of just them (nearest: the rounding has no key)."""
    torch.manual_seed(8)
    ps = [torch.nn.Parameter(torch.randn(40, 8).to(device=device, dtype=torch.bfloat16)) for _ in range(3)]
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    opt = rt.AdamW(ps, lr=1e-2)
    solo = rt.AdamW([qs[0], qs[2]], lr=1e-2)
    gen = torch.Generator().manual_seed(9)
    for step in range(3):
        gs = [torch.randn(40, 8, generator=gen).to(device=device, dtype=torch.bfloat16) for _ in ps]
        opt.zero_grad(set_to_none=False)  # zeroes the .grad there are (ps[1]'s None stays None)
        for p, g in zip(ps, gs):
            set_grad(p, g)
        for q, g in zip((qs[0], qs[2]), (gs[0], gs[2])):
            set_grad(q, g)
        if step == 1:
            held = [bits(t).clone() for t in (ps[1], opt.state[ps[1]]["master_weight"], opt.state[ps[1]]["exp_avg"])]
            ps[1].grad = None
            opt.step()
            now = [bits(t) for t in (ps[1], opt.state[ps[1]]["master_weight"], opt.state[ps[1]]["exp_avg"])]
            assert all(torch.equal(a, b) for a, b in zip(held, now))
        else:
            opt.step()
        solo.step()
    assert same_bits(ps[0], qs[0]) and same_bits(ps[2], qs[2])


def test_groups_of_two_dtypes_and_refusals():
    f = torch.nn.Parameter(torch.randn(6, 4))
    b = torch.nn.Parameter(torch.randn(6, 4).to(torch.bfloat16))
    h = torch.nn.Parameter(torch.randn(3).to(torch.float16))
    opt = rt.Adam([{"params": [f]}, {"params": [b], "lr": 1e-2}, {"params": [h]}])
    assert [s.precision for s in opt._shared()] == ["fp32", "bf16", "fp16"]
    for p in (f, b, h):
        p.grad = torch.ones_like(p)
    opt.step()  # the state exists from the first step on, as in torch
    assert "master_weight" not in opt.state[f] and opt.state[b]["master_weight"].dtype == torch.float32
    with pytest.raises(ValueError, match="one dtype per param group"):
        rt.AdamW([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))])
    with pytest.raises(ValueError, match="master_weights"):
        rt.SGD([torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))], lr=0.1, master_weights=1)
    with pytest.raises(ValueError, match="no copy to round"):
        rt.Lion([torch.nn.Parameter(torch.zeros(2))], stochastic_rounding=True)
    with pytest.raises(ValueError, match="float64"):
        rt.LAMB([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))])
    with pytest.raises(ValueError, match="seed"):
        rt.LARS([torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))], seed=-1)
    # master_weights=False is fine where there is nothing to keep masters of.
    rt.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, master_weights=False)


# ---- state_dict ---------------------------------------------------------------------------------
def trained_bf16(steps=3, **kw):
    torch.manual_seed(10)
    model = mlp().to(torch.bfloat16)
    opt = rt.AdamW(model.parameters(), lr=1e-2, **kw)
    x, y = digits("cpu", torch.bfloat16)
    for xb, yb in batches(steps, x, y):
        backward(model, xb, yb)
        opt.step()
    return model, opt, (x, y)


def test_state_dict_round_trip_keeps_masters():
    """state_dict() holds the fp32 masters ('master_weight'); a new optimizer over the same model
    state loads them and continues with the bits of the uninterrupted run."""
    model, opt, (x, y) = trained_bf16()
    sd = opt.state_dict()
    assert all(s["master_weight"].dtype == torch.float32 for s in sd["state"].values())
    model2 = mlp().to(torch.bfloat16)
    model2.load_state_dict(model.state_dict())  # the model first: its parameters are the copies
    opt2 = rt.AdamW(model2.parameters(), lr=1e-2)
    opt2.load_state_dict(sd)
    assert opt2.fingerprint() == opt.fingerprint()
    for xb, yb in batches(2, x, y):
        for m, o in ((model, opt), (model2, opt2)):
            backward(m, xb, yb)
            o.step()
    assert opt2.fingerprint() == opt.fingerprint()
    # Without the masters (dropped, as in a torch state dict) each becomes its bf16 parameter
    # widened, replacing masters that had bits below bf16's precision.
    for s in sd["state"].values():
        del s["master_weight"]
    params2 = list(model2.parameters())
    assert not all(same_bits(opt2.state[p]["master_weight"], p.detach().float()) for p in params2)
    opt2.load_state_dict(sd)
    for p in params2:
        assert same_bits(opt2.state[p]["master_weight"], p.detach().float())


def test_state_dict_to_and_from_torch_adamw():
    """renaissance -> torch.optim.AdamW over the bf16 model: torch casts the state to bf16 as it
    does for any bf16 parameter and keeps 'master_weight' unused; torch -> renaissance: the state
    widened exactly, the masters the parameters widened, the step count kept."""
    model, opt, _ = trained_bf16()
    t = torch.optim.AdamW(model.parameters(), lr=1e-2)
    t.load_state_dict(opt.state_dict())
    for p in model.parameters():
        assert same_bits(t.state[p]["exp_avg"], opt.state[p]["exp_avg"].to(torch.bfloat16))
        assert int(t.state[p]["step"]) == 3
    # A torch run of its own on a fresh bf16 model, then into renaissance.
    torch.manual_seed(12)
    tm = mlp().to(torch.bfloat16)
    topt = torch.optim.AdamW(tm.parameters(), lr=1e-2)
    x, y = digits("cpu", torch.bfloat16)
    for xb, yb in batches(2, x, y):
        backward(tm, xb, yb)
        topt.step()
    ours = rt.AdamW(tm.parameters(), lr=1e-2)
    ours.load_state_dict(topt.state_dict())
    for p in tm.parameters():
        st, ts = ours.state[p], topt.state[p]
        assert same_bits(st["exp_avg"], ts["exp_avg"].float()) and same_bits(st["exp_avg_sq"], ts["exp_avg_sq"].float())
        assert same_bits(st["master_weight"], p.detach().float()) and int(st["step"]) == 2


# ---- recorder -> replay ------------------------------------------------------------------------
def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def test_recorder_bf16_stochastic_replays(tmp_path):
    """A bf16 run with stochastic rounding over two param groups (a Task each), recorded and
    replayed by the core: the case carries precision, rounding and seed, BF16 gradients and the
    final copies; the replay MATCHes the fingerprint and the copies bit for bit."""
    torch.manual_seed(13)
    model = mlp().to(torch.bfloat16)
    ws = [p for n, p in model.named_parameters() if n.endswith("weight")]
    bs = [p for n, p in model.named_parameters() if n.endswith("bias")]
    opt = rt.AdamW([{"params": ws}, {"params": bs, "weight_decay": 0.0}], lr=1e-2, stochastic_rounding=True, seed=99)
    assert len(opt._shared()) == 2
    x, y = digits("cpu", torch.bfloat16)
    it = batches(5, x, y)
    xb, yb = next(it)
    backward(model, xb, yb)
    opt.step()  # the recording starts at step 1
    case = tmp_path / "bf16_sr"
    with rt.Recorder(opt, case, steps=4) as rec:
        for xb, yb in it:
            backward(model, xb, yb)
            opt.step()
    meta = json.loads((case / "case.json").read_text())
    assert (meta["precision"], meta["rounding"], meta["seed"]) == ("bf16", "stochastic", 99)
    assert st_header(case / "grads.safetensors")["step0/g0.0"]["dtype"] == "BF16"
    expected = st_header(case / "expected.safetensors")
    assert {k for k in expected if k.startswith("c/")} == {"c/g0.0", "c/g0.1", "c/g1.0", "c/g1.1"}
    assert expected["c/g0.0"]["dtype"] == "BF16" and expected["g0.0"]["dtype"] == "F32"
    result = renaissance.replay(str(case))
    assert result["passed"] is True and result["fingerprint"] == rec.fingerprint == opt.fingerprint()
    assert all(t["rel_l2"] == 0.0 for t in result["tensors"])
    # The copies are compared bit for bit: one flipped bit in an expected copy fails the replay.
    raw = bytearray((case / "expected.safetensors").read_bytes())
    raw[-1] ^= 0x01
    (case / "expected.safetensors").write_bytes(bytes(raw))
    assert renaissance.replay(str(case))["passed"] is False


def test_checkpoint_save_load_bf16(tmp_path):
    """opt.save/opt.load: the masters, state and copy come back; .data (the copy) follows."""
    model, opt, _ = trained_bf16()
    opt.save(str(tmp_path / "run.ckpt"))
    torch.manual_seed(14)
    model2 = mlp().to(torch.bfloat16)  # other values
    opt2 = rt.AdamW(model2.parameters(), lr=1e-2)
    opt2.load(str(tmp_path / "run.ckpt"))
    assert opt2.fingerprint() == opt.fingerprint()
    for p, q in zip(model.parameters(), model2.parameters()):
        assert same_bits(p, q) and same_bits(opt.state[p]["master_weight"], opt2.state[q]["master_weight"])


# ---- the core module's precision options --------------------------------------------------------
def rne_bf16(a):
    """float32 -> bf16 encodings, round to nearest even (finite values), written with numpy."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def test_core_task_precision_options():
    task = renaissance.Task([("w", (4, 33), "fc_weight"), ("b", (33,), "fc_bias")], precision="bf16",
                            model_dtype_gradients=True)
    task.optimizer("adamw", lr=1e-2)
    task.compile()
    assert (task.precision, task.rounding, task.seed, task.grad_dtype) == ("bf16", "nearest", 0, "bf16")
    rng = np.random.default_rng(0)
    task.set_weight("w", rng.standard_normal((4, 33)).astype(np.float32))
    task.set_grad("w", rng.standard_normal((4, 33)).astype(np.float32))  # rounded to bf16 in G
    g = task.get_grad_encoded("w")
    assert g.dtype == np.uint16 and np.array_equal(task.get_grad("w").view(np.uint32) >> 16, g.astype(np.uint32))
    task.step()
    assert np.array_equal(task.get_model_copy("w"), rne_bf16(task.get_weight("w")))
    assert task.view("C", 0).dtype == torch.bfloat16 and task.view("G", 1).dtype == torch.bfloat16
    assert task.view("W", 0).dtype == torch.float32
    with pytest.raises(ValueError, match="precision 'fp8'"):
        renaissance.Task([("w", (2,), "fc_bias")], precision="fp8")
    with pytest.raises(ValueError, match="rounding"):
        renaissance.Task([("w", (2,), "fc_bias")], rounding="up")
    t32 = renaissance.Task([("w", (2,), "fc_bias")], rounding="stochastic")
    with pytest.raises(ValueError, match="stochastic rounding needs a bf16 or fp16"):
        t32.optimizer("sgd", lr=0.1).compile()
    plain = renaissance.Task([("w", (2,), "fc_bias")])
    plain.optimizer("sgd", lr=0.1).compile()
    with pytest.raises(ValueError, match="no model copy"):
        plain.view("C", 0)


def test_precision_table_reaches_python(tmp_path):
    """_core.precisions() is precision.h's table, and renaissance.torch's dtypes, the Recorder's
    safetensors dtypes, the host copies and the views of every encoding follow it: each row's
    bytes per element, its bits as the host copy holds them."""
    from renaissance import recorder
    rows = renaissance._core.precisions()
    by_name = {r["name"]: r for r in rows}
    assert rows[0] == {"name": "fp32", "bytes": 4, "torch_dtype": "float32", "safetensors": "F32"}
    assert by_name["bf16"] == {"name": "bf16", "bytes": 2, "torch_dtype": "bfloat16", "safetensors": "BF16"}
    assert by_name["fp16"] == {"name": "fp16", "bytes": 2, "torch_dtype": "float16", "safetensors": "F16"}
    assert rt._PRECISION[torch.float32] == "fp32" and rt._PRECISION[torch.complex64] == "fp32"
    assert rt._PRECISION[torch.bfloat16] == "bf16" and rt._PRECISION[torch.float16] == "fp16"
    for r in rows:
        dtype = getattr(torch, r["torch_dtype"], None)
        assert rt._PRECISION.get(dtype) == r["name"] or not isinstance(dtype, torch.dtype)
        assert recorder._ST_DTYPE[r["name"]] == r["safetensors"]
    rng = np.random.default_rng(3)
    for r in rows[1:]:
        task = renaissance.Task([("w", (3, 5), "fc_weight")], precision=r["name"], model_dtype_gradients=True)
        task.optimizer("sgd", lr=0.1).compile()
        task.set_weight("w", rng.standard_normal((3, 5)).astype(np.float32))
        task.set_grad("w", rng.standard_normal((3, 5)).astype(np.float32))
        unsigned = np.dtype("uint%d" % (8 * r["bytes"]))
        c, g = task.get_model_copy("w"), task.get_grad_encoded("w")
        assert c.dtype == unsigned and g.dtype == unsigned and c.shape == (3, 5) and g.shape == (3, 5)
        assert c.any() and g.any()
        for family, host in (("C", c), ("G", g)):
            view = task.view(family, 0)
            assert view.element_size() == r["bytes"] and tuple(view.shape) == (3, 5)
            same_size = {1: torch.uint8, 2: torch.int16}[r["bytes"]]
            assert np.array_equal(view.view(same_size).numpy().view(unsigned), host), (r["name"], family)
        # The Recorder's files take the encodings under the row's dtype; an encoding without one is refused.
        renaissance._core._write_safetensors(str(tmp_path / (r["name"] + ".safetensors")), [("c", c)], {},
                                             {"c": r["safetensors"]})
        with pytest.raises(ValueError, match=r"'c' holds uint%d encodings: its dtype \(.*%s.*\) must be given"
                           % (8 * r["bytes"], r["safetensors"])):
            renaissance._core._write_safetensors(str(tmp_path / "x.safetensors"), [("c", c)], {})


@pytest.mark.parametrize("cls", [lambda p: rt.SGD(p, lr=0.1, momentum=0.9, nesterov=True), lambda p: rt.Adam(p),
                                 lambda p: rt.LARS(p, lr=0.5), lambda p: rt.Lion(p, lr=1e-3),
                                 lambda p: rt.LAMB(p, lr=1e-2), lambda p: rt.AdamW(p, max_grad_norm=0.5)],
                         ids=["sgd_nesterov", "adam", "lars", "lion", "lamb", "adamw_clip"])
def test_every_class_keeps_copy_equal_to_rounded_masters(cls):
    """Every kind with bf16 parameters (a zero-size one included): the parameters move, and with
    nearest rounding each copy is its master rounded to nearest even (numpy's rounding above)."""
    torch.manual_seed(15)
    ps = [torch.nn.Parameter(torch.randn(*s).to(torch.bfloat16)) for s in ((24, 10), (10,), (0, 3))]
    start = [bits(p).clone() for p in ps]
    opt = cls(ps)
    gen = torch.Generator().manual_seed(16)
    for _ in range(3):
        for p in ps:
            set_grad(p, torch.randn(p.shape, generator=gen).to(torch.bfloat16))
        opt.step()
    assert not torch.equal(start[0], bits(ps[0])) and not torch.equal(start[1], bits(ps[1]))
    for p in ps:
        master = opt.state[p]["master_weight"].numpy()
        assert np.array_equal(bits(p).numpy().view(np.uint16), rne_bf16(master))


def test_recorder_fp16_loss_scale_and_skip_replays(tmp_path):
    """fp16, nearest, under a loss scale with an overflowing (skipped) step: F16 gradients, the
    scales and the skip replay to the recorded fingerprint and copies."""
    torch.manual_seed(17)
    ps = [torch.nn.Parameter(torch.randn(9, 7).to(torch.float16)), torch.nn.Parameter(torch.randn(7).to(torch.float16))]
    opt = rt.Adam(ps, lr=1e-2, weight_decay=1e-3)
    gen = torch.Generator().manual_seed(18)
    case = tmp_path / "fp16_scaled"
    with rt.Recorder(opt, case, steps=4) as rec:
        for step, scale in enumerate((256.0, 256.0, 128.0, 128.0)):
            for p in ps:
                set_grad(p, (torch.randn(p.shape, generator=gen) * scale).to(torch.float16))
            if step == 1:
                ps[1].grad[2] = torch.tensor(1e6).to(torch.float16)  # inf
            opt.grad_scale = torch.tensor(scale)
            opt.step()
    assert opt._bindings[0].shared.task.skipped_steps == 1
    meta = json.loads((case / "case.json").read_text())
    assert meta["precision"] == "fp16" and meta["loss_scale_per_step"] == [256.0, 256.0, 128.0, 128.0]
    assert st_header(case / "grads.safetensors")["step1/g0.1"]["dtype"] == "F16"
    result = renaissance.replay(str(case))
    assert result["passed"] is True and result["fingerprint"] == rec.fingerprint
    assert (result["steps_applied"], result["steps_skipped"]) == (3, 1)
