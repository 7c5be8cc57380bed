"""renaissance.torch under a gloo process group (K = 2 CPU processes): ranks whose optimizers are
configured differently are refused on every rank within seconds, with one message naming the
first option that differs and the ranks (docs/distributed.md, "The same configuration on every
rank"). At construction (the handshake compares the whole configuration) and at a step after a
hyperparameter changed on one rank only (a scheduler, a param_groups edit: the digest rides in
the step's one collective). A rank that refuses a step itself makes the others raise instead of
waiting for it. Guard: a scheduler stepping on every rank runs, every rank with the same bits.
"""
import datetime
import gc
import json
import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import renaissance.torch as rt

SHAPES = [(64, 32), (32,), (16, 8, 3, 3), (50,)]
# Far above the 10 s a refusal may take: a rank left waiting in a collective shows up as a
# timeout error after this many seconds (a hang), not as a refusal.
GLOO_TIMEOUT_S = 40
LIMIT_S = 10.0


def _params(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(dtype)) for s in SHAPES]


def _grads(ps, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g).to(p.dtype)


def _group():
    return dict(process_group=dist.group.WORLD, threads=1)


def _ctor(rank, **per_rank):
    """The optimizer built with keywords that differ on rank 1 (per_rank[name] = (rank0, rank1))."""
    kw = {k: v[rank] for k, v in per_rank.items()}
    cls = kw.pop("cls", rt.AdamW)
    dtype = kw.pop("dtype", torch.float32)
    return lambda: cls(_params(dtype), **kw, **_group())


def _after_steps(rank, change, steps=2):
    """An AdamW (and a StepLR) stepped `steps` times on both ranks, then change(rank, opt, sched):
    -> the next step()."""
    ps = _params()
    opt = rt.AdamW(ps, lr=1e-2, weight_decay=0.01, **_group())
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for s in range(steps):
        _grads(ps, s)
        opt.step()
    change(rank, opt, sched)
    _grads(ps, steps)
    return lambda: opt.step()  # holds opt (the scheduler's step counter holds it weakly)


def _sched_on_rank1(rank, opt, sched):
    if rank == 1:
        sched.step()


def _edit(key, value):
    def change(rank, opt, sched):
        if rank == 1:
            opt.param_groups[0][key] = value
    return change


def _amp_skip_on_rank1(rank, opt, sched):
    # What torch 2.x's GradScaler.step sets before it calls step(): found_inf nonzero on rank 1
    # only (gradients unscaled before their all-reduce, or no all-reduce at all).
    opt.grad_scale = torch.ones(())
    opt.found_inf = torch.full((), float(rank == 1))


# name -> (make the call that must raise on this rank, what every rank's message must hold)
CASES = {
    "lr": (lambda r: _ctor(r, lr=(1e-3, 2e-3)), "param_groups[0]['lr'] differs: 0.001 on rank 0; 0.002 on rank 1"),
    "weight_decay": (lambda r: _ctor(r, weight_decay=(0.01, 0.02)),
                     "param_groups[0]['weight_decay'] differs: 0.01 on rank 0; 0.02 on rank 1"),
    "max_grad_norm": (lambda r: _ctor(r, max_grad_norm=(None, 1.0)),
                      "param_groups[0]['max_grad_norm'] differs: None on rank 0; 1.0 on rank 1"),
    "betas": (lambda r: _ctor(r, betas=((0.9, 0.999), (0.8, 0.999))),
              "param_groups[0]['betas'][0] differs: 0.9 on rank 0; 0.8 on rank 1"),
    "class": (lambda r: _ctor(r, cls=(rt.AdamW, rt.Adam)), "class differs: AdamW on rank 0; Adam on rank 1"),
    "precision": (lambda r: _ctor(r, dtype=(torch.float32, torch.bfloat16)),
                  "param_groups[0] dtype differs: float32 on rank 0; bfloat16 on rank 1"),
    "stochastic_rounding": (lambda r: _ctor(r, dtype=(torch.bfloat16, torch.bfloat16),
                                            stochastic_rounding=(False, True)),
                            "stochastic_rounding differs: False on rank 0; True on rank 1"),
    "seed": (lambda r: _ctor(r, dtype=(torch.bfloat16, torch.bfloat16), stochastic_rounding=(True, True),
                             seed=(0, 7)), "seed differs: 0 on rank 0; 7 on rank 1"),
    "scheduler_on_one_rank": (lambda r: _after_steps(r, _sched_on_rank1),
                              "param_groups[0]['lr'] differs: 0.01 on rank 0; 0.005 on rank 1"),
    "param_groups_lr_edit": (lambda r: _after_steps(r, _edit("lr", 0.5)),
                             "param_groups[0]['lr'] differs: 0.01 on rank 0; 0.5 on rank 1"),
    "param_groups_weight_decay_edit": (lambda r: _after_steps(r, _edit("weight_decay", 0.3)),
                                       "param_groups[0]['weight_decay'] differs: 0.01 on rank 0; 0.3 on rank 1"),
    "amp_skip_on_rank1": (lambda r: _after_steps(r, _amp_skip_on_rank1),
                          "the GradScaler skips this step on rank 1 of the process group only"),
    # Refused by rank 1 itself (clipping cannot change after construction): rank 0 must not wait.
    "param_groups_max_grad_norm_edit": (lambda r: _after_steps(r, _edit("max_grad_norm", 1.0)),
                                        "cannot change max_grad_norm after construction"),
}


def _worker(rank, k, init_file, out_dir, case):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=k,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    torch.set_num_threads(1)
    msg = "no error"
    t0 = None
    call = None
    try:
        call = CASES[case][0](rank)
        t0 = time.monotonic()
        call()
    except Exception as e:  # noqa: BLE001 -- the test reads whatever came out
        msg = "%s: %s" % (type(e).__name__, e)
    took = time.monotonic() - t0 if t0 is not None else -1.0
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump({"msg": msg, "seconds": took}, f)
    # The optimizer (held by `call`) goes before its process group, as in a script that ends its
    # training loop before destroy_process_group (exiting without it: test_torch_dist_exit.py).
    del call
    gc.collect()
    dist.destroy_process_group()


@pytest.mark.parametrize("case", sorted(CASES))
def test_mismatch_refused_on_every_rank(tmp_path, case):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path), case), nprocs=2, join=True)
    want = CASES[case][1]
    for r in range(2):
        got = json.loads((tmp_path / ("rank%d.json" % r)).read_text())
        print("%s rank %d (%.2f s): %s" % (case, r, got["seconds"], got["msg"]))
        assert want in got["msg"], (r, got)
        assert got["msg"].startswith("ValueError"), (r, got)
        assert 0 <= got["seconds"] < LIMIT_S, (r, got)
    if case == "param_groups_max_grad_norm_edit":
        assert "rank 1 of the process group refused this step" in json.loads((tmp_path / "rank0.json").read_text())["msg"]


def _worker_same(rank, k, init_file, out_dir):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=k,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    torch.set_num_threads(1)
    ps = _params()
    # threads may differ between ranks (the bits do not depend on it).
    opt = rt.AdamW(ps, lr=1e-2, weight_decay=0.01, process_group=dist.group.WORLD, threads=1 + rank)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for s in range(4):
        _grads(ps, s)
        opt.step()
        sched.step()
        opt.param_groups[0]["weight_decay"] = 0.01 * (s + 2)  # an edit made on every rank
    torch.save([p.detach().clone() for p in ps], os.path.join(out_dir, "rank%d.pt" % rank))
    del opt, sched
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def test_same_changes_on_every_rank_run(tmp_path):
    mp.spawn(_worker_same, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    a, b = (torch.load(str(tmp_path / ("rank%d.pt" % r))) for r in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], _params()[0])  # it did step


def _worker_amp_skip_everywhere(rank, k, init_file, out_dir):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=k,
                            timeout=datetime.timedelta(seconds=GLOO_TIMEOUT_S))
    torch.set_num_threads(1)
    ps = _params()
    opt = rt.AdamW(ps, lr=1e-2, weight_decay=0.01, process_group=dist.group.WORLD, threads=1)
    _grads(ps, 0)
    opt.step()
    before = [p.detach().clone() for p in ps]
    opt.grad_scale, opt.found_inf = torch.ones(()), torch.ones(())  # skipped on every rank
    _grads(ps, 1)
    opt.step()
    skipped_same = all(torch.equal(p, b) for p, b in zip(ps, before))
    opt.found_inf = torch.zeros(())  # then a step that runs everywhere
    _grads(ps, 2)
    opt.step()
    torch.save({"skipped_same": skipped_same, "after": [p.detach().clone() for p in ps]},
               os.path.join(out_dir, "rank%d.pt" % rank))
    del opt
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def test_amp_skip_on_every_rank_skips(tmp_path):
    """A GradScaler skip on every rank is a skip (nothing changes, no error); the next step runs
    on every rank with the same bits."""
    mp.spawn(_worker_amp_skip_everywhere, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    a, b = (torch.load(str(tmp_path / ("rank%d.pt" % r))) for r in range(2))
    assert a["skipped_same"] and b["skipped_same"]
    assert all(torch.equal(x, y) for x, y in zip(a["after"], b["after"]))
