"""renaissance.torch.Recorder: what it cannot write is refused at once, and a case that would
fail its own replay is never written: the target folder is checked at construction, a second
Recorder on a recorded optimizer is refused, and weights or state edited between recorded steps
(outside step()) are refused."""
import os

import pytest
import torch

import renaissance
import renaissance.torch as rt


def _setup():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    opt = rt.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, opt, torch.randn(8, 6)


def _train(model, opt, x, steps):
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


def test_a_missing_parent_folder_is_refused_at_construction(tmp_path):
    model, opt, x = _setup()
    with pytest.raises(FileNotFoundError, match="parent folder"):
        rt.Recorder(opt, str(tmp_path / "no" / "case"), steps=2)
    assert "step" not in vars(opt)


def test_a_symlinked_case_folder_is_refused_at_construction(tmp_path):
    model, opt, x = _setup()
    (tmp_path / "real").mkdir()
    os.symlink(str(tmp_path / "real"), str(tmp_path / "case"))
    with pytest.raises(FileExistsError, match="symbolic link"):
        rt.Recorder(opt, str(tmp_path / "case"), steps=2)
    assert "step" not in vars(opt)


def test_a_second_recorder_is_refused(tmp_path):
    model, opt, x = _setup()
    rec = rt.Recorder(opt, str(tmp_path / "a"), steps=3)
    with pytest.raises(ValueError, match="already recording"):
        rt.Recorder(opt, str(tmp_path / "b"), steps=2)
    _train(model, opt, x, 3)
    assert rec.finished and renaissance.replay(str(tmp_path / "a"))["fingerprint"] == rec.fingerprint
    rec2 = rt.Recorder(opt, str(tmp_path / "b"), steps=1)  # after the first finished: fine
    _train(model, opt, x, 1)
    assert renaissance.replay(str(tmp_path / "b"))["fingerprint"] == rec2.fingerprint


@pytest.mark.parametrize("edit", ["clamp", "assign", "state"])
def test_weights_edited_between_recorded_steps_are_refused(tmp_path, edit):
    model, opt, x = _setup()
    case = str(tmp_path / "case")
    with pytest.raises(ValueError, match="changed between recorded steps"):
        with rt.Recorder(opt, case, steps=3):
            _train(model, opt, x, 1)
            w = model[0].weight
            if edit == "clamp":
                with torch.no_grad():
                    w.clamp_(-0.1, 0.1)
            elif edit == "assign":
                w.data = w.detach().clamp(-0.1, 0.1)
            else:
                opt.state[w]["exp_avg"].mul_(0.5)
            _train(model, opt, x, 2)
    assert not os.path.exists(case)
    assert "step" not in vars(opt)


def test_a_parameter_frozen_during_the_recording_replays(tmp_path):
    """requires_grad turned off mid-recording: its zeroed .grad is still stepped (as torch steps
    every parameter whose .grad is not None), and the case records it so the replay agrees."""
    model, opt, x = _setup()
    case = str(tmp_path / "case")
    with rt.Recorder(opt, case, steps=3) as rec:
        _train(model, opt, x, 1)
        model[0].weight.requires_grad_(False)
        for _ in range(2):
            opt.zero_grad(set_to_none=False)
            model(x).square().mean().backward()
            opt.step()
    assert renaissance.replay(case)["fingerprint"] == rec.fingerprint == opt.fingerprint()
