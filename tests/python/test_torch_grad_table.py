"""renaissance.torch reads autograd's gradient tensors in place: after torch 2.x's
default zero_grad() (set_to_none=True) the step follows each `.grad` through the Task's gradient
table, with no copy into G and no zeroing. References, never the table path itself: the same
run with set_to_none=False (backward accumulates into the arena views) and the same run forced
through the copy-in path (SharedTask.readable patched to refuse every tensor), both bit for bit.
A `.grad` that cannot be read in place (not contiguous) still goes through the copy. CUDA
variants skip without a device (scripts/gpu.sh python runs them on the GPU machine)."""
import warnings

import numpy as np
import pytest

import torch

import renaissance._torch_group as tg
import renaissance.torch as rt

SHAPES = [(6, 5), (6,), (3, 2, 2, 2), (3,), (7, 9), (1,)]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
STEPS = 4
MAKERS = {
    "adamw": lambda p: rt.AdamW(p, lr=1e-2, weight_decay=0.1),
    "sgd": lambda p: rt.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "lars": lambda p: rt.LARS(p, weight_decay=1e-3),
    "lamb": lambda p: rt.LAMB(p),
    "lion": lambda p: rt.Lion(p, weight_decay=0.1),
    "adamw_clip": lambda p: rt.AdamW(p, lr=1e-2, max_grad_norm=0.5),
}


def params(device, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(device=device, dtype=dtype)) for s in SHAPES]


def coefficients(step, device, dtype):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*s, generator=g).to(device=device, dtype=dtype) for s in SHAPES]


def backward(ps, step):
    """A real backward: each parameter's gradient is a product autograd allocates (or adds into
    an existing .grad)."""
    cs = coefficients(step, ps[0].device, ps[0].dtype)
    sum(((p * c * p).sum() for p, c in zip(ps, cs))).backward()


def bits(t):
    t = t.detach().cpu().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().copy()


def state_bits(opt, ps):
    out = [bits(p) for p in ps]
    for p in ps:
        out += [bits(v) for k, v in sorted(opt.state[p].items()) if torch.is_tensor(v) and v.dim() > 0]
    return out


def run(make, device, set_to_none, dtype=torch.float32, force_copy=False, monkeypatch=None):
    ps = params(device, dtype)
    opt = make(ps)
    if force_copy:
        monkeypatch.setattr(tg.SharedTask, "readable", lambda self, j, g: False)
    for s in range(STEPS):
        opt.zero_grad(set_to_none=set_to_none)
        backward(ps, s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if force_copy else "error")  # the table path never warns
            opt.step()
    if force_copy:
        monkeypatch.undo()
    return opt, ps, state_bits(opt, ps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(MAKERS))
def test_default_zero_grad_reads_in_place_with_the_bits_of_the_other_paths(name, device, monkeypatch):
    opt, ps, table = run(MAKERS[name], device, set_to_none=True)
    shared = opt._bindings[0].shared
    assert shared.use_table and shared.in_place_steps == STEPS
    for j, p in enumerate(ps):  # .grad is still autograd's tensor, not the arena view
        assert p.grad.data_ptr() != shared.G[j].data_ptr()
    _, _, in_arena = run(MAKERS[name], device, set_to_none=False)
    _, _, copied = run(MAKERS[name], device, set_to_none=True, force_copy=True, monkeypatch=monkeypatch)
    assert all(np.array_equal(a, b) for a, b in zip(table, in_arena))
    assert all(np.array_equal(a, b) for a, b in zip(table, copied))
    assert opt.fingerprint() == run(MAKERS[name], device, set_to_none=False)[0].fingerprint()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_model_dtype_gradients_are_read_in_place(dtype, device, monkeypatch):
    make = MAKERS["adamw"]
    opt, _, table = run(make, device, set_to_none=True, dtype=dtype)
    assert opt._bindings[0].shared.in_place_steps == STEPS
    _, _, copied = run(make, device, set_to_none=True, dtype=dtype, force_copy=True, monkeypatch=monkeypatch)
    _, _, in_arena = run(make, device, set_to_none=False, dtype=dtype)
    assert all(np.array_equal(a, b) for a, b in zip(table, copied))
    assert all(np.array_equal(a, b) for a, b in zip(table, in_arena))


@pytest.mark.parametrize("device", DEVICES)
def test_step_does_no_copy(device, monkeypatch):
    ps = params(device)
    opt = MAKERS["adamw"](ps)

    def refuse(*args, **kwargs):
        raise AssertionError("step() copied a gradient")
    monkeypatch.setattr(tg.SharedTask, "copy_in", refuse)
    if hasattr(torch, "_foreach_copy_"):
        monkeypatch.setattr(torch, "_foreach_copy_", refuse)
    before = opt.fingerprint()
    for s in range(STEPS):
        opt.zero_grad()  # torch's default: set_to_none=True
        backward(ps, s)
        opt.step()
    assert opt.fingerprint() != before


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_sources_in_one_step(device, monkeypatch):
    """One step with every kind of .grad: autograd's (in place), the arena view, None (masked), a
    strided tensor (copied in, with the warning) - the bits of the all-copy run, which gives each
    parameter the same values; pointers move from step to step."""
    def feed(ps, s):
        cs = coefficients(s, device, torch.float32)
        for j, (p, c) in enumerate(zip(ps, cs)):
            kind = (j + s) % 4
            if kind == 0:
                p.grad = c.clone()  # a fresh tensor every step
            elif kind == 1:
                p.grad = None
            elif kind == 2 and c.dim() > 0 and c.numel() > 1:
                wide = torch.stack([c, torch.full_like(c, float("nan"))], dim=-1)
                p.grad = wide.reshape(*c.shape[:-1], 2 * c.shape[-1])[..., ::2]  # strided
            else:
                p.grad = c.clone()

    results = []
    for force in (False, True):
        ps = params(device)
        opt = MAKERS["adamw_clip"](ps)
        if force:
            monkeypatch.setattr(tg.SharedTask, "readable", lambda self, j, g: False)
        for s in range(STEPS):
            feed(ps, s)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                opt.step()
        monkeypatch.undo()
        results.append((opt.fingerprint(), state_bits(opt, ps)))
    assert results[0][0] == results[1][0]
    assert all(np.array_equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_non_contiguous_grad_is_copied_in_and_repointed():
    ps = params("cpu")
    opt = MAKERS["adamw"](ps)
    shared = opt._bindings[0].shared
    g = torch.ones(6, 10)[:, ::2]  # (6, 5), strided
    assert not g.is_contiguous()
    ps[0].grad = g
    for j in range(1, len(ps)):
        ps[j].grad = torch.ones(SHAPES[j])
    tg._GRAD_COPY_WARNED[0] = False
    with pytest.warns(UserWarning, match="copied in"):
        opt.step()
    assert ps[0].grad.data_ptr() == shared.G[0].data_ptr()  # copied in, re-pointed
    assert all(ps[j].grad.data_ptr() != shared.G[j].data_ptr() for j in range(1, len(ps)))  # read in place


def test_zero_grad_false_after_in_place_steps_zeroes_every_grad():
    """torch semantics: after zero_grad(set_to_none=False) every .grad is zero; here .grad is
    re-pointed to its zeroed arena view (autograd's tensor from the last backward is dropped)."""
    ps = params("cpu")
    opt = MAKERS["sgd"](ps)
    opt.zero_grad()
    backward(ps, 0)
    opt.step()
    opt.zero_grad(set_to_none=False)
    shared = opt._bindings[0].shared
    for j, p in enumerate(ps):
        assert p.grad is shared.G[j] and not p.grad.any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name,dtype", [("adamw", torch.float32), ("lamb", torch.float32), ("lars", torch.float32),
                                        ("adamw_clip", torch.float32), ("adamw", torch.bfloat16),
                                        ("adamw", torch.float16)])
def test_cpu_equals_cuda_through_the_table(name, dtype):
    """The same gradient values handed over as fresh tensors (read in place on both devices): the
    CPU and CUDA Tasks end with the same fingerprint and bits. The gradients are made on the CPU
    and moved, so both devices see the same values (a CUDA backward's are not the CPU's bits)."""
    runs = []
    for device in ("cpu", "cuda"):
        ps = params(device, dtype)
        opt = MAKERS[name](ps)
        for s in range(STEPS):
            opt.zero_grad()
            for p, c in zip(ps, coefficients(s, "cpu", dtype)):
                p.grad = (c * 3.0).to(device)  # a fresh tensor per step, on the parameter's device
            opt.step()
        assert opt._bindings[0].shared.in_place_steps == STEPS
        runs.append((opt.fingerprint(), state_bits(opt, ps)))
    assert runs[0][0] == runs[1][0]
    assert all(np.array_equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
