# renaissance.torch.Recorder with None gradients: a run whose hidden layer has no
# gradient on alternate steps (and, once, no parameter at all) records no_grad_per_step and the
# per-tensor step counts, and renaissance.replay reproduces the recorded fingerprint and counts bit
# for bit (AdamW and LAMB, and AdamW with max_grad_norm: the clip norm leaves the masked
# parameters out); the case holds no gradient for a masked parameter. CPU only, seconds.
import json
import os
import struct

import numpy as np
import pytest
import torch

import renaissance
import renaissance.torch as rt
from renaissance.recorder import Recorder


def case_json(case):
    with open(os.path.join(case, "case.json")) as f:
        return json.load(f)


def tensor_names(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return set(header)


def frozen_run(cls=None, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = (cls or rt.AdamW)([{"params": model[0].parameters()},
                    {"params": model[2].parameters(), "lr": 1e-2, "weight_decay": 0.0}], lr=1e-3, threads=1, **kw)
    x, y = torch.randn(32, 12), torch.randint(0, 4, (32,))
    counter = [0]

    def train(steps, none_at=()):
        for _ in range(steps):
            t = counter[0]
            counter[0] += 1
            opt.zero_grad()
            if t in none_at:  # no backward at all: every .grad None, the optimizer takes no step
                for p in model.parameters():
                    p.grad = None
                opt.step()
                continue
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if t % 2 == 1:  # the hidden layer is frozen on odd steps
                for p in model[0].parameters():
                    p.grad = None
            opt.step()
    return model, opt, train


def test_none_gradients_on_alternate_steps_replay_bit_for_bit(tmp_path):
    model, opt, train = frozen_run()
    train(3)  # steps 0-2: the hidden layer missed step 1, so its own count is 2 of the Task's 3
    case = str(tmp_path / "frozen")
    with Recorder(opt, case, steps=5) as rec:
        train(5, none_at=(6,))  # recorded steps 3-7; step 6 has no gradient anywhere
    c = case_json(case)
    hidden = ["g0.0", "g0.1"]
    # Recorded steps 3..7: the hidden layer is None at 3, 5, 7 and everything at 6.
    expected_no_grad = [hidden, [], hidden, ["g0.0", "g0.1", "g1.0", "g1.1"], hidden]
    assert c["no_grad_per_step"] == expected_no_grad
    assert [g.get("initial_step") for g in c["groups"]] == [3, 3]
    assert c["groups"][0]["initial_tensor_steps"] == [2, 2]
    assert "initial_tensor_steps" not in c["groups"][1]  # equal to its initial_step
    # The Task stepped at 3, 4, 5, 7 (not at 6); the hidden layer only at 4.
    assert c["groups"][0]["expected_tensor_steps"] == [3, 3]
    assert c["groups"][1]["expected_tensor_steps"] == [7, 7]
    names = tensor_names(os.path.join(case, "grads.safetensors"))
    assert "step0/g0.0" not in names and "step0/g1.0" in names and "step1/g0.0" in names
    assert not any(n.startswith("step3/") for n in names)
    assert rec.fingerprint == opt.fingerprint()
    for threads in (1, 2):
        r = renaissance.replay(case, threads=threads)
        assert r["fingerprint"] == rec.fingerprint
        assert r["tensor_step_mismatches"] == []
        assert r["tensor_steps"] == {"g0.0": 3, "g0.1": 3, "g1.0": 7, "g1.1": 7}


def test_lamb_with_none_gradients_replays(tmp_path):
    """LAMB Tasks are masked too (per-tensor trust ratios and counts)."""
    model, opt, train = frozen_run(rt.LAMB)
    train(2)
    case = str(tmp_path / "lamb")
    with Recorder(opt, case, steps=3) as rec:
        train(3)  # steps 2, 3 (hidden layer None), 4
    c = case_json(case)
    assert c["groups"][0]["optimizer"]["kind"] == "lamb"
    assert c["no_grad_per_step"] == [[], ["g0.0", "g0.1"], []]
    r = renaissance.replay(case)
    assert r["fingerprint"] == rec.fingerprint == opt.fingerprint()
    assert r["tensor_step_mismatches"] == [] and r["tensor_steps"]["g0.0"] == 3 and r["tensor_steps"]["g1.0"] == 5


def test_a_wrong_mask_in_the_case_fails_the_replay(tmp_path):
    """The mask matters: the same gradients with a step's mask dropped (its gradients then zero,
    which AdamW's weight decay and moments still act on) end elsewhere."""
    model, opt, train = frozen_run()
    train(1)
    case = str(tmp_path / "frozen")
    with Recorder(opt, case, steps=2) as rec:
        train(2)  # steps 1 (hidden layer None) and 2
    c = case_json(case)
    assert c["no_grad_per_step"] == [["g0.0", "g0.1"], []]
    assert renaissance.replay(case)["fingerprint"] == rec.fingerprint
    # Give the frozen tensors zero gradients instead of the mask.
    names = sorted(tensor_names(os.path.join(case, "grads.safetensors")))
    grads = []
    with open(os.path.join(case, "grads.safetensors"), "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    for name in names:
        info = header[name]
        a = np.frombuffer(data[info["data_offsets"][0]:info["data_offsets"][1]], "<f4").reshape(info["shape"]).copy()
        grads.append((name, a))
    for name in ("g0.0", "g0.1"):
        shape = next(p["shape"] for p in c["groups"][0]["params"] if p["name"] == name)
        grads.append((f"step0/{name}", np.zeros(shape, np.float32)))
    renaissance._core._write_safetensors(os.path.join(case, "grads.safetensors"), grads, {})
    c["no_grad_per_step"] = [[], []]
    with open(os.path.join(case, "case.json"), "w") as f:
        json.dump(c, f)
    r = renaissance.replay(case)
    assert r["fingerprint"] != rec.fingerprint
    assert r["tensor_step_mismatches"] == ["g0.0: expected 2, got 3", "g0.1: expected 2, got 3"]


def test_clipping_with_none_gradients_replays_bit_for_bit(tmp_path):
    """Clipping Tasks carry the per-tensor mask: the case records no_grad_per_step and the
    replay (one norm over the Task's unmasked gradients, both groups) gives the same bits."""
    model, opt, train = frozen_run(max_grad_norm=0.05)
    assert all(s.task.tensor_steps is not None for s in opt._shared())
    train(1)  # step 0: every gradient there
    case = str(tmp_path / "clip")
    with Recorder(opt, case, steps=4) as rec:
        train(4)  # steps 1-4: the hidden layer None at 1 and 3
    c = case_json(case)
    assert [g["optimizer"]["max_grad_norm"] for g in c["groups"]] == [0.05, 0.05]
    assert c["no_grad_per_step"] == [["g0.0", "g0.1"], [], ["g0.0", "g0.1"], []]
    assert c["groups"][0]["expected_tensor_steps"] == [3, 3]
    for threads in (1, 2):
        r = renaissance.replay(case, threads=threads)
        assert r["fingerprint"] == rec.fingerprint == opt.fingerprint()
        assert r["tensor_step_mismatches"] == []
        assert r["tensor_steps"] == {"g0.0": 3, "g0.1": 3, "g1.0": 5, "g1.1": 5}
