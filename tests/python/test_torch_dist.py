"""renaissance.torch with a torch.distributed process group (docs/distributed.md,
"torch.distributed"): K = 2 and 3 CPU processes on gloo, spawned with torch.multiprocessing.

- replicated: every rank feeds the same full gradient; after the steps every rank's parameters
  and (gathered) state are bit for bit those of one process running the same optimizer;
- ordered (and fast at K = 2): rank r feeds its own gradient; the result is bit for bit one process fed
  (g_0 + g_1 + ... + g_{K-1}) / K, summed left to right in fp32 here (the core's
  --simulate-ranks rule, written independently of the library);
- amsgrad (Adam, AdamW): max_exp_avg_sq is sharded as exp_avg_sq is, and state_dict() and the
  checkpoint hold it whole;
- None gradients (every rank alike) on alternate steps: one process's bits through the per-tensor
  mask, each parameter's `step` its own (torch's);
- wrong use is a clear error: ranks that build different optimizers, a rank that does not
  pass process_group (the others' handshake times out with a message), bad arguments.
"""
import datetime
import gc
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import renaissance.torch as rt


def _load_own(path):
    """A file a worker of this test wrote (it holds numpy values, which torch >= 2.6's default
    weights_only=True refuses)."""
    return torch.load(path, weights_only=False)

# Big enough (about 61k elements, 4 grad-norm tiles of 16384) that K = 3 gives every rank a
# non-empty slice; the layout check in the worker makes sure of it.
SHAPES = [(256, 128), (128,), (64, 32, 3, 3), (300,), (40, 250)]
STEPS = 3

# (name, class, keywords, parameter dtype): every class; clipping (a cross-slice norm), LARS and
# LAMB (per-tensor norms across slices), bf16 parameters (the model copy's all-gather).
CASES = [
    ("sgd", rt.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-4), torch.float32),
    ("adam", rt.Adam, dict(lr=1e-2, weight_decay=1e-3), torch.float32),
    ("adamw", rt.AdamW, dict(lr=1e-2, weight_decay=0.05), torch.float32),
    ("adamw_clip", rt.AdamW, dict(lr=1e-2, max_grad_norm=0.5), torch.float32),
    ("lars", rt.LARS, dict(lr=0.1), torch.float32),
    ("lion", rt.Lion, dict(lr=1e-3, weight_decay=0.1), torch.float32),
    ("lamb", rt.LAMB, dict(lr=1e-2, max_grad_norm=1.0), torch.float32),
    ("adamw_bf16", rt.AdamW, dict(lr=1e-2), torch.bfloat16),
    # Rank 0's gradient of step 1 holds a NaN in rank 0's slice: every rank must skip that step
    # (the non-finite flag's max over ranks), as one process does.
    ("adamw_nan", rt.AdamW, dict(lr=1e-2), torch.float32),
    # Two param groups (one Task, and one sharded step, each): their collectives interleave in
    # group order on every rank.
    ("adamw_groups", rt.AdamW, dict(lr=1e-2, groups=True), torch.float32),
    # amsgrad: max_exp_avg_sq sharded like exp_avg_sq, gathered by state_dict() and the checkpoint.
    ("adam_amsgrad", rt.Adam, dict(lr=1e-2, amsgrad=True), torch.float32),
    ("adamw_amsgrad_clip", rt.AdamW, dict(lr=1e-2, amsgrad=True, max_grad_norm=0.5), torch.float32),
]


def make_params(dtype):
    g = torch.Generator().manual_seed(1)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(dtype)) for s in SHAPES]


def rank_grads(step, rank, dtype, nan=False):
    """Rank `rank`'s gradient of step `step` (replicated mode: every rank uses rank 0's)."""
    g = torch.Generator().manual_seed(1000 + 97 * step + rank)
    out = [torch.randn(*s, generator=g).to(dtype) for s in SHAPES]
    if nan and step == 1 and rank == 0:
        out[0][0, 0] = float("nan")
    return out


def ordered_mean(step, k, dtype, nan=False):
    """(g_0 + ... + g_{k-1}) / k in fp32, left to right; back to the parameter dtype (bf16:
    round to nearest even, as the core's GradCodec does)."""
    per = [rank_grads(step, r, dtype, nan) for r in range(k)]
    out = []
    for i in range(len(SHAPES)):
        acc = per[0][i].float()
        for r in range(1, k):
            acc = acc + per[r][i].float()
        out.append((acc / float(k)).to(dtype))
    return out


def run(cls, kw, dtype, grads_of, steps=STEPS, **dist_kw):
    """`steps` steps; returns every parameter's and state buffer's bits (int views)."""
    ps = make_params(dtype)
    kw = dict(kw)
    groups = [{"params": ps[:2], "lr": 3e-3}, {"params": ps[2:]}] if kw.pop("groups", False) else ps
    opt = cls(groups, threads=1, **kw, **dist_kw)
    advance(opt, ps, grads_of, range(steps))
    return collect(opt, ps), opt


def advance(opt, ps, grads_of, steps):
    for s in steps:
        for p, g in zip(ps, grads_of(s)):
            if g is None:
                p.grad = None
            elif p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
        opt.step()


def collect(opt, ps):
    state = opt.state_dict()["state"]
    out = {"p%d" % i: bits(p.detach()) for i, p in enumerate(ps)}
    for i, st in state.items():
        for key, t in st.items():
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                out["s%d.%s" % (i, key)] = bits(t)
            elif key == "step":
                out["s%d.step" % i] = np.array([float(t)])
    out["fingerprint"] = opt.fingerprint()
    return out


def bits(t):
    t = t.detach().contiguous()
    return (t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)).numpy().copy()


def _init(rank, k, init_file, timeout_s=30):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=k,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _sharded_runs(rank, k, mode, cases, grads_for, **run_kw):
    """Runs each (name, cls, kw, dtype) of `cases` sharded over the group in `mode`, fed
    grads_for(src, name, dtype) (a function of the step; src: rank 0 in replicated mode, where
    every rank gives the same gradients, else this rank); every rank must own a slice. Yields
    (name, result, optimizer)."""
    for name, cls, kw, dtype in cases:
        src = 0 if mode == "replicated" else rank
        res, opt = run(cls, kw, dtype, grads_for(src, name, dtype), process_group=dist.group.WORLD, grad_reduce=mode,
                       **run_kw)
        layout = opt._shared()[0].sharded.layout
        assert len(layout) == k and all(e > b for b, e in layout), layout  # every rank owns a slice
        yield name, res, opt


def _worker_steps(rank, k, init_file, out_dir, mode):
    _init(rank, k, init_file)
    torch.set_num_threads(1)
    results = {}

    def grads_for(src, name, dtype):
        return lambda s: rank_grads(s, src, dtype, name.endswith("_nan"))

    for name, res, opt in _sharded_runs(rank, k, mode, CASES, grads_for):
        if name in ("adamw", "adam_amsgrad"):
            opt.save(os.path.join(out_dir, name + ".ckpt"))  # a collective: the whole state, from rank 0
        if name == "adamw":
            # Memory per rank: the arena holds M and V for this rank's slice only.
            res["arena"] = opt._shared()[0].task.arena_bytes
        results[name] = res
    torch.save(results, os.path.join(out_dir, "rank%d.pt" % rank))
    dist.destroy_process_group()


def spawn(fn, k, tmp_path, *args):
    init_file = str(tmp_path / "init")
    mp.spawn(fn, args=(k, init_file, str(tmp_path)) + args, nprocs=k, join=True)


# fast (torch's all_reduce): no bitwise promise in general, but at K = 2 a sum of two floats is
# the same in either order, so it must equal ordered there.
@pytest.mark.parametrize("k, mode", [(2, "replicated"), (3, "replicated"), (2, "ordered"), (3, "ordered"),
                                     (2, "fast")])
def test_sharded_equals_one_process(tmp_path, k, mode):
    spawn(_worker_steps, k, tmp_path, mode)
    ranks = [_load_own(str(tmp_path / ("rank%d.pt" % r))) for r in range(k)]
    for name, cls, kw, dtype in CASES:
        nan = name.endswith("_nan")
        if mode == "replicated":
            want, opt = run(cls, kw, dtype, lambda s: rank_grads(s, 0, dtype, nan))
        else:
            want, opt = run(cls, kw, dtype, lambda s: ordered_mean(s, k, dtype, nan))
        assert opt._shared()[0].task.skipped_steps == (1 if nan else 0), name  # the reference did skip
        if name in ("adamw", "adam_amsgrad"):
            # The checkpoint is the whole state: an optimizer over a world of one (another K)
            # loads it and holds the reference's bits (amsgrad: max_exp_avg_sq included).
            _init(0, 1, str(tmp_path / ("init1" + name)))
            try:
                one = cls(make_params(dtype), threads=1, process_group=dist.group.WORLD, **kw)
                one.load(str(tmp_path / (name + ".ckpt")))
                assert one.fingerprint() == want["fingerprint"], name
            finally:
                dist.destroy_process_group()
        if name == "adam_amsgrad":
            assert any(key.endswith(".max_exp_avg_sq") for key in want), sorted(want)
        if name == "adamw":
            # Every rank's arena is smaller than one process's by M and V outside its slice
            # (2 families x 4 bytes x the elements other ranks own, up to alignment padding).
            whole = opt._shared()[0].task.arena_bytes
            for r in range(k):
                arena = ranks[r][name].pop("arena")
                print("arena bytes, adamw, K=%d rank %d: %d (one process: %d)" % (k, r, arena, whole))
                assert arena < whole - 8 * (sum(int(np.prod(s)) for s in SHAPES) // k) // 2, (r, arena, whole)
        for r, got in enumerate(ranks):
            got = got[name]
            assert sorted(got) == sorted(want), (name, r)
            for key in want:
                if key == "fingerprint":
                    assert got[key] == want[key], (name, r)
                else:
                    assert np.array_equal(got[key], want[key]), "%s rank %d of %d (%s): %s differs" % (name, r, k, mode, key)


def test_ordered_is_not_the_replicated_mean(tmp_path):
    """The ordered reference differs from rank 0's gradient alone (else the ordered test could
    not tell a missing reduction apart)."""
    a, _ = run(rt.AdamW, dict(lr=1e-2), torch.float32, lambda s: ordered_mean(s, 2, torch.float32))
    b, _ = run(rt.AdamW, dict(lr=1e-2), torch.float32, lambda s: rank_grads(s, 0, torch.float32))
    assert not np.array_equal(a["p0"], b["p0"])


def _error_message(call, errors=(ValueError,)):
    """The message of the error call() raises, or "no error"."""
    try:
        call()
    except errors as e:
        return str(e)
    return "no error"


def _report(out_dir, rank, msg):
    """A wrong-use worker's result: its rank's message into out_dir."""
    with open(os.path.join(out_dir, "rank%d.txt" % rank), "w") as f:
        f.write(msg)


def _report_and_leave(out_dir, rank, msg):
    """_report, then leave the group at once (a rank may still wait in a collective the others
    never joined, so there is no barrier)."""
    _report(out_dir, rank, msg)
    dist.destroy_process_group()


def _worker_mismatch(rank, k, init_file, out_dir):
    _init(rank, k, init_file)
    shapes = SHAPES if rank == 0 else SHAPES[:-1]  # rank 1 has one parameter fewer
    ps = [torch.nn.Parameter(torch.zeros(*s)) for s in shapes]
    before = [p.data_ptr() for p in ps]
    msg = _error_message(lambda: rt.AdamW(ps, process_group=dist.group.WORLD))
    assert all(p.data_ptr() == d and p.grad is None for p, d in zip(ps, before))  # left as they were
    _report_and_leave(out_dir, rank, msg)


def test_ranks_with_other_optimizers_fail_clearly(tmp_path):
    spawn(_worker_mismatch, 2, tmp_path)
    for r in range(2):
        msg = (tmp_path / ("rank%d.txt" % r)).read_text()
        assert "param_groups[0] parameters differs: 5 tensors on cpu" in msg and "4 tensors on cpu" in msg, msg


def _worker_none_on_one_rank(rank, k, init_file, out_dir):
    _init(rank, k, init_file)
    ps = make_params(torch.float32)
    opt = rt.AdamW(ps, process_group=dist.group.WORLD)
    for p, g in zip(ps, rank_grads(0, 0, torch.float32)):
        p.grad = g.clone()
    if rank == 1:
        ps[3].grad = None  # only rank 1 leaves parameter 3 out
    _report(out_dir, rank, _error_message(opt.step))
    # Both ranks got here, so they leave as a finished run does (_finish): a rank that left with
    # its sharded optimizer still alive sometimes aborted at exit (SIGABRT, gloo; seen in a CI
    # run).
    del opt
    _finish()


def test_none_gradient_on_one_rank_fails_clearly(tmp_path):
    spawn(_worker_none_on_one_rank, 2, tmp_path)
    for r in range(2):
        msg = (tmp_path / ("rank%d.txt" % r)).read_text()
        assert "parameter(s) [3] have a gradient on some ranks" in msg, msg


def _worker_not_member(rank, k, init_file, out_dir):
    _init(rank, k, init_file)
    pair = dist.new_group([0, 1])  # a collective of all ranks; rank 2 is not in it
    _report_and_leave(out_dir, rank, _error_message(lambda: rt.AdamW(make_params(torch.float32), process_group=pair)))


def test_rank_outside_the_group_fails_clearly(tmp_path):
    spawn(_worker_not_member, 3, tmp_path)
    assert (tmp_path / "rank0.txt").read_text() == "no error"
    assert (tmp_path / "rank1.txt").read_text() == "no error"
    assert "global rank 2) is not a member" in (tmp_path / "rank2.txt").read_text()


def _worker_missing_group(rank, k, init_file, out_dir):
    _init(rank, k, init_file, timeout_s=3)
    ps = make_params(torch.float32)
    # Rank 1 forgets process_group: it builds a one-process optimizer, and rank 0's handshake
    # waits for it in vain.
    msg = _error_message(lambda: rt.AdamW(ps, process_group=dist.group.WORLD if rank == 0 else None),
                         errors=(RuntimeError,))
    _report_and_leave(out_dir, rank, msg)


def test_rank_without_process_group_fails_clearly(tmp_path):
    spawn(_worker_missing_group, 2, tmp_path)
    msg = (tmp_path / "rank0.txt").read_text()
    assert "handshake failed" in msg and "process_group=" in msg, msg
    assert (tmp_path / "rank1.txt").read_text() == "no error"


def test_bad_arguments():
    ps = make_params(torch.float32)
    with pytest.raises(ValueError, match="grad_reduce='sum'"):
        rt.AdamW(ps, grad_reduce="sum")
    with pytest.raises(ValueError, match="needs a process_group"):
        rt.AdamW(ps, grad_reduce="ordered")
    if not dist.is_initialized():
        with pytest.raises(ValueError, match="not initialized"):
            rt.AdamW(ps, process_group=object())


def _finish():
    # Everything the optimizers held is freed before the group goes (left to the interpreter's
    # exit, a gloo process sometimes aborted), and no rank leaves while another still runs a
    # collective.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def _worker_save_returns_after_the_write(rank, k, init_file, out_dir):
    _init(rank, k, init_file)
    # 12 M elements: rank 0's write of W, M and V (about 150 MB) takes long enough that a rank
    # returning before it ends would look too early.
    ps = [torch.nn.Parameter(torch.full((4, 1 << 20), 0.5)) for _ in range(3)]
    opt = rt.AdamW(ps, lr=1e-2, threads=1, process_group=dist.group.WORLD)
    for p in ps:
        p.grad = torch.full_like(p, 0.25)
    opt.step()
    path = os.path.join(out_dir, "big.ckpt")
    opt.save(path)
    # Right after save() returns, on every rank: the whole checkpoint is there.
    seen = "file there" if os.path.exists(path) else "no file"
    if seen == "file there":
        qs = [torch.nn.Parameter(torch.zeros(4, 1 << 20)) for _ in range(3)]
        try:
            rt.AdamW(qs, lr=1e-2, threads=1).load(path)
            seen += ", loads, weights equal" if all(torch.equal(p, q) for p, q in zip(ps, qs)) else ", other weights"
        except (OSError, RuntimeError, ValueError) as e:
            seen += ", does not load: %s" % e
    # A checkpoint rank 0 cannot write (its folder does not exist): every rank raises.
    bad = _error_message(lambda: opt.save(os.path.join(out_dir, "no-such-folder", "x.ckpt")),
                         errors=(OSError, RuntimeError))
    _report(out_dir, rank, seen + " | " + bad)
    del opt
    _finish()


def test_save_returns_on_every_rank_after_rank_0_wrote(tmp_path):
    spawn(_worker_save_returns_after_the_write, 2, tmp_path)
    for r in range(2):
        seen, bad = (tmp_path / ("rank%d.txt" % r)).read_text().split(" | ")
        assert seen == "file there, loads, weights equal", (r, seen)
        assert bad != "no error" and "x.ckpt" in bad, (r, bad)


MORE = 2  # steps after the checkpoint


def _worker_save_k2(rank, k, init_file, out_dir):
    _init(rank, k, init_file)
    torch.set_num_threads(1)
    ps = make_params(torch.float32)
    opt = rt.AdamW(ps, threads=1, lr=1e-2, weight_decay=0.05, process_group=dist.group.WORLD)
    advance(opt, ps, lambda s: rank_grads(s, 0, torch.float32), range(STEPS))
    opt.save(os.path.join(out_dir, "k2.ckpt"))
    sd = opt.state_dict()  # gathered: every rank holds the whole state
    if rank == 0:
        torch.save({"params": [p.detach().clone() for p in ps], "sd": sd}, os.path.join(out_dir, "k2.pt"))
    del sd, opt
    _finish()


def _worker_continue_k3(rank, k, init_file, out_dir):
    """Continues the K = 2 run at K = 3, from its checkpoint (load) and from its state dict
    (load_state_dict: each rank keeps its slice of the whole buffers)."""
    _init(rank, k, init_file)
    torch.set_num_threads(1)
    saved = _load_own(os.path.join(out_dir, "k2.pt"))
    out = {}
    for how in ("load", "load_state_dict"):
        ps = make_params(torch.float32)
        opt = rt.AdamW(ps, threads=1, lr=1e-2, weight_decay=0.05, process_group=dist.group.WORLD)
        if how == "load":
            opt.load(os.path.join(out_dir, "k2.ckpt"))
        else:
            with torch.no_grad():
                for p, v in zip(ps, saved["params"]):
                    p.copy_(v)
            opt.load_state_dict(saved["sd"])
        advance(opt, ps, lambda s: rank_grads(s, 0, torch.float32), range(STEPS, STEPS + MORE))
        out[how] = collect(opt, ps)
    torch.save(out, os.path.join(out_dir, "k3_rank%d.pt" % rank))
    _finish()


def test_checkpoint_at_k2_continues_at_k3(tmp_path):
    want, _ = run(rt.AdamW, dict(lr=1e-2, weight_decay=0.05), torch.float32,
                  lambda s: rank_grads(s, 0, torch.float32), steps=STEPS + MORE)
    spawn(_worker_save_k2, 2, tmp_path)
    # A fresh file:// rendezvous for K = 3.
    mp.spawn(_worker_continue_k3, args=(3, str(tmp_path / "init3"), str(tmp_path)), nprocs=3, join=True)
    for r in range(3):
        ranks = _load_own(str(tmp_path / ("k3_rank%d.pt" % r)))
        for how, got in ranks.items():
            assert sorted(got) == sorted(want), (how, r)
            for key in want:
                same = got[key] == want[key] if key == "fingerprint" else np.array_equal(got[key], want[key])
                assert same, "K=2 -> K=3 via %s, rank %d: %s differs" % (how, r, key)


# None gradients on alternate steps (every rank alike): step -> the parameters left out.
NONE_AT = {1: (1, 3), 2: (0, 2, 4), 3: (3,)}
NONE_STEPS = 4
# The kinds whose step reads the per-parameter count (Adam's bias corrections), with clipping (a
# masked tensor is left out of the norm), a per-tensor norm (LAMB), bf16 (the model copy).
NONE_CASES = [
    ("adamw", rt.AdamW, dict(lr=1e-2, weight_decay=0.05), torch.float32),
    ("adamw_clip", rt.AdamW, dict(lr=1e-2, max_grad_norm=0.5), torch.float32),
    ("lamb", rt.LAMB, dict(lr=1e-2, max_grad_norm=1.0), torch.float32),
    ("adamw_bf16", rt.AdamW, dict(lr=1e-2), torch.bfloat16),
]


def _with_nones(grads, s):
    return [None if i in NONE_AT.get(s, ()) else g for i, g in enumerate(grads)]


def _worker_nones(rank, k, init_file, out_dir, mode):
    _init(rank, k, init_file)
    torch.set_num_threads(1)
    results = {}

    def grads_for(src, name, dtype):
        return lambda s: _with_nones(rank_grads(s, src, dtype), s)

    for name, res, _ in _sharded_runs(rank, k, mode, NONE_CASES, grads_for, steps=NONE_STEPS):
        results[name] = res
    torch.save(results, os.path.join(out_dir, "rank%d.pt" % rank))
    _finish()


@pytest.mark.parametrize("k, mode", [(2, "replicated"), (3, "ordered")])
def test_none_gradients_on_alternate_steps(tmp_path, k, mode):
    """Parameters every rank leaves out (None) on alternate steps: W, the (sliced) state, each
    parameter's own `step` and the fingerprint equal one process's (which skips them through the
    per-tensor mask), and the `step`s are torch's own optimizer's."""
    spawn(_worker_nones, k, tmp_path, mode)
    ranks = [_load_own(str(tmp_path / ("rank%d.pt" % r))) for r in range(k)]
    for name, cls, kw, dtype in NONE_CASES:
        if mode == "replicated":
            grads = lambda s: _with_nones(rank_grads(s, 0, dtype), s)
        else:
            grads = lambda s: _with_nones(ordered_mean(s, k, dtype), s)
        want, _ = run(cls, kw, dtype, grads, steps=NONE_STEPS)
        for r, got in enumerate(ranks):
            assert sorted(got[name]) == sorted(want), (name, r)
            for key in want:
                same = got[name][key] == want[key] if key == "fingerprint" else np.array_equal(got[name][key], want[key])
                assert same, "%s K=%d %s, rank %d: %s differs" % (name, k, mode, r, key)
    # torch's own AdamW counts each parameter's applied steps.
    ps = make_params(torch.float32)
    ref = torch.optim.AdamW(ps, lr=1e-2)
    for s in range(NONE_STEPS):
        for p, g in zip(ps, _with_nones(rank_grads(s, 0, torch.float32), s)):
            p.grad = None if g is None else g.clone()
        ref.step()
    torch_steps = [float(ref.state[p]["step"]) for p in ps]
    assert torch_steps == [3.0, 3.0, 3.0, 2.0, 3.0]
    for r, got in enumerate(ranks):
        assert [float(got["adamw"]["s%d.step" % i][0]) for i in range(len(ps))] == torch_steps, r
