"""Muon and MuonWithAuxAdam over a torch.distributed process group (docs/distributed.md,
"torch.distributed"): K = 2 and 3 CPU processes on gloo, spawned with torch.multiprocessing.

Each matrix has one owner rank, which orthogonalises it and holds its momentum whole (rule M);
the aux AdamW groups' state is sliced by elements. Checked against one process:
- replicated (every rank the same gradient): parameters, every state_dict tensor and the
  fingerprint bit for bit after several steps, on every rank;
- ordered (each rank its own gradient): one process fed (g_0 + ... + g_{K-1}) / K, summed left
  to right in fp32 here;
- MuonWithAuxAdam's two param groups share one Task as in one process: max_grad_norm clips them
  by one norm over both, and a NaN in an aux gradient skips the step for both groups;
- state_dict() on every rank, loaded with load_state_dict into a new optimizer over the group
  (each matrix's momentum back on its owner), gives the same state_dict and, after more steps,
  the one process's bits; save() and load() over the group give the same state too, and a
  one-process optimizer loads that checkpoint;
- the core's layout spreads the matrices over the ranks, with a rank that owns none at K = 3;
- a Muon hyperparameter that differs between ranks is refused on every rank, naming it.
"""
import datetime
import gc
import json
import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import renaissance.torch as rt

# The sharded step cuts the families on grad-norm tiles of 16384 elements, then moves a cut that
# falls inside a matrix to the matrix's nearer end: these sizes make the cuts land between the
# matrices. Muon: two matrices of 2 and 1.5 tiles; K = 2 gives each rank one, K = 3 none to one
# rank. MuonWithAuxAdam: a Muon group of three matrices (a conv weight among them, viewed as
# (64, 72)) and an aux AdamW group of 1-D parameters, both groups in one Task: the Muon group's
# matrices are one run of work items (16384 elements each from the run's start), and a cut
# moves to a point that splits no item and no matrix, so the first matrix is one item long (the
# second one starts on an item: K = 2 and 3 put a cut there).
MUON_SHAPES = [(256, 128), (128, 192)]
AUX_MUON_SHAPES = [(128, 128), (64, 8, 3, 3), (96, 256)]
AUX_ADAM_SHAPES = [(20000,), (300,), (128,)]
STEPS = 3
MORE = 2  # steps after the state_dict round trip
# MuonWithAuxAdam: clipping, and a NaN in an aux gradient at step NAN_STEP (every rank's, so
# that the ordered mean holds it too): one process skips the step for both groups.
AUX_MAX_GRAD_NORM = 1.0
NAN_STEP = 1


def shapes_of(name):
    return MUON_SHAPES if name == "muon" else AUX_MUON_SHAPES + AUX_ADAM_SHAPES


def make_params(name):
    g = torch.Generator().manual_seed(3)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes_of(name)]


def build(name, ps, **dist_kw):
    if name == "muon":
        return rt.Muon(ps, lr=0.02, weight_decay=0.1, momentum=0.9, threads=1, **dist_kw)
    n = len(AUX_MUON_SHAPES)
    # max_grad_norm clips both groups by one norm over both (their one Task), far below the
    # gradients' norm so that it acts.
    return rt.MuonWithAuxAdam([dict(params=ps[:n], use_muon=True, lr=0.02, weight_decay=0.01),
                               dict(params=ps[n:], use_muon=False, lr=3e-3, weight_decay=0.01)],
                              max_grad_norm=AUX_MAX_GRAD_NORM, threads=1, **dist_kw)


NAMES = ("muon", "aux")


def rank_grads(name, step, rank):
    g = torch.Generator().manual_seed(500 + 31 * step + rank)
    grads = [torch.randn(*s, generator=g) for s in shapes_of(name)]
    if name == "aux" and step == NAN_STEP:
        grads[len(AUX_MUON_SHAPES) + 1][7] = float("nan")
    return grads


def ordered_mean(name, step, k):
    """(g_0 + ... + g_{k-1}) / k in fp32, summed left to right."""
    per = [rank_grads(name, step, r) for r in range(k)]
    out = []
    for i in range(len(per[0])):
        acc = per[0][i].clone()
        for r in range(1, k):
            acc = acc + per[r][i]
        out.append(acc / float(k))
    return out


def advance(opt, ps, grads_of, steps):
    for s in steps:
        for p, g in zip(ps, grads_of(s)):
            p.grad = g.clone()
        opt.step()


def bits(t):
    return t.detach().contiguous().view(torch.int32).numpy().copy()


def collect(opt, ps):
    """Every parameter's bits, every state_dict tensor's bits, the steps and the fingerprint."""
    out = {"p%d" % i: bits(p) for i, p in enumerate(ps)}
    for i, st in opt.state_dict()["state"].items():
        for key, t in st.items():
            out["s%d.%s" % (i, key)] = bits(t) if t.dim() > 0 else np.array([float(t)])
    out["fingerprint"] = opt.fingerprint()
    return out


def one_process(name, grads_of, steps):
    ps = make_params(name)
    opt = build(name, ps)
    advance(opt, ps, grads_of, range(steps))
    return collect(opt, ps)


def _init(rank, k, init_file, timeout_s=30):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=k,
                            timeout=datetime.timedelta(seconds=timeout_s))
    torch.set_num_threads(1)


def _finish():
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def _worker(rank, k, init_file, out_dir, mode):
    _init(rank, k, init_file)
    group = dict(process_group=dist.group.WORLD, grad_reduce=mode)
    src = 0 if mode == "replicated" else rank
    results = {}
    for name in NAMES:
        ps = make_params(name)
        opt = build(name, ps, **group)
        grads_of = lambda s: rank_grads(name, s, src)  # noqa: E731
        advance(opt, ps, grads_of, range(STEPS))
        res = {"stepped": collect(opt, ps),
               "tasks": len(opt._shared()),
               # The core's partition of each Task: each rank's matrices.
               "owned": [list(s.sharded.muon_matrices) for s in opt._shared()]}
        # The round trip: this rank's state_dict (the matrices' momentum gathered from their
        # owners) into a new optimizer over the group, at the parameters the steps left.
        sd = opt.state_dict()
        ps2 = [torch.nn.Parameter(p.detach().clone()) for p in ps]
        opt2 = build(name, ps2, **group)
        opt2.load_state_dict(sd)
        res["loaded"] = collect(opt2, ps2)
        advance(opt2, ps2, grads_of, range(STEPS, STEPS + MORE))
        res["continued"] = collect(opt2, ps2)
        # save() (a collective: the whole state, written by rank 0), then load() into a new
        # optimizer over the group from the initial parameters.
        ckpt = os.path.join(out_dir, "%s.ckpt" % name)
        opt.save(ckpt)
        dist.barrier()  # rank 0 has written it
        ps3 = make_params(name)
        opt3 = build(name, ps3, **group)
        opt3.load(ckpt)
        res["from_checkpoint"] = collect(opt3, ps3)
        results[name] = res
        del opt, opt2, opt3, sd
    torch.save(results, os.path.join(out_dir, "rank%d.pt" % rank))
    _finish()


def _same(got, want, what):
    assert sorted(got) == sorted(want), (what, sorted(got), sorted(want))
    for key in want:
        same = got[key] == want[key] if key == "fingerprint" else np.array_equal(got[key], want[key])
        assert same, "%s: %s differs" % (what, key)


@pytest.mark.parametrize("k, mode", [(2, "replicated"), (3, "replicated"), (3, "ordered")])
def test_sharded_muon_equals_one_process(tmp_path, k, mode):
    mp.spawn(_worker, args=(k, str(tmp_path / "init"), str(tmp_path), mode), nprocs=k, join=True)
    ranks = [torch.load(str(tmp_path / ("rank%d.pt" % r)), weights_only=False) for r in range(k)]
    for name in NAMES:
        if mode == "replicated":
            grads_of = lambda s: rank_grads(name, s, 0)  # noqa: E731
        else:
            grads_of = lambda s: ordered_mean(name, s, k)  # noqa: E731
        want = one_process(name, grads_of, STEPS)
        want_more = one_process(name, grads_of, STEPS + MORE)
        # Every state_dict tensor of the reference is there (the matrices' momentum_buffer, the
        # aux group's exp_avg and exp_avg_sq), so the comparison covers the owner-held state.
        keys = {key.split(".", 1)[1] for key in want if key.startswith("s")}
        assert keys == ({"momentum_buffer", "step"} if name == "muon" else
                        {"momentum_buffer", "exp_avg", "exp_avg_sq", "step"}), keys
        for r, got in enumerate(ranks):
            got = got[name]
            tag = "%s K=%d %s rank %d" % (name, k, mode, r)
            _same(got["stepped"], want, tag)
            _same(got["loaded"], want, tag + " after load_state_dict")
            _same(got["continued"], want_more, tag + " continued after load_state_dict")
            _same(got["from_checkpoint"], want, tag + " after save and load")
            assert got["owned"] == ranks[0][name]["owned"], tag  # one partition on every rank
            assert got["tasks"] == 1, (tag, got["tasks"])  # the groups share one Task, as in one process
        # The checkpoint is the one-process state: a one-process optimizer loads it (its param
        # groups share Tasks as the group's do: MuonWithAuxAdam's two groups one Task, one file).
        ps = make_params(name)
        one = build(name, ps)
        one.load(str(tmp_path / ("%s.ckpt" % name)))
        _same(collect(one, ps), want, "%s K=%d %s checkpoint loaded by one process" % (name, k, mode))
        # The matrices (each optimizer's one Task) are spread over the ranks; Muon's two matrices
        # leave one of three ranks without any.
        owned = ranks[0][name]["owned"][0]
        print("%s K=%d: each rank's matrices %s" % (name, k, owned))
        counts = [e - b for b, e in owned]
        assert sum(counts) == len(MUON_SHAPES if name == "muon" else AUX_MUON_SHAPES), owned
        assert sum(1 for c in counts if c > 0) >= 2, owned
        if name == "muon" and k == 3:
            assert 0 in counts, owned


def test_references_differ():
    """The references the test compares with differ from each other and from the start (else a
    step that did nothing, or ignored the other ranks' gradients, would pass)."""
    for name in NAMES:
        a = one_process(name, lambda s: rank_grads(name, s, 0), STEPS)
        b = one_process(name, lambda s: ordered_mean(name, s, 3), STEPS)
        for i in range(len(shapes_of(name))):
            assert not np.array_equal(a["p%d" % i], b["p%d" % i]), (name, i)
            assert not np.array_equal(a["p%d" % i], bits(make_params(name)[i])), (name, i)


def _ctor(name, rank, **per_rank):
    """The optimizer built with keywords that differ on rank 1 (per_rank[key] = (rank0, rank1))."""
    kw = {key: v[rank] for key, v in per_rank.items()}
    ps = make_params(name)
    if name == "muon":
        return lambda: rt.Muon(ps, threads=1, process_group=dist.group.WORLD, **kw)
    n = len(AUX_MUON_SHAPES)
    aux = dict(params=ps[n:], use_muon=False, weight_decay=kw.pop("aux_weight_decay", 0.0))
    return lambda: rt.MuonWithAuxAdam([dict(params=ps[:n], use_muon=True), aux], threads=1,
                                      process_group=dist.group.WORLD, **kw)


def _momentum_edit_on_rank1(rank):
    """A Muon stepped once on both ranks, then its momentum edited on rank 1 only: -> the next step."""
    ps = make_params("muon")
    opt = rt.Muon(ps, threads=1, process_group=dist.group.WORLD)
    advance(opt, ps, lambda s: rank_grads("muon", s, 0), range(1))
    if rank == 1:
        opt.param_groups[0]["momentum"] = 0.8
    for p, g in zip(ps, rank_grads("muon", 1, 0)):
        p.grad = g
    return opt.step


# (the call that must raise on every rank, what every rank's message must hold)
MISMATCHES = [
    (lambda r: _ctor("muon", r, ns_steps=(5, 6)), "param_groups[0]['ns_steps'] differs: 5 on rank 0; 6 on rank 1"),
    (lambda r: _ctor("muon", r, momentum=(0.95, 0.9)),
     "param_groups[0]['momentum'] differs: 0.95 on rank 0; 0.9 on rank 1"),
    (lambda r: _ctor("muon", r, eps=(1e-7, 1e-6)), "param_groups[0]['eps'] differs: 1e-07 on rank 0; 1e-06 on rank 1"),
    (lambda r: _ctor("muon", r, ns_coefficients=((3.4445, -4.775, 2.0315), (3.0, -4.775, 2.0315))),
     "param_groups[0]['ns_coefficients'][0] differs: 3.4445 on rank 0; 3.0 on rank 1"),
    (lambda r: _ctor("muon", r, adjust_lr_fn=(None, "match_rms_adamw")),
     "param_groups[0]['adjust_lr_fn'] differs: 'original' on rank 0; 'match_rms_adamw' on rank 1"),
    (lambda r: _ctor("muon", r, muon_mode=("exact", "fast")),
     "param_groups[0]['muon_mode'] differs: 'exact' on rank 0; 'fast' on rank 1"),
    (lambda r: _ctor("aux", r, aux_weight_decay=(0.0, 0.01)),
     "param_groups[1]['weight_decay'] differs: 0.0 on rank 0; 0.01 on rank 1"),
    (lambda r: _ctor("aux", r, muon_mode=("exact", "fast")), "['muon_mode'] differs: 'exact' on rank 0; 'fast' on rank 1"),
    (_momentum_edit_on_rank1, "param_groups[0]['momentum'] differs: 0.95 on rank 0; 0.8 on rank 1"),
]


def _worker_mismatch(rank, k, init_file, out_dir):
    _init(rank, k, init_file)
    msgs = []
    for make, _ in MISMATCHES:
        call = None
        try:
            call = make(rank)
            call()
            msgs.append("no error")
        except Exception as e:  # noqa: BLE001 -- the test reads whatever came out
            msgs.append("%s: %s" % (type(e).__name__, e))
        del call
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(msgs, f)
    # adjust_lr_fn None and "original" are one adjustment: ranks that spell it differently run.
    ps = make_params("muon")
    opt = rt.Muon(ps, threads=1, adjust_lr_fn=(None, "original")[rank], process_group=dist.group.WORLD)
    advance(opt, ps, lambda s: rank_grads("muon", s, 0), range(1))
    torch.save([p.detach().clone() for p in ps], os.path.join(out_dir, "rank%d.pt" % rank))
    del opt
    _finish()


def test_muon_mismatch_refused_on_every_rank(tmp_path):
    mp.spawn(_worker_mismatch, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for r in range(2):
        msgs = json.loads((tmp_path / ("rank%d.json" % r)).read_text())
        for (_, want), msg in zip(MISMATCHES, msgs):
            assert msg.startswith("ValueError") and want in msg, (r, want, msg)
    a, b = (torch.load(str(tmp_path / ("rank%d.pt" % r))) for r in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and not torch.equal(a[0], make_params("muon")[0])
