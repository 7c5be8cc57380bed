"""renaissance.torch on a CUDA device (skipped without one; scripts/gpu.sh python runs it on the GPU
machine): CPU and CUDA fingerprints agree bit for bit, GradScaler drives the fused unscale and its
inf verdict skips the step, and the step is ordered on torch's current stream (a forward queued
right after step() on a non-blocking stream sees the new weights, with no synchronisation).
Also runnable without pytest: `python3 tests/python/test_torch_cuda.py`."""
import sys

try:
    import pytest
except ImportError:  # the GPU machine may lack pytest: __main__ below runs the tests
    pytest = None
import torch

import renaissance
import renaissance.torch as rt

HAVE_CUDA = torch.cuda.is_available() and renaissance.with_cuda
if pytest is not None:
    pytestmark = pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA device and a CUDA build of renaissance")

SHAPES = [(64, 33), (64,), (16, 8, 3, 3), (16,), (10, 400), (10,)]


def params(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(device)) for s in SHAPES]


def grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*s, generator=g) for s in SHAPES]


MAKERS = {
    "adamw": lambda p: rt.AdamW(p, lr=1e-2, weight_decay=0.05),
    "adam": lambda p: rt.Adam(p, lr=1e-2, weight_decay=0.05),
    "sgd_nesterov": lambda p: rt.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "sgd_decoupled_clip": lambda p: rt.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-3,
                                           decoupled_weight_decay=True, max_grad_norm=1.0),
    "lars": lambda p: rt.LARS(p, lr=0.1, weight_decay=1e-3, trust_coefficient=0.02),
    "lamb": lambda p: rt.LAMB(p, lr=1e-2),
    "lion": lambda p: rt.Lion(p, lr=1e-3, weight_decay=0.1),
    "groups": lambda p: rt.AdamW([{"params": p[:3]}, {"params": p[3:], "lr": 3e-3, "weight_decay": 0.0}], lr=1e-2),
}


def fingerprint_on(device, make, steps=6):
    ps = params(device)
    opt = make(ps)
    views = [w for b in opt._bindings for w in b.W]
    assert all(p.device.type == device and p.data_ptr() == w.data_ptr() for p, w in zip(ps, views))
    for s in range(steps):
        for j, (p, g) in enumerate(zip(ps, grads(s))):
            if s == 3 and j == 1:
                p.grad = None  # a None gradient on the way
            elif p.grad is None:
                p.grad = g.to(device)
            else:
                p.grad.copy_(g)
        opt.step()
    return opt.fingerprint()


def test_cpu_and_cuda_fingerprints_agree():
    bad = []
    for name, make in MAKERS.items():
        cpu, cuda = fingerprint_on("cpu", make), fingerprint_on("cuda", make)
        print("%-20s cpu %s cuda %s" % (name, cpu, cuda))
        if cpu != cuda:
            bad.append(name)
    assert not bad, "CPU and CUDA differ for %s" % bad


def make_scaler(scale):
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", init_scale=scale, growth_interval=1000)
    return torch.cuda.amp.GradScaler(init_scale=scale, growth_interval=1000)


def amp_run(use_scaler, inject_at=None, unscale_first=False, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).cuda()
    opt = rt.AdamW(model.parameters(), lr=1e-2)
    scaler = make_scaler(2.0 ** 12) if use_scaler else None
    x = torch.randn(64, 20, generator=torch.Generator().manual_seed(1)).cuda()
    y = torch.randint(0, 4, (64,), generator=torch.Generator().manual_seed(2)).cuda()
    scales, skipped_at = [], []
    for s in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x * (1.0 + 0.1 * s)), y)
        (scaler.scale(loss) if scaler else loss).backward()
        if s == inject_at:
            next(model.parameters()).grad[0, 0] = float("inf")
        before = opt._bindings[0].task.skipped_steps
        if scaler:
            if unscale_first:
                scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        else:
            opt.step()
        if opt._bindings[0].task.skipped_steps != before:
            skipped_at.append(s)
    return opt.fingerprint(), scales, skipped_at


def test_grad_scaler_scale_and_injected_inf():
    plain, _, _ = amp_run(False)
    scaled, scales, skipped = amp_run(True)
    # a power-of-two scale unscales exactly: the scaled run has the plain run's bits
    assert scaled == plain and skipped == [] and scales == [2.0 ** 12] * 5
    unscaled, _, _ = amp_run(True, unscale_first=True)
    assert unscaled == plain
    # an inf at step 2: we skip exactly that step and the scaler backs off exactly once
    _, scales, skipped = amp_run(True, inject_at=2)
    assert skipped == [2], skipped
    assert scales == [2.0 ** 12, 2.0 ** 12, 2.0 ** 11, 2.0 ** 11, 2.0 ** 11], scales
    _, scales, skipped = amp_run(True, inject_at=2, unscale_first=True)
    assert skipped == [2] and scales[2] == 2.0 ** 11


def test_step_is_ordered_on_torch_current_stream():
    """Gradients written and a forward queued on a non-blocking torch stream, no sync in between:
    the step must see the new gradients and the forward the new weights."""
    n = 1 << 24  # 64 MB per tensor: the step takes long enough for a missing dependency to show
    w = torch.nn.Parameter(torch.full((n,), 1.0, device="cuda"))
    w.grad = torch.zeros_like(w)  # a parameter with a .grad: construction points it at the arena's G
    opt = rt.SGD([w], lr=0.5)
    stream = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        for k in range(3):
            # ~tens of ms of spinning first: without the event the step would start on its own
            # stream before the fill, and the sum before the step.
            torch.cuda._sleep(100_000_000)
            w.grad.fill_(float(k + 1))  # on `stream`
            opt.step()  # must run after the fill, before the sum
            total = w.sum()  # queued right after step() on the same stream
            value = total.item()  # host sync only here, after all three were queued
            expect = float(n) * (1.0 - 0.5 * sum(range(1, k + 2)))
            assert value == expect, (k, value, expect)


def test_step_is_placed_as_torch_places_it():
    """torch's test_state_dict_with_cuda_params: a CPU optimizer's state dict loaded into one over
    CUDA copies of the parameters; `step` is on the parameter's device when the loaded groups have
    fused (or capturable) set, else on the CPU, float32 either way; then both step alike."""
    import copy
    for cls, flags in ((rt.SGD, {}), (rt.SGD, {"fused": True}), (rt.Adam, {}), (rt.Adam, {"fused": True}),
                       (rt.AdamW, {"capturable": True}), (rt.AdamW, {"fused": True, "weight_decay": 0.1})):
        kwargs = dict(flags, momentum=0.9) if cls is rt.SGD else dict(flags)
        g = torch.Generator().manual_seed(5)
        params = [torch.nn.Parameter(torch.randn(2, 3, generator=g)) for _ in range(2)]
        for p in params:
            p.grad = torch.randn(2, 3, generator=g)
        opt = cls(params, **kwargs)
        for _ in range(3):
            opt.step()
        with torch.no_grad():
            params_cuda = [p.to(device="cuda") for p in params]
            for i, p in enumerate(params_cuda):
                p.grad = params[i].grad.to(device="cuda")
        opt_cuda = cls(params_cuda, **kwargs)
        opt_cuda.load_state_dict(copy.deepcopy(opt.state_dict()))
        on_device = bool(flags.get("fused") or flags.get("capturable"))
        for st in opt.state_dict()["state"].values():
            assert st["step"].device.type == "cpu" and st["step"].dtype == torch.float32
        for st in opt_cuda.state_dict()["state"].values():
            assert st["step"].device.type == ("cuda" if on_device else "cpu"), (cls.__name__, flags)
            assert st["step"].dtype == torch.float32 and float(st["step"]) == 3.0
        for _ in range(5):
            opt.step()
            opt_cuda.step()
            assert all(torch.equal(p.detach(), q.detach().cpu()) for p, q in zip(params, params_cuda)), \
                (cls.__name__, flags)


if __name__ == "__main__":
    if not HAVE_CUDA:
        print("SKIP: no CUDA device or no CUDA build")
        sys.exit(0)
    failed = 0
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_")]
    for t in tests:
        try:
            t()
            print("PASS", t.__name__)
        except Exception as e:  # report every test, then fail
            failed += 1
            print("FAIL", t.__name__, repr(e))
    print("%d passed, %d failed" % (len(tests) - failed, failed))
    sys.exit(1 if failed else 0)
