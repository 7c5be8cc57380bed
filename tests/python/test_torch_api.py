"""renaissance.torch's contract on the CPU: zero-copy views, zero_grad, replaced and None gradients,
param groups, hyperparameter changes, torch-format state_dict both ways (bitwise), save/load,
fingerprints, the AMP scale slot and skip, and the construction errors (nothing changed)."""
import subprocess
import sys
import warnings

import numpy as np
import pytest

import torch  # noqa: E402  (CI installs it: scripts/test_python.sh)

import renaissance  # noqa: E402
import renaissance.torch as rt  # noqa: E402

from torch_test_util import SHAPES, bits, grads, same_bits  # noqa: E402
from torch_test_util import params as _params  # noqa: E402


def params(seed=0):
    """The shared parameters, each with a zero .grad (as torch 1.x's zero_grad() leaves one):
    construction points it at the arena's G, into which feed() writes. A parameter without a
    .grad keeps None (tests/python/test_torch_unused_layer.py)."""
    ps = _params(seed)
    for p in ps:
        p.grad = torch.zeros_like(p)
    return ps


def feed(ps, step, scale=1.0):
    """The step's gradients: written into each .grad (the arena's view), or handed over as fresh
    tensors where .grad is None (as backward does)."""
    for p, g in zip(ps, grads(step)):
        if p.grad is None:
            p.grad = g * scale
        else:
            p.grad.copy_(g * scale)


def test_import_renaissance_does_not_import_torch():
    code = "import sys, renaissance; assert 'torch' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_parameters_and_gradients_are_arena_views():
    ps = params()
    before = [p.detach().clone() for p in ps]
    opt = rt.AdamW(ps, lr=1e-2)
    b = opt._bindings[0]
    for j, p in enumerate(ps):
        assert p.data_ptr() == b.W[j].data_ptr() and p.grad.data_ptr() == b.G[j].data_ptr()
        assert same_bits(p, before[j])  # copied in
        assert same_bits(torch.from_numpy(b.task.get_weight(j)), before[j])
    feed(ps, 0)
    opt.step()
    for j, p in enumerate(ps):
        assert same_bits(torch.from_numpy(b.task.get_weight(j)), p)  # the step moved p itself
        assert not same_bits(p, before[j])
    # autograd accumulates into the view (after an in-place zero_grad)
    opt.zero_grad(set_to_none=False)
    (ps[0] * 2.0).sum().backward()
    assert ps[0].grad.data_ptr() == b.G[0].data_ptr()
    assert np.array_equal(b.task.get_grad(0), np.full((6, 5), 2.0, np.float32))


def test_zero_grad_keeps_views_and_zeroes_in_place():
    ps = params()
    opt = rt.SGD(ps, lr=0.1, momentum=0.9)
    feed(ps, 0)
    feed(ps, 1)
    opt.zero_grad(set_to_none=False)
    for j, p in enumerate(ps):
        assert p.grad is not None and p.grad.data_ptr() == opt._bindings[0].G[j].data_ptr()
        assert not p.grad.any()


def test_zero_grad_set_to_none_reads_autograd_gradients_in_place():
    """torch's default zero_grad(): .grad becomes None, backward makes fresh tensors, and step()
    reads them where they are through the Task's gradient table (no copy, no warning, .grad
    stays autograd's tensor); set_to_none=False re-points .grad to the zeroed views, into which
    backward accumulates. Both give the bits of the in-place run."""
    import warnings
    runs = []
    for set_to_none in (True, False):
        ps = params()
        opt = rt.AdamW(ps, lr=1e-2)
        shared = opt._bindings[0].shared
        for s in range(3):
            opt.zero_grad(set_to_none=set_to_none)
            assert all((p.grad is None) == set_to_none for p in ps)
            sum(((p * g).sum() for p, g in zip(ps, grads(s)))).backward()
            autograds = [p.grad for p in ps]
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # reading autograd's gradients must not warn
                opt.step()
            for j, p in enumerate(ps):
                assert p.grad is autograds[j]  # never re-pointed
                on_view = p.grad.data_ptr() == opt._bindings[0].G[j].data_ptr()
                assert on_view != set_to_none
        assert shared.in_place_steps == (3 if set_to_none else 0)
        runs.append([bits(p.detach()) for p in ps] + [bits(opt.state[p]["exp_avg_sq"]) for p in ps])
    assert all(np.array_equal(a, b) for a, b in zip(*runs))


def reference_run(ps, opt, steps):
    for s in range(steps):
        feed(ps, s)
        opt.step()


def test_replaced_gradient_is_copied_in_and_repointed():
    """A .grad the step cannot read in place (here: not contiguous) is copied into G, with a
    warning, and .grad re-pointed to the view."""
    ps, qs = params(), params()
    a, b = rt.AdamW(ps, lr=1e-2), rt.AdamW(qs, lr=1e-2)
    feed(ps, 0)
    for q, g in zip(qs, grads(0)):
        # a foreign tensor, not the view, and strided: [::2] of a tensor twice the size
        wide = torch.stack([g, torch.full_like(g, float("nan"))], dim=-1).reshape(*g.shape[:-1], 2 * g.shape[-1])
        q.grad = wide[..., ::2] if g.dim() > 0 else g.clone().t()
        assert q.grad.dim() == 0 or not q.grad.is_contiguous()
    import renaissance._torch_group as tg
    tg._GRAD_COPY_WARNED[0] = False
    with pytest.warns(UserWarning, match="copied in"):
        b.step()
    a.step()
    assert a.fingerprint() == b.fingerprint()
    assert all(q.grad.data_ptr() == b._bindings[0].G[j].data_ptr() for j, q in enumerate(qs))


@pytest.mark.parametrize("make", [lambda p: rt.AdamW(p, lr=1e-2, weight_decay=0.1),
                                  lambda p: rt.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
                                  lambda p: rt.LAMB(p), lambda p: rt.LARS(p, weight_decay=1e-3),
                                  lambda p: rt.Lion(p, weight_decay=0.1)])
def test_none_gradient_leaves_parameter_and_state_unchanged(make):
    ps = params()
    opt = make(ps)
    b = opt._bindings[0]
    feed(ps, 0)
    opt.step()
    w1 = [p.detach().clone() for p in ps]
    state1 = [[x[j].clone() for x in (b.M, b.V) if x is not None] for j in range(len(ps))]
    feed(ps, 1)
    ps[1].grad = None
    ps[2].grad = None
    opt.step()
    for j in (1, 2):
        assert same_bits(ps[j], w1[j])
        assert all(same_bits(x[j], s) for x, s in zip([x for x in (b.M, b.V) if x is not None], state1[j]))
        assert ps[j].grad is None
    for j in (0, 3):
        assert not same_bits(ps[j], w1[j])
    assert b.task.step_count == 2  # documented: the group's counter advances


def test_group_without_any_gradient_is_not_moved():
    ps = params()
    opt = rt.AdamW([{"params": ps[:2]}, {"params": ps[2:]}], lr=1e-2)
    feed(ps, 0)
    ps[2].grad = None
    ps[3].grad = None
    b = opt._bindings[1]
    before = [[x[j].clone() for x in (b.W, b.M, b.V)] for j in range(2)]
    w0 = ps[0].detach().clone()
    opt.step()
    for j in range(2):
        assert all(same_bits(v, x) for v, x in zip((b.W[j], b.M[j], b.V[j]), before[j]))
    assert not same_bits(ps[0], w0)  # group 0 moved
    # Documented: both groups share one Task, so its step counter advances for both.
    assert opt._bindings[0].task.step_count == 1 and b.task.step_count == 1


def test_groups_of_one_structure_share_one_task():
    """Groups that differ only in scalar hyperparameters are hyperparameter groups of one Task (one
    core step); momentum on/off needs another compiled step: another Task."""
    ps = params()
    opt = rt.AdamW([{"params": [p], "lr": 1e-2 * (j + 1), "betas": (0.9, 0.99 + 0.002 * j),
                     "weight_decay": 0.01 * j} for j, p in enumerate(ps)], lr=1e-2)
    assert len(opt._shared()) == 1 and opt._shared()[0].task.hyper_groups == len(ps)
    sgd = rt.SGD([{"params": ps[:2]}, {"params": ps[2:], "momentum": 0.9}], lr=0.1)
    assert len(sgd._shared()) == 2


def test_one_group_per_tensor_has_the_bits_of_one_group():
    """Equal hyperparameters in one group per tensor: every element reads equal scalars, so the
    weights and state are bit for bit those of one group (also under an AMP scale, which must
    reach every group's slot)."""
    ps, qs = params(), params()
    a = rt.AdamW(ps, lr=1e-2, weight_decay=0.05)
    b = rt.AdamW([{"params": [q]} for q in qs], lr=1e-2, weight_decay=0.05)
    for s in range(4):
        feed(ps, s, scale=512.0)
        a.grad_scale = torch.tensor(512.0)
        a.found_inf = torch.tensor(0.0)
        feed(qs, s, scale=512.0)
        b.grad_scale = torch.tensor(512.0)
        b.found_inf = torch.tensor(0.0)
        if s == 2:  # an lr change for every group (as a scheduler does)
            for o in (a, b):
                for g in o.param_groups:
                    g["lr"] = 3e-3
        a.step()
        b.step()
    for p, q in zip(ps, qs):
        assert same_bits(p, q)
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    for j in range(len(ps)):
        assert same_bits(sa[j]["exp_avg"], sb[j]["exp_avg"]) and same_bits(sa[j]["exp_avg_sq"], sb[j]["exp_avg_sq"])


def test_add_param_group_builds_another_task():
    ps = _params()  # no .grad: a refusal must leave it None
    opt = rt.AdamW(ps[:2], lr=1e-2)
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        opt.add_param_group({"params": [ps[2], ps[0]]})
    assert len(opt.param_groups) == 1 and ps[2].grad is None
    opt.add_param_group({"params": ps[2:], "lr": 1e-3})
    assert len(opt._bindings) == 2 and ps[3].data_ptr() == opt._bindings[1].W[1].data_ptr()
    w = [p.detach().clone() for p in ps]
    feed(ps, 0)
    opt.step()
    assert all(not same_bits(p, x) for p, x in zip(ps, w))
    assert opt._bindings[1].task.lr == 1e-3


def test_param_groups_match_torch():
    ps = params()
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]

    def groups(x):
        return [{"params": [x[0], x[2]], "weight_decay": 0.1}, {"params": [x[1], x[3]], "lr": 3e-3, "weight_decay": 0.0}]

    a = rt.AdamW(groups(ps), lr=1e-2)
    b = torch.optim.AdamW(groups(qs), lr=1e-2)
    for s in range(10):
        feed(ps, s)
        for q, g in zip(qs, grads(s)):
            q.grad = g
        a.step()
        b.step()
        if s == 4:  # hyperparameters change between steps, no recompile
            for o in (a, b):
                o.param_groups[0]["lr"] = 5e-3
                o.param_groups[1]["betas"] = (0.8, 0.99)
    for p, q in zip(ps, qs):
        assert float((p - q).norm() / q.norm()) <= 1e-5
    # Several groups: the combined fingerprint replay cases hold, from the groups' own.
    groups = [b.task.fingerprint() for b in a._bindings]
    assert len(groups) == 2 and a.fingerprint() == renaissance.combine_fingerprints(groups)
    assert a.fingerprint() not in groups


def test_change_that_needs_a_recompile_is_refused():
    ps = params()
    opt = rt.SGD(ps, lr=0.1, momentum=0.9)
    opt.param_groups[0]["momentum"] = 0.0
    feed(ps, 0)
    w = [p.detach().clone() for p in ps]
    with pytest.raises(ValueError, match="cannot change the optimizer"):
        opt.step()
    assert all(same_bits(p, x) for p, x in zip(ps, w))
    opt.param_groups[0]["momentum"] = 0.5  # a value change is fine
    opt.step()
    assert opt._bindings[0].task.step_count == 1


def test_trust_ratio_change_that_moves_roles_is_refused():
    ps = params()  # mixed ranks: the default (ndim > 1) puts some parameters on each side
    opt = rt.LARS(ps, lr=0.1, momentum=0.9, weight_decay=1e-4)
    feed(ps, 0)
    w = [p.detach().clone() for p in ps]
    opt.param_groups[0]["trust_ratio"] = True  # every parameter adapted: other roles
    with pytest.raises(ValueError, match="cannot change trust_ratio"):
        opt.step()
    assert all(same_bits(p, x) for p, x in zip(ps, w))
    opt.param_groups[0]["trust_ratio"] = None  # back to the setting it was built with
    opt.step()
    assert opt._bindings[0].task.step_count == 1


def train_torch(ps, opt, first, last):
    for s in range(first, last):
        for p, g in zip(ps, grads(s)):
            p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("ours,theirs,kw", [(rt.AdamW, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
                                           (rt.Adam, torch.optim.Adam, dict(lr=1e-2, weight_decay=0.1)),
                                           (rt.SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.1))])
def test_state_dict_round_trips_with_torch_bitwise(ours, theirs, kw):
    # torch -> ours: the buffers and step arrive bit for bit
    qs = params()
    t = theirs(qs, **kw)
    train_torch(qs, t, 0, 3)
    ps = [torch.nn.Parameter(q.detach().clone()) for q in qs]
    o = ours(ps, **kw)
    o.load_state_dict(t.state_dict())
    b = o._bindings[0]
    for j, q in enumerate(qs):
        for fam, key in b.state_names.items():
            if fam != "step":
                assert same_bits(getattr(b, fam)[j], t.state[q][key])
    if "step" in t.state[qs[0]]:
        assert b.task.step_count == int(t.state[qs[0]]["step"])
    # ... and training on from there stays with torch
    for s in range(3, 6):
        feed(ps, s)
        o.step()
    train_torch(qs, t, 3, 6)
    for p, q in zip(ps, qs):
        assert float((p - q).norm() / q.norm()) <= 1e-5
    # ours -> torch: torch's state after loading ours is ours bit for bit
    fresh = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    t2 = theirs(fresh, **kw)
    t2.load_state_dict(o.state_dict())
    for j, p in enumerate(fresh):
        for fam, key in b.state_names.items():
            if fam != "step":
                assert same_bits(t2.state[p][key], getattr(b, fam)[j])
        if "step" in t2.state[p] and ours is not rt.SGD:
            assert int(t2.state[p]["step"]) == 6


def test_adam_decoupled_weight_decay_is_adamw():
    """torch >= 2.6: Adam(decoupled_weight_decay=True) is AdamW, and AdamW is that Adam (a
    subclass). After three steps: the parameters within float32 rounding of torch's AdamW (an
    independent implementation), the bits of our AdamW, and not those of our L2 Adam (the flag is
    read)."""
    assert issubclass(rt.AdamW, rt.Adam)
    kw = dict(lr=1e-2, weight_decay=0.1)
    runs = {}
    for name, make in [("adam_decoupled", lambda p: rt.Adam(p, decoupled_weight_decay=True, **kw)),
                       ("adamw", lambda p: rt.AdamW(p, **kw)), ("adam_l2", lambda p: rt.Adam(p, **kw))]:
        ps = params()
        opt = make(ps)
        for s in range(3):
            feed(ps, s)
            opt.step()
        runs[name] = (ps, opt)
    ps, opt = runs["adam_decoupled"]
    assert opt.param_groups[0]["decoupled_weight_decay"] is True
    assert opt._bindings[0].kind == "adamw"
    assert all(same_bits(a, b) for a, b in zip(ps, runs["adamw"][0]))
    assert not all(same_bits(a, b) for a, b in zip(ps, runs["adam_l2"][0]))
    qs = params()
    t = torch.optim.AdamW(qs, **kw)
    train_torch(qs, t, 0, 3)
    for p, q in zip(ps, qs):
        assert float((p - q).norm() / q.norm()) <= 1e-5


def test_adam_decoupled_weight_decay_per_group():
    """The flag is a group key, as in torch: one Adam with an L2 group and a decoupled group steps
    each as its own kind, the bits of two optimizers of one group each."""
    ps = params()
    opt = rt.Adam([{"params": ps[:2]}, {"params": ps[2:], "decoupled_weight_decay": True}], lr=1e-2,
                  weight_decay=0.1)
    assert [b.kind for b in opt._bindings] == ["adam", "adamw"]
    alone = params()
    l2 = rt.Adam(alone[:2], lr=1e-2, weight_decay=0.1)
    dec = rt.AdamW(alone[2:], lr=1e-2, weight_decay=0.1)
    for s in range(3):
        feed(ps, s)
        opt.step()
        feed(alone, s)
        l2.step()
        dec.step()
    assert all(same_bits(a, b) for a, b in zip(ps, alone))
    opt.param_groups[0]["decoupled_weight_decay"] = True
    with pytest.raises(ValueError, match="cannot change the optimizer of a param group from 'adam' to 'adamw'"):
        opt.step()


def test_state_dict_round_trip_ours_to_ours_and_save_load(tmp_path):
    ps = params()
    a = rt.AdamW(ps, lr=1e-2)
    reference_run(ps, a, 4)
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    b = rt.AdamW(qs, lr=1e-2)
    b.load_state_dict(a.state_dict())
    assert a.fingerprint() == b.fingerprint()
    a.save(tmp_path / "ckpt")
    f4 = a.fingerprint()
    feed(ps, 4)
    a.step()
    assert a.fingerprint() != f4
    a.load(tmp_path / "ckpt")
    assert a.fingerprint() == f4
    # a checkpoint keeps its weights and state; the lr stays the group's
    a.param_groups[0]["lr"] = 5e-3
    feed(ps, 5)
    a.step()
    a.load(tmp_path / "ckpt")
    assert a.fingerprint() == f4 and a._bindings[0].task.lr == 5e-3
    a.param_groups[0]["lr"] = 1e-2
    # a corrupt state dict, or one that needs another compiled step, changes nothing
    sd = a.state_dict()
    sd["param_groups"][0]["amsgrad"] = True
    with pytest.raises(ValueError, match="amsgrad"):
        b.load_state_dict(sd)
    sd = rt.AdamW(params(), lr=1e-2, max_grad_norm=1.0).state_dict()
    with pytest.raises(ValueError, match="another compiled step"):
        b.load_state_dict(sd)
    assert b.fingerprint() == f4 and b.param_groups[0].get("max_grad_norm") is None
    bad = a.state_dict()
    bad["state"][0]["exp_avg"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="shape"):
        b.load_state_dict(bad)
    assert b.fingerprint() == f4


def run_fingerprint(threads, groups=False):
    ps = params()
    spec = [{"params": ps[:2]}, {"params": ps[2:], "lr": 2e-3}] if groups else ps
    opt = rt.LAMB(spec, lr=1e-2, threads=threads)
    reference_run(ps, opt, 5)
    return opt.fingerprint()


def test_fingerprint_stable_across_runs_and_threads():
    one = [run_fingerprint(t) for t in (1, 2, 1)]
    assert len(one[0]) == 16 and one[0] == one[1] == one[2]
    two = [run_fingerprint(t, groups=True) for t in (1, 2)]
    assert two[0] == two[1] and len(two[0]) == 16 and two[0] != one[0]


def test_fingerprint_equals_a_core_task_fed_the_same():
    """The adapter's mapping (LARS: ndim > 1 -> weight role with trust ratio and wd, else
    bias-like) checked against a core Task built by hand."""
    ps = params()
    opt = rt.LARS(ps, lr=0.1, momentum=0.9, weight_decay=1e-3, trust_coefficient=0.01)
    roles = ["fc_weight" if len(s) > 1 else "fc_bias" for s in SHAPES]
    t = renaissance.Task([(str(j), list(s), roles[j]) for j, s in enumerate(SHAPES)], threads=1)
    t.optimizer("lars", lr=0.1, momentum=0.9, weight_decay=1e-3, trust_coefficient=0.01,
                eps=rt._KINDS["lars"]["defaults"]["eps"])
    t.compile()
    for j, p in enumerate(ps):
        t.set_weight(j, p.detach().numpy())
    for s in range(3):
        feed(ps, s)
        for j, g in enumerate(grads(s)):
            t.set_grad(j, g.numpy())
        opt.step()
        t.step()
    assert opt.fingerprint() == t.fingerprint()


def test_loss_scale_slot_has_set_loss_scale_bits():
    ps = params()
    opt = rt.AdamW(ps)
    b = opt._bindings[0]
    for s in (1.0, 3.0, 7.7, 1e-3, 65536.0 * 1.5, 2.0 ** 24 - 1):
        b.set_scale(torch.tensor(s, dtype=torch.float32))
        from_tensor = bits(b.inv_scale)
        b.task.set_loss_scale(float(np.float32(s)))
        assert np.array_equal(from_tensor, bits(b.inv_scale)), s
        expect = np.float32(1.0 / np.float64(np.float32(s)))
        # one slot per scalar block (with the per-tensor mask: one per parameter), all the same
        assert len(from_tensor) >= 1 and np.array_equal(from_tensor, np.full(len(from_tensor), expect).view(np.uint32))


def test_amp_protocol_scale_and_injected_inf_skip():
    """torch 2.x's GradScaler sets grad_scale/found_inf on the optimizer before step(). A power-of-
    two scale unscales exactly, so the scaled run has the unscaled run's bits; an inf skips."""
    ps, qs = params(), params()
    a, b = rt.AdamW(ps, lr=1e-2), rt.AdamW(qs, lr=1e-2)
    for s in range(3):
        feed(ps, s)
        a.step()
        feed(qs, s, scale=1024.0)
        b.grad_scale = torch.tensor(1024.0)
        b.found_inf = torch.tensor(0.0)
        b.step()
    assert a.fingerprint() == b.fingerprint()
    before = b.fingerprint()
    feed(qs, 3, scale=1024.0)
    qs[2].grad[0, 0, 0, 1] = float("inf")
    b.step()
    assert b.fingerprint() == before and b._bindings[0].task.skipped_steps == 1
    del b.grad_scale, b.found_inf
    feed(qs, 3)  # no scale any more: the slot goes back to 1
    b.step()
    feed(ps, 3)
    a.step()
    assert a.fingerprint() == b.fingerprint()


class _Torch1Scaler:
    """What renaissance.torch reads of a torch 1.x GradScaler that passes itself as grad_scaler=
    (GradScaler itself needs CUDA on torch 1.13): the optimizer's stage, the inf check, the scale."""

    def __init__(self, opt, scale, stage):
        from torch.cuda.amp.grad_scaler import OptState
        self.stage = {"READY": OptState.READY, "UNSCALED": OptState.UNSCALED}[stage]
        self._per_optimizer_states = {id(opt): {"stage": self.stage, "found_inf_per_device": {}}}
        self.scale = torch.tensor(scale)
        self.checked = 0

    def _check_inf_per_device(self, opt):
        self.checked += 1
        return {}

    def _get_scale_async(self):
        return self.scale


def test_torch1_grad_scaler_keyword():
    ps, qs = params(), params()
    a, b = rt.AdamW(ps, lr=1e-2), rt.AdamW(qs, lr=1e-2)
    feed(ps, 0)
    a.step()
    feed(qs, 0, scale=256.0)
    ready = _Torch1Scaler(b, 256.0, "READY")
    b.step(grad_scaler=ready)  # stage READY: records the inf check, unscales by 1/256 in the step
    assert ready.checked == 1 and a.fingerprint() == b.fingerprint()
    feed(ps, 1)
    a.step()
    feed(qs, 1)  # already unscaled (stage UNSCALED): scale 1, no second inf check
    unscaled = _Torch1Scaler(b, 256.0, "UNSCALED")
    b.step(grad_scaler=unscaled)
    assert unscaled.checked == 0 and a.fingerprint() == b.fingerprint()
    with pytest.raises(TypeError, match="unexpected keyword"):
        b.step(scaler=unscaled)


def test_errors_change_nothing():
    base = torch.zeros(20)
    cases = [
        ("listed twice", lambda p: [p[0], p[1], p[0]]),
        ("more than one parameter group", lambda p: [{"params": [p[0]]}, {"params": [p[1], p[0]]}]),
        ("float32", lambda p: [p[0], torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]),
        ("share memory", lambda p: [p[1], torch.zeros(1).expand(3)]),  # non-contiguous ones are taken
        ("overlap", lambda p: [p[0], base[0:10], base[5:15]]),
        ("different devices", lambda p: [p[0], torch.zeros(3, device="meta")]),
    ]
    for what, make in cases:
        ps = _params()  # no .grad: a refusal must leave it None
        w = [p.detach().clone() for p in ps]
        ptrs = [p.data_ptr() for p in ps]
        with pytest.raises(ValueError, match=what):
            rt.AdamW(make(ps))
        for p, x, ptr in zip(ps, w, ptrs):
            assert p.data_ptr() == ptr and same_bits(p, x) and p.grad is None, what


def test_unsupported_arguments_are_refused():
    # foreach, fused and capturable are accepted (tests/python/test_torch_dropin.py).
    for error, make in ((ValueError, lambda p: rt.Adam(p, amsgrad=1)),
                        (ValueError, lambda p: rt.AdamW(p, maximize=1)),
                        (ValueError, lambda p: rt.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)),
                        (ValueError, lambda p: rt.SGD(p, lr=0.1, nesterov=True)),
                        (RuntimeError, lambda p: rt.Adam(p, differentiable=True))):
        ps = _params()  # no .grad: a refusal must leave it None
        with pytest.raises(error):
            make(ps)
        assert all(p.grad is None for p in ps)


def test_sgd_decoupled_matches_core_rule():
    """decoupled_weight_decay=True: w = w*(1 - lr*wd) - lr*g (docs/math.md), checked in float64."""
    ps = params()
    w0 = [p.detach().double().clone() for p in ps]
    opt = rt.SGD(ps, lr=0.1, weight_decay=0.5, decoupled_weight_decay=True)
    feed(ps, 0)
    opt.step()
    for p, w, g in zip(ps, w0, grads(0)):
        expect = w * (1 - 0.1 * 0.5) - 0.1 * g.double()
        assert float((p.double() - expect).abs().max()) < 1e-6
