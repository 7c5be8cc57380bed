# The core Python module (renaissance._core over numpy): results independent of the thread count
# and of the CPU switches (RENAISSANCE_CPU_*), AdamW against a float64 numpy reference, bad inputs
# that raise and change nothing, every replay case of testdata/replay, and checkpoint round trips.
# Run by scripts/test_python.sh.
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import renaissance
from renaissance import _core

ROOT = Path(__file__).resolve().parents[2]
REPLAY_DIR = ROOT / "testdata" / "replay"

# Odd sizes so that tails, several tiles and both groups (bias-like, weight) are exercised.
PARAMS = [
    ("conv.weight", (7, 3, 5, 5), "deep_conv"),
    ("bn.bias", (7,), "bn_bias"),
    ("fc.weight", (10, 333), "fc_weight"),
    ("fc.bias", (10,), "fc_bias"),
]
ADAMW = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05)


def weights(seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _, shape, _ in PARAMS]


def grads(step, seed=2):
    rng = np.random.default_rng(seed * 1000 + step)
    return [(0.1 * rng.standard_normal(shape)).astype(np.float32) for _, shape, _ in PARAMS]


def make_task(threads=1, kind="adamw", hyper=ADAMW, **kw):
    t = renaissance.Task(PARAMS, backend="cpu", threads=threads, **kw)
    t.optimizer(kind, **hyper)
    t.compile()
    for i, w in enumerate(weights()):
        t.set_weight(i, w)
    return t


def run_steps(t, first, last):
    for s in range(first, last):
        for i, g in enumerate(grads(s)):
            t.set_grad(PARAMS[i][0] if i % 2 else i, g)  # by name and by index
        t.set_lr(ADAMW["lr"] * (1.0 + 0.1 * s))
        t.step()


def state(t):
    return t.fingerprint(), t.step_count, t.skipped_steps, [t.get_weight(i).tobytes() for i in range(len(PARAMS))]


def test_version_is_the_cmake_project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    assert renaissance.__version__ == re.search(r"project\(renaissance VERSION ([0-9.]+)", text).group(1)


def test_threads_do_not_change_the_bits():
    prints = []
    for threads in (1, 2, 3):
        t = make_task(threads)
        run_steps(t, 0, 4)
        assert t.step_count == 4 and t.skipped_steps == 0
        prints.append(t.fingerprint())
    assert len(prints[0]) == 16 and prints[0] == prints[1] == prints[2]


def test_cpu_switches_from_the_environment(monkeypatch):
    """RENAISSANCE_CPU_* reach a CPU task as they reach `renaissance run` (the library itself reads
    no environment; the module reads it when a task is made), change no bit, and a malformed one
    raises naming the variable."""
    t = make_task(2)
    run_steps(t, 0, 3)
    base = t.fingerprint()
    assert "chunk" not in t.backend
    monkeypatch.setenv("RENAISSANCE_CPU_CHUNK", "64")
    monkeypatch.setenv("RENAISSANCE_CPU_SCHEDULE", "static")
    monkeypatch.setenv("RENAISSANCE_CPU_PREFETCH", "4096")
    t = make_task(2)
    assert ", chunk 64, static, prefetch 4096" in t.backend, t.backend
    run_steps(t, 0, 3)
    assert t.fingerprint() == base
    monkeypatch.setenv("RENAISSANCE_CPU_CHUNK", "100")
    with pytest.raises(RuntimeError, match=r"RENAISSANCE_CPU_CHUNK=100: expected a positive multiple of 64"):
        make_task(2)


def test_adamw_matches_a_float64_reference():
    t = make_task(1)
    run_steps(t, 0, 3)
    b1, b2, eps, wd = ADAMW["beta1"], ADAMW["beta2"], ADAMW["eps"], ADAMW["weight_decay"]
    for i, (name, shape, role) in enumerate(PARAMS):
        w = weights()[i].astype(np.float64)
        m = np.zeros(shape)
        v = np.zeros(shape)
        decay_wd = 0.0 if role.endswith("bias") else wd  # bias-like roles are never decayed
        for s in range(3):
            lr = ADAMW["lr"] * (1.0 + 0.1 * s)
            g = grads(s)[i].astype(np.float64)
            w = w * (1.0 - lr * decay_wd)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            mhat = m / (1 - b1 ** (s + 1))
            vhat = v / (1 - b2 ** (s + 1))
            w = w - lr * mhat / (np.sqrt(vhat) + eps)
        got = t.get_weight(name).astype(np.float64)
        assert got.shape == shape
        # tensor-wise, as replay compares (an element that cancels to ~0 has no useful relative error)
        rel_l2 = np.linalg.norm(got - w) / np.linalg.norm(w)
        rel_max = np.max(np.abs(got - w)) / np.max(np.abs(w))
        assert rel_l2 < 1e-6 and rel_max < 1e-6, f"{name}: relative error {rel_l2:.3e} (L2), {rel_max:.3e} (max)"
        # the reference really moved the weights (a no-op optimizer would fail above)
        assert np.max(np.abs(w - weights()[i])) > 1e-3


def test_replay_helpers_take_a_task_and_say_so_otherwise():
    # The Recorder's helpers (replay_bindings.cc) reach the Task through its Python object: a
    # wrong object is a TypeError naming its type, never a C++ cast error.
    t = make_task(1)
    run_steps(t, 0, 1)
    np.testing.assert_array_equal(_core._task_read(t, "W", 0), t.get_weight(0))
    for call in (lambda: _core._task_read(3, "W", 0), lambda: _core._task_families("x"),
                 lambda: _core._task_config([])):
        with pytest.raises(TypeError, match="expected a renaissance._core.Task, got (int|str|list)"):
            call()


def test_bad_inputs_raise_and_change_nothing(tmp_path):
    t = make_task(1)
    run_steps(t, 0, 2)
    before = state(t)
    good = grads(9)[0]
    bad_calls = [
        (TypeError, lambda: t.set_grad(0, good.astype(np.float64))),
        (TypeError, lambda: t.set_weight(0, good.astype(np.float16))),
        (TypeError, lambda: t.set_weight(0, good.tolist())),
        (ValueError, lambda: t.set_grad(0, good.reshape(7, 3, 25))),
        (ValueError, lambda: t.set_weight("fc.weight", np.zeros((333, 10), np.float32))),  # transposed shape
        (ValueError, lambda: t.set_weight("fc.weight", np.zeros((333, 10), np.float32).T)),  # non-contiguous
        (ValueError, lambda: t.set_grad(1, np.zeros(14, np.float32)[::2])),  # strided, right shape
        (ValueError, lambda: t.set_grad("no.such.param", good)),
        (IndexError, lambda: t.set_grad(4, good)),
        (IndexError, lambda: t.get_weight(-1)),
        (ValueError, lambda: t.optimizer("no_such_kind", lr=0.1)),
        (ValueError, lambda: t.optimizer("adamw", lr=math.nan)),
        (TypeError, lambda: t.optimizer("adamw", momentum=0.9)),  # adamw reads no momentum
        (ValueError, lambda: t.set_lr(math.nan)),
        (ValueError, lambda: t.set_lr(-1.0)),
        (ValueError, lambda: t.set_loss_scale(0.0)),
        (OSError, lambda: t.load(str(tmp_path / "missing.ckpt"))),
    ]
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint" * 8)
    bad_calls.append((ValueError, lambda: t.load(str(tmp_path / "junk.ckpt"))))
    for i, (exc, call) in enumerate(bad_calls):
        with pytest.raises(exc):
            call()
        assert state(t) == before, f"bad call {i} changed the task"
    # and the task still works: the same steps as an untouched task give the same bits
    run_steps(t, 2, 3)
    u = make_task(1)
    run_steps(u, 0, 3)
    assert t.fingerprint() == u.fingerprint()


def test_a_rejected_optimizer_keeps_the_previous_configuration():
    t = renaissance.Task(PARAMS, threads=1)
    t.optimizer("adamw", **ADAMW)
    with pytest.raises(ValueError):
        t.optimizer("adamw", lr=0.5, beta2=1.5)
    with pytest.raises(ValueError):
        t.optimizer("sgd", weight_decay_mode="l3")
    t.compile()
    for i, w in enumerate(weights()):
        t.set_weight(i, w)
    run_steps(t, 0, 2)
    u = make_task(1)
    run_steps(u, 0, 2)
    assert t.fingerprint() == u.fingerprint()


def test_bad_task_arguments():
    with pytest.raises(ValueError, match="role"):
        renaissance.Task([("w", (3,), "no_role")])
    with pytest.raises(ValueError, match="backend"):
        renaissance.Task(PARAMS, backend="tpu")
    with pytest.raises(ValueError):
        renaissance.Task([("w", (3,), "fc_bias"), ("w", (4,), "fc_bias")])  # duplicate name
    with pytest.raises(ValueError):
        renaissance.Task(PARAMS, threads=-1)
    t = renaissance.Task(PARAMS)
    with pytest.raises(ValueError):
        t.compile()  # no optimizer yet


def test_skipped_step_on_a_non_finite_gradient():
    t = make_task(1)
    run_steps(t, 0, 1)
    before = t.fingerprint()
    g = grads(5)
    g[2][3, 7] = np.inf
    for i, x in enumerate(g):
        t.set_grad(i, x)
    t.step()
    assert (t.step_count, t.skipped_steps, t.last_step_skipped) == (1, 1, True)
    assert t.fingerprint() == before


def test_save_load_equals_the_uninterrupted_run(tmp_path):
    whole = make_task(1)
    run_steps(whole, 0, 6)
    first = make_task(2)
    run_steps(first, 0, 3)
    path = str(tmp_path / "half.ckpt")
    first.save(path)
    resumed = renaissance.Task(PARAMS, threads=1)
    resumed.optimizer("adamw", **ADAMW)
    resumed.compile()
    resumed.load(path)
    assert resumed.step_count == 3 and resumed.fingerprint() == first.fingerprint()
    run_steps(resumed, 3, 6)
    assert resumed.fingerprint() == whole.fingerprint()
    assert resumed.get_weight("fc.weight").tobytes() == whole.get_weight("fc.weight").tobytes()


def replay_cases():
    return sorted(p.parent.name for p in REPLAY_DIR.glob("*/case.json"))


def test_the_replay_cases_cover_every_kind():
    names = {k["name"] for k in renaissance.kinds()}
    assert "adamw" in names and len(names) == len(renaissance.kinds())
    covered = {renaissance.replay(str(REPLAY_DIR / c), threads=1)["kind"] for c in replay_cases()}
    assert covered == names


@pytest.mark.parametrize("case", replay_cases())
def test_replay_case_passes(case):
    r = renaissance.replay(str(REPLAY_DIR / case), backend="cpu", threads=2)
    assert r["passed"] is True, r["tensors"]
    # the case's own tolerance (case.json, the muon cases), else 1e-6
    with open(REPLAY_DIR / case / "case.json") as f:
        assert r["tolerance"] == json.load(f).get("tolerance", 1e-6)
    assert r["tensors"] and all(x["passed"] and x["rel_l2"] <= r["tolerance"] for x in r["tensors"])
    assert r["steps_applied"] + r["steps_skipped"] == r["steps"]
    # the verdict can fail: no float32 run of several steps is exact to a float64 reference
    strict = renaissance.replay(str(REPLAY_DIR / case), threads=1, tolerance=0.0)
    assert strict["passed"] is False and strict["fingerprint"] == r["fingerprint"]


def test_replay_errors():
    with pytest.raises(OSError):
        renaissance.replay(str(REPLAY_DIR / "no_such_case"))
    with pytest.raises(ValueError):
        renaissance.replay(str(REPLAY_DIR / replay_cases()[0]), tolerance=-1.0)


@pytest.mark.parametrize("key,value,default", [("momentum", 0.5, 0.0), ("trust_coefficient", 0.02, 0.001),
                                               ("aux_lr", 0.01, 3e-4)])
def test_replay_refuses_a_key_the_kind_does_not_read(tmp_path, key, value, default):
    """testdata/replay/adam with a key adam does not read: refused (ValueError naming the kind and
    the key) unless it holds adam's default, which replays as the case without it."""
    import shutil
    case = tmp_path / "adam"
    shutil.copytree(REPLAY_DIR / "adam", case)
    j = json.loads((case / "case.json").read_text())
    assert key not in j["optimizer"]
    j["optimizer"][key] = value
    (case / "case.json").write_text(json.dumps(j))
    with pytest.raises(ValueError, match=r"optimizer: adam does not take %s \(%s given" % (key, value)):
        renaissance.replay(str(case), threads=1)
    j["optimizer"][key] = default
    (case / "case.json").write_text(json.dumps(j))
    r = renaissance.replay(str(case), threads=1)
    assert r["passed"] and r["fingerprint"] == renaissance.replay(str(REPLAY_DIR / "adam"), threads=1)["fingerprint"]


def test_kinds_and_layouts():
    kinds = renaissance.kinds()
    adamw = next(k for k in kinds if k["name"] == "adamw")
    assert adamw["has_m"] and adamw["has_v"] and adamw["family"] == "adam"
    assert "momentum" not in adamw["hyperparameters"] and adamw["defaults"]["beta2"] == 0.999
    # torch_m: what torch calls M (torch.optim.SGD's and Muon's momentum_buffer, Adam's exp_avg;
    # MuonWithAuxAdam's weight group is Muon's, its bias-like group its AdamW's).
    assert {k["name"]: k["torch_m"] for k in kinds} == {
        "sgd": "momentum_buffer", "sgd_momentum": "momentum_buffer", "sgd_nesterov": "momentum_buffer",
        "adam": "exp_avg", "adamw": "exp_avg", "lars": "momentum_buffer", "lars_nesterov": "momentum_buffer",
        "lion": "exp_avg", "lamb": "exp_avg", "muon": "momentum_buffer_in_weight_group"}
    assert "resnet50" in renaissance.layouts()
    params = renaissance.layout("resnet50")
    t = renaissance.Task(params)
    assert t.params == params and len(params) > 100
    with pytest.raises(ValueError):
        renaissance.layout("no_such_layout")


def test_hyperparameter_table():
    """renaissance.hyperparameters() is the core's table: the keywords .optimizer() takes for a
    kind are the table's numbers that name the kind (plus weight_decay_mode where l2 is allowed,
    plus the flags that name it), a keyword of another kind is a TypeError, and each number is
    validated by its row's rule."""
    table = renaissance.hyperparameters()
    names = [h["name"] for h in table]
    assert names[:8] == ["lr", "weight_decay", "momentum", "beta1", "beta2", "eps", "trust_coefficient",
                         "max_grad_norm"]
    assert all(h["flag"] == "--" + h["name"].replace("_", "-") and h["help"] for h in table)
    maximize = next(h for h in table if h["name"] == "maximize")
    assert maximize["type"] == "flag" and maximize["optional"] and maximize["default"] is False
    assert not maximize["resume_may_change"]
    kinds = {k["name"]: k for k in renaissance.kinds()}
    for k in kinds.values():
        numbers = [h["name"] for h in table if h["type"] == "number" and k["name"] in h["kinds"]]
        assert k["hyperparameters"] == numbers + (["weight_decay_mode"] if k["allows_l2"] else [])
    t = renaissance.Task([("w", [4], "fc_weight")])
    for h in table:
        for kind in kinds:
            if h["type"] == "flag" and kind in h["kinds"]:  # maximize: every kind; amsgrad: adam, adamw
                t.optimizer(kind, **{h["name"]: True})
                with pytest.raises(TypeError, match=h["name"] + " must be True or False"):
                    t.optimizer(kind, **{h["name"]: 1})
            elif kind in h["kinds"]:
                with pytest.raises(ValueError, match="invalid " + h["name"]):
                    t.optimizer(kind, **{h["name"]: float("nan")})
            else:
                with pytest.raises(TypeError, match="unexpected keyword '%s'" % h["name"]):
                    t.optimizer(kind, **{h["name"]: 0.5})


@pytest.mark.parametrize("threads", [2 ** 40, 2 ** 31, -1])
def test_threads_out_of_range_is_a_value_error(threads, tmp_path):
    with pytest.raises(ValueError, match=r"threads .*: must be in \[0, 2\*\*31\)"):
        renaissance.Task([("w", [4], "fc_weight")], threads=threads)
    with pytest.raises(ValueError, match=r"threads .*: must be in \[0, 2\*\*31\)"):
        renaissance.replay(str(tmp_path), threads=threads)
