"""renaissance.torch under the GradScaler protocol: a loss scale whose reciprocal is not finite
(0, NaN, a float32 underflow such as 1e-40) and a nonzero found_inf skip the step: weights, state
and step counts stay bit for bit, and the next step is the one a run without the bad step takes.
The protocol is driven directly (torch 2.x: opt.grad_scale / opt.found_inf; torch 1.x:
grad_scaler=), so these run on the CPU; torch's own GradScaler only where CUDA is there."""
import math

import pytest
import torch

import renaissance.torch as rt


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in ((5, 6), (5,), (3, 5))]


def _feed(ps, step, scale=1.0):
    g = torch.Generator().manual_seed(70 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g) * scale


def _bits(t):
    return t.detach().contiguous().view(torch.int32).clone()


def _frozen(opt, ps):
    sd = opt.state_dict()["state"]
    return ([_bits(p) for p in ps], [{k: _bits(v) if v.dtype == torch.float32 and v.dim() else float(v)
                                      for k, v in s.items()} for _, s in sorted(sd.items())], opt.fingerprint())


def _unchanged(a, b):
    (wa, sa, fa), (wb, sb, fb) = a, b
    return fa == fb and all(torch.equal(x, y) for x, y in zip(wa, wb)) and all(
        sorted(x) == sorted(y) and all((torch.equal(x[k], y[k]) if isinstance(x[k], torch.Tensor) else x[k] == y[k])
                                       for k in x) for x, y in zip(sa, sb))


class _Torch1Scaler:
    """What renaissance.torch reads of a torch 1.x GradScaler that passes itself as grad_scaler=:
    the stage, the inf check (which fills found_inf_per_device), the scale."""

    def __init__(self, opt, scale, found):
        from torch.cuda.amp.grad_scaler import OptState
        self.found = found
        self._per_optimizer_states = {id(opt): {"stage": OptState.READY, "found_inf_per_device": {}}}
        self._opt = opt
        self.scale = torch.tensor(scale)

    def _check_inf_per_device(self, opt):
        found = {torch.device("cpu"): torch.tensor(self.found)}
        self._per_optimizer_states[id(opt)]["found_inf_per_device"] = found
        return found

    def _get_scale_async(self):
        return self.scale


@pytest.mark.parametrize("cls,kw", [(rt.AdamW, dict(lr=1e-2, weight_decay=0.1)),
                                    (rt.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.1))])
@pytest.mark.parametrize("how", ["scale=0", "scale=nan", "scale=1e-40", "found_inf", "torch1 scale=0",
                                 "torch1 found_inf"])
def test_bad_scale_or_found_inf_skips_the_step(cls, kw, how):
    ps, qs = _params(), _params()
    a, b = cls(ps, **kw), cls(qs, **kw)
    for s in range(2):
        _feed(ps, s, 512.0)
        a.grad_scale, a.found_inf = torch.tensor(512.0), torch.tensor(0.0)
        a.step()
        _feed(qs, s)
        b.step()
    before = _frozen(a, ps)
    skipped = [b_.shared.task.skipped_steps for b_ in a._bindings]
    _feed(ps, 2, 512.0)
    scale = {"scale=0": 0.0, "scale=nan": math.nan, "scale=1e-40": 1e-40}.get(how.split()[-1], 512.0)
    if how.startswith("torch1"):
        del a.grad_scale, a.found_inf
        a.step(grad_scaler=_Torch1Scaler(a, scale, 1.0 if how.endswith("found_inf") else 0.0))
    else:
        a.grad_scale = torch.tensor(scale)
        a.found_inf = torch.tensor(1.0 if how == "found_inf" else 0.0)
        a.step()
    assert _unchanged(_frozen(a, ps), before), how
    assert [b_.shared.task.skipped_steps for b_ in a._bindings] == [n + 1 for n in skipped], how
    if hasattr(a, "grad_scale"):
        del a.grad_scale, a.found_inf
    for s in range(3, 5):  # the run goes on as one that never had the bad step
        _feed(ps, s)
        a.step()
        _feed(qs, s)
        b.step()
    assert a.fingerprint() == b.fingerprint()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.cuda.amp.GradScaler needs CUDA on torch 1.13")
def test_torch_grad_scaler_found_inf_skips_cuda():
    import renaissance
    if not renaissance._core.with_cuda:
        pytest.skip("this renaissance build has no CUDA backend")
    ps = [torch.nn.Parameter(p.detach().cuda()) for p in _params()]
    opt = rt.AdamW(ps, lr=1e-2)
    scaler = torch.cuda.amp.GradScaler(init_scale=1024.0)
    for p in ps:
        p.grad = torch.ones_like(p) * 1024.0
    ps[0].grad[0, 0] = float("inf")
    before = [p.detach().clone() for p in ps]
    scaler.scale(torch.ones((), device="cuda"))  # torch 2.x refuses step() before any scale()
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(p, q) for p, q in zip(ps, before))
    assert scaler.get_scale() < 1024.0
    assert opt._bindings[0].shared.task.skipped_steps == 1


def test_a_skipped_step_is_left_out_of_a_recording(tmp_path):
    """The Recorder leaves a step the protocol skipped out of the case (a scale of 0 is not one a
    replay can run): the case replays to the recorded fingerprint."""
    import renaissance
    ps = _params()
    opt = rt.AdamW(ps, lr=1e-2)
    case = str(tmp_path / "case")
    with rt.Recorder(opt, case, steps=3) as rec:
        for s, scale in enumerate([512.0, 0.0, 512.0, 512.0]):
            _feed(ps, s, 512.0)
            opt.grad_scale, opt.found_inf = torch.tensor(scale), torch.tensor(0.0)
            opt.step()
    assert rec.finished and rec.fingerprint == opt.fingerprint()
    out = renaissance.replay(case)
    assert out["fingerprint"] == rec.fingerprint and out["steps_applied"] == 3, out
