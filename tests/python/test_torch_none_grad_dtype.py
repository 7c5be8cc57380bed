"""renaissance.torch with `.grad is None` on bf16/fp16 parameters (with
model-dtype gradients): the Task runs with the core's per-tensor mask, so a parameter without a
gradient keeps its copy, master and state bits and its own `step`, and each parameter ends, bit
for bit, where an optimizer holding it alone that steps only when it has a gradient ends (its
bias corrections use its own count). The Recorder then records those None gradients and the
replay reproduces the fingerprint and counts. CPU (CUDA where there is a device), seconds."""
import os
import warnings

import numpy as np
import pytest
import torch

import renaissance
import renaissance.torch as rt
from renaissance.recorder import Recorder

SHAPES = [(6, 5), (6,), (3, 2, 2, 2), (4, 4)]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
STEPS = 6


def has_grad(j, step):
    """Every parameter skipped at some steps and stepped at others; step 2 gives parameter 0 only."""
    return j == 0 if step == 2 else (j * 2 + step) % 3 != 0


def params(device, dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(device=device, dtype=dtype)) for s in SHAPES]


def grad(j, step, device, dtype):
    g = torch.Generator().manual_seed(1000 * step + j)
    return torch.randn(*SHAPES[j], generator=g).to(device=device, dtype=dtype)


def bits(t):
    return t.detach().cpu().contiguous().view(torch.int16).numpy().copy()


def bits32(t):
    return t.detach().cpu().contiguous().numpy().view(np.uint32).copy()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_none_gradients_keep_per_parameter_steps_in_the_model_dtype(device, dtype):
    ps = params(device, dtype)
    opt = rt.AdamW(ps, lr=1e-2, weight_decay=0.1)
    assert opt._shared()[0].task.tensor_steps is not None
    alone = [(p, rt.AdamW([p], lr=1e-2, weight_decay=0.1)) for p in params(device, dtype)]
    for s in range(STEPS):
        held = {}
        for j, p in enumerate(ps):
            p.grad = grad(j, s, device, dtype) if has_grad(j, s) else None
            if p.grad is None and opt.state.get(p):
                held[j] = [bits(p)] + [bits32(opt.state[p][k]) for k in ("master_weight", "exp_avg", "exp_avg_sq")]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # renaissance: "a foreign .grad is copied in"
            opt.step()
        for j, before in held.items():  # a None gradient leaves every bit of the parameter alone
            now = [bits(ps[j])] + [bits32(opt.state[ps[j]][k]) for k in ("master_weight", "exp_avg", "exp_avg_sq")]
            assert all(np.array_equal(a, b) for a, b in zip(before, now)), (j, s)
    for j, (p, o) in enumerate(alone):
        for s in range(STEPS):
            if has_grad(j, s):
                p.grad = grad(j, s, device, dtype)
                o.step()
    steps = [sum(has_grad(j, s) for s in range(STEPS)) for j in range(len(SHAPES))]
    assert len(set(steps)) > 1
    sd = opt.state_dict()["state"]
    for j, (p, o) in enumerate(alone):
        st = o.state_dict()["state"][0]
        assert int(sd[j]["step"]) == int(st["step"]) == steps[j]
        assert np.array_equal(bits(ps[j]), bits(p)), j
        for k in ("master_weight", "exp_avg", "exp_avg_sq"):
            assert np.array_equal(bits32(sd[j][k]), bits32(st[k])), (j, k)
    assert opt._bindings[0].task.step_count == STEPS  # every step had some gradient


def test_recorder_records_bf16_none_gradients_and_the_replay_matches(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(torch.bfloat16)
    opt = rt.AdamW(model.parameters(), lr=1e-2, threads=1)
    x, y = torch.randn(32, 12).to(torch.bfloat16), torch.randint(0, 4, (32,))
    case = str(tmp_path / "bf16_frozen")
    with Recorder(opt, case, steps=4) as rec:
        for t in range(4):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x).float(), y).backward()
            if t % 2 == 1:  # the hidden layer is frozen on odd steps
                for p in model[0].parameters():
                    p.grad = None
            opt.step()
    assert os.path.exists(os.path.join(case, "case.json"))
    r = renaissance.replay(case)
    assert r["fingerprint"] == rec.fingerprint == opt.fingerprint()
    assert r["tensor_step_mismatches"] == []
    assert sorted(r["tensor_steps"].values()) == [2, 2, 4, 4]
