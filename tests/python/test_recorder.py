# renaissance.torch.Recorder (python/renaissance/recorder.py): a recording of a two-group AdamW
# run replays (renaissance.replay, the code of `renaissance replay`) to the recorded fingerprint
# bit for bit, and that fingerprint is the state of an identical run that was never recorded; the
# initial state, per-group lr schedules and a loss scale are carried; a tampered gradient changes
# the replay's fingerprint; the case directory is written atomically and never over a non-empty
# one unless asked; renaissance.torch groups that clip over one shared Task replay bit for
# bit. The optimizer is mostly recorder_standin.StandinAdamW (the Recorder's contract on
# renaissance.Task); CPU only, a few seconds.
import json
import os
import pathlib
import struct
import types

import numpy as np
import pytest
import torch

import renaissance
from renaissance.recorder import Recorder, combine_fingerprints
from recorder_standin import StandinAdamW

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECORDED = ROOT / "testdata" / "recorded"


def setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = StandinAdamW([{"params": model[0].parameters()},
                        {"params": model[2].parameters(), "lr": 1e-2, "weight_decay": 0.0}], lr=1e-3)
    x = torch.randn(32, 12)
    y = torch.randint(0, 4, (32,))
    return model, opt, x, y


def train(model, opt, x, y, steps, scale=1.0, sched=None):
    for _ in range(steps):
        opt.zero_grad()
        (torch.nn.functional.cross_entropy(model(x), y) * scale).backward()
        opt.step()
        if sched is not None:
            sched.step()


def case_json(case):
    with open(os.path.join(case, "case.json")) as f:
        return json.load(f)


def test_a_recording_replays_to_the_recorded_fingerprint(tmp_path):
    model, opt, x, y = setup()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    train(model, opt, x, y, 3, sched=sched)  # a state with M, V and a step count to start from
    case = str(tmp_path / "case")
    before = vars(opt)["step"]  # torch's schedulers wrap opt.step themselves
    with Recorder(opt, case, steps=5) as rec:
        assert vars(opt)["step"] is not before
        train(model, opt, x, y, 7, sched=sched)  # it stops by itself after 5
        assert rec.finished
    assert vars(opt)["step"] is before  # restored
    c = case_json(case)
    assert c["format"] == "renaissance-replay/2" and c["steps"] == 5 and len(c["groups"]) == 2
    assert [g.get("initial_step") for g in c["groups"]] == [3, 3]
    assert c["groups"][0]["lr_per_step"] == [5e-4, 2.5e-4, 2.5e-4, 1.25e-4, 1.25e-4]
    assert c["groups"][1]["lr_per_step"] == [5e-3, 2.5e-3, 2.5e-3, 1.25e-3, 1.25e-3]
    assert c["expected_fingerprint"] == rec.fingerprint

    # The recorded value is the state after 3 + 5 steps: an identical run that was never recorded.
    model2, opt2, x2, y2 = setup()
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    train(model2, opt2, x2, y2, 8, sched=sched2)
    assert opt2.fingerprint() == rec.fingerprint
    assert opt.fingerprint() != rec.fingerprint  # the two steps after the recording moved on

    for threads in (1, 2):
        r = renaissance.replay(case, threads=threads)
        assert r["fingerprint"] == rec.fingerprint
        assert r["steps"] == 5 and r["steps_applied"] == 10  # 5 steps x 2 groups


def read_safetensors(path):
    """{name: float32 array} of a safetensors file (F32 tensors only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<f4").reshape(v["shape"])
            for k, v in header.items()}


def flip_bit(path, tensor, index=0):
    """Flips bit 16 (in the third byte) of one float32 element of a safetensors file, in place."""
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        begin = header[tensor]["data_offsets"][0]
        f.seek(8 + n + begin + 4 * index + 2)
        b = f.read(1)[0]
        f.seek(8 + n + begin + 4 * index + 2)
        f.write(bytes([b ^ 1]))


def test_a_tampered_gradient_changes_the_replayed_fingerprint(tmp_path):
    model, opt, x, y = setup()
    case = str(tmp_path / "case")
    rec = Recorder(opt, case, steps=3)
    train(model, opt, x, y, 3)
    assert renaissance.replay(case)["fingerprint"] == rec.fingerprint
    flip_bit(os.path.join(case, "grads.safetensors"), "step1/g1.p0", 5)
    assert renaissance.replay(case)["fingerprint"] != rec.fingerprint


def test_the_loss_scale_is_recorded(tmp_path):
    model, opt, x, y = setup()
    case = str(tmp_path / "case")
    opt.grad_scale = torch.tensor(1024.0)  # torch 2.x's GradScaler protocol
    with Recorder(opt, case, steps=2) as rec:
        train(model, opt, x, y, 2, scale=1024.0)
    assert case_json(case)["loss_scale_per_step"] == [1024.0, 1024.0]
    # the stored gradients are the scaled ones (cross-entropy's own are below 1 here)
    assert max(np.abs(a).max() for a in read_safetensors(os.path.join(case, "grads.safetensors")).values()) > 10.0
    assert renaissance.replay(case)["fingerprint"] == rec.fingerprint
    # the same run without the scale ends elsewhere: the scale mattered
    model2, opt2, x2, y2 = setup()
    train(model2, opt2, x2, y2, 2, scale=1024.0)
    assert opt2.fingerprint() != rec.fingerprint


def test_a_non_empty_folder_is_refused_unless_overwrite(tmp_path):
    model, opt, x, y = setup()
    case = tmp_path / "case"
    case.mkdir()
    (case / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        Recorder(opt, str(case), steps=1)
    assert "step" not in vars(opt) and (case / "keep.txt").read_text() == "mine"
    rec = Recorder(opt, str(case), steps=1, overwrite=True)
    train(model, opt, x, y, 1)
    assert sorted(os.listdir(case)) == ["case.json", "grads.safetensors", "init.safetensors"]
    assert renaissance.replay(str(case))["fingerprint"] == rec.fingerprint
    # nothing left beside it (the temporary folders are gone)
    assert sorted(os.listdir(tmp_path)) == ["case"]
    (tmp_path / "empty").mkdir()
    Recorder(opt, str(tmp_path / "empty"), steps=1).finish()  # an empty folder is fine
    assert renaissance.replay(str(tmp_path / "empty"))["steps"] == 0


def test_an_exception_writes_nothing_and_an_early_exit_writes_what_was_recorded(tmp_path):
    model, opt, x, y = setup()
    with pytest.raises(RuntimeError):
        with Recorder(opt, str(tmp_path / "failed"), steps=5):
            train(model, opt, x, y, 1)
            raise RuntimeError("boom")
    assert not (tmp_path / "failed").exists() and "step" not in vars(opt)
    with Recorder(opt, str(tmp_path / "short"), steps=5) as rec:
        train(model, opt, x, y, 2)
    assert case_json(str(tmp_path / "short"))["steps"] == 2
    assert renaissance.replay(str(tmp_path / "short"))["fingerprint"] == rec.fingerprint == opt.fingerprint()


def test_refusals(tmp_path):
    model, opt, x, y = setup()
    with pytest.raises(ValueError):
        Recorder(opt, str(tmp_path / "c"), steps=0)
    with pytest.raises(TypeError):
        Recorder(torch.optim.SGD(model.parameters(), lr=0.1), str(tmp_path / "c"), steps=1)
    rec = Recorder(opt, str(tmp_path / "c"), steps=2)
    opt.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match="no gradient"):
        opt.step()
    assert rec.finished and not (tmp_path / "c").exists() and "step" not in vars(opt)


def test_recording_renaissance_torch_adamw(tmp_path):
    """The same with the real optimizer (zero-copy arena views): it records and replays bit for bit,
    and ends where the stand-in does (the same core steps under both)."""
    import renaissance.torch as rt
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = rt.AdamW([{"params": model[0].parameters()},
                    {"params": model[2].parameters(), "lr": 1e-2, "weight_decay": 0.0}], lr=1e-3, threads=1)
    assert len(opt._shared()) == 1  # both groups in one Task, as the replay runs them
    x = torch.randn(32, 12)
    y = torch.randint(0, 4, (32,))
    train(model, opt, x, y, 2)
    case = str(tmp_path / "case")
    assert rt.Recorder is Recorder  # the package's name for it
    with rt.Recorder(opt, case, steps=4) as rec:
        train(model, opt, x, y, 4)
    # The optimizer's own fingerprint is the one the case stores (combined over the two groups).
    assert opt.fingerprint() == rec.fingerprint
    assert [g["initial_step"] for g in case_json(case)["groups"]] == [2, 2]
    assert renaissance.replay(case, threads=2)["fingerprint"] == rec.fingerprint
    model2, opt2, x2, y2 = setup()
    train(model2, opt2, x2, y2, 6)
    assert opt2.fingerprint() == rec.fingerprint


def clipped_adamw(groups_in_one_optimizer=True):
    """Two AdamW groups clipping at 0.05 (every step clips): one renaissance.torch optimizer (one
    Task, one norm over both groups) or, as the control, one optimizer per group."""
    import renaissance.torch as rt
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    groups = [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 1e-2, "weight_decay": 0.0}]
    if groups_in_one_optimizer:
        opts = [rt.AdamW(groups, lr=1e-3, max_grad_norm=0.05, threads=1)]
    else:
        opts = [rt.AdamW([g], lr=1e-3, max_grad_norm=0.05, threads=1) for g in groups]
    return model, opts


def test_clipping_over_a_shared_task_replays(tmp_path):
    """A shared Task clips over all its groups; the replay runs those groups in one Task too, so
    the recording replays bit for bit, and it is not what clipping each group alone gives."""
    model, (opt,) = clipped_adamw()
    assert len(opt._shared()) == 1
    torch.manual_seed(1)
    x, y = torch.randn(32, 12), torch.randint(0, 4, (32,))
    train(model, opt, x, y, 2)
    case = str(tmp_path / "clip")
    with Recorder(opt, case, steps=3) as rec:
        train(model, opt, x, y, 3)
    assert [g["optimizer"]["max_grad_norm"] for g in case_json(case)["groups"]] == [0.05, 0.05]
    assert renaissance.replay(case, threads=2)["fingerprint"] == rec.fingerprint == opt.fingerprint()
    # The control: the same run with one Task per group (each clipped alone) ends elsewhere.
    model2, opts2 = clipped_adamw(groups_in_one_optimizer=False)
    for _ in range(5):
        for o in opts2:
            o.zero_grad()
        torch.nn.functional.cross_entropy(model2(x), y).backward()
        for o in opts2:
            o.step()
    assert combine_fingerprints([o.fingerprint() for o in opts2]) != rec.fingerprint


def test_clipping_groups_of_one_structure_in_different_tasks_are_refused(tmp_path):
    """The replay would put them in one Task and clip over both: refused, nothing hooked."""
    _, opts = clipped_adamw(groups_in_one_optimizer=False)
    both = types.SimpleNamespace(_bindings=opts[0]._bindings + opts[1]._bindings)
    with pytest.raises(ValueError, match="clip with the same structure in different Tasks"):
        Recorder(both, str(tmp_path / "c"), steps=2)
    assert "step" not in vars(both) and not (tmp_path / "c").exists()


def test_combine_fingerprints():
    a, b = "0123456789abcdef", "fedcba9876543210"
    assert combine_fingerprints([a]) == a
    assert combine_fingerprints([a, b]) != combine_fingerprints([b, a])
    with pytest.raises(ValueError):
        combine_fingerprints([])


def test_the_committed_recorded_cases_replay_to_their_fingerprint():
    cases = sorted(p.parent for p in RECORDED.glob("*/case.json"))
    assert cases, f"no recorded case under {RECORDED}"
    for case in cases:
        assert renaissance.replay(str(case), threads=2)["fingerprint"] == case_json(case)["expected_fingerprint"], case
