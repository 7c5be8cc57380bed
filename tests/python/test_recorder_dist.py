"""renaissance.torch.Recorder on an optimizer built with process_group=
(python/renaissance/recorder.py, "Under a torch.distributed process group"): K = 2 gloo processes.

- replicated (fp32 with two param groups, bf16): every rank records, rank 0 writes one case; the
  recording starts after two steps (M and V non-zero, each rank holding half of them), one
  recorded step leaves parameters out (None). The case replays on one process bit for bit and
  its expected_fingerprint is an unrecorded one-process run's; every rank gets that fingerprint.
- ordered (fp32 with clipping, bf16, fp16): the case holds the step's real gradient, the
  rank-order mean, and replays to the one-process run fed (g_0 + g_1) / 2, summed here with torch
  (independently of the Recorder's numpy).
- stochastic rounding with a loss scale (replicated bf16, ordered fp16): the scale torch 2.x's
  GradScaler hands the step (`opt.grad_scale`), gradients scaled by it, is recorded per step and
  the case replays to the one-process run with the same scale and rounding key.
- refusals, on every rank, nothing written: grad_reduce="fast"; replicated ranks whose gradients
  differ; ranks that start from different parameters.
"""
import datetime
import gc
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import renaissance
import renaissance.torch as rt

K = 2
# About 20k elements: each rank's slice of M and V covers parts of several tensors.
SHAPES = [(64, 96), (96,), (32, 8, 3, 3), (300,), (20, 150)]
BEFORE = 2   # steps before the recording starts
STEPS = 3    # recorded steps
NONE_AT = {BEFORE + 1: (1, 3)}  # a recorded step that leaves parameters 1 and 3 out

# name -> (class, keywords, dtype, grad_reduce)
CASES = {
    "replicated_fp32": (rt.AdamW, dict(lr=1e-2, weight_decay=0.05, groups=True), torch.float32, "replicated"),
    "replicated_bf16": (rt.AdamW, dict(lr=1e-2), torch.bfloat16, "replicated"),
    "ordered_fp32": (rt.AdamW, dict(lr=1e-2, max_grad_norm=0.5), torch.float32, "ordered"),
    "ordered_bf16": (rt.Adam, dict(lr=1e-2, weight_decay=1e-3), torch.bfloat16, "ordered"),
    "ordered_fp16": (rt.AdamW, dict(lr=1e-3), torch.float16, "ordered"),
    "replicated_bf16_sr": (rt.AdamW, dict(lr=1e-2, stochastic_rounding=True, seed=5), torch.bfloat16, "replicated"),
    "ordered_fp16_sr": (rt.AdamW, dict(lr=1e-3, stochastic_rounding=True, seed=9), torch.float16, "ordered"),
}
# name -> the loss scale of every step (as torch 2.x's GradScaler sets opt.grad_scale); the
# gradients are scaled by it, so an unscale that is skipped or applied twice changes the result.
LOSS_SCALE = {"replicated_bf16_sr": 64.0, "ordered_fp16_sr": 1024.0}


def make_params(dtype, rank=0):
    g = torch.Generator().manual_seed(1 + 1000 * rank)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(dtype)) for s in SHAPES]


def rank_grads(step, rank, dtype, scale=1.0):
    """Rank `rank`'s gradient of step `step` (times the loss scale), None where NONE_AT leaves a
    parameter out."""
    g = torch.Generator().manual_seed(500 + 31 * step + rank)
    out = [(torch.randn(*s, generator=g) * scale).to(dtype) for s in SHAPES]
    return [None if i in NONE_AT.get(step, ()) else t for i, t in enumerate(out)]


def mean_grads(step, dtype, scale=1.0):
    """(g_0 + g_1) / 2 in fp32, back to the parameter dtype rounded to nearest even (torch's casts)."""
    per = [rank_grads(step, r, dtype, scale) for r in range(K)]
    return [None if a is None else ((a.float() + b.float()) / float(K)).to(dtype) for a, b in zip(*per)]


def build(cls, kw, dtype, rank=0, **dist_kw):
    ps = make_params(dtype, rank)
    kw = dict(kw)
    groups = [{"params": ps[:2], "lr": 3e-3}, {"params": ps[2:]}] if kw.pop("groups", False) else ps
    return ps, cls(groups, threads=1, **kw, **dist_kw)


def advance(opt, ps, grads_of, steps, scale=None):
    for s in steps:
        for p, g in zip(ps, grads_of(s)):
            p.grad = None if g is None else g.clone()
        if scale is not None:  # what torch 2.x's GradScaler.step does around opt.step()
            opt.grad_scale = torch.tensor(scale)
        opt.step()
        if scale is not None:
            del opt.grad_scale


def one_process_fingerprint(name):
    """The unrecorded one-process run of BEFORE + STEPS steps."""
    cls, kw, dtype, mode = CASES[name]
    ps, opt = build(cls, kw, dtype)
    scale = LOSS_SCALE.get(name)
    f = 1.0 if scale is None else scale
    grads = (lambda s: rank_grads(s, 0, dtype, f)) if mode == "replicated" else (lambda s: mean_grads(s, dtype, f))
    advance(opt, ps, grads, range(BEFORE + STEPS), scale)
    return opt.fingerprint()


def written(folder):
    """What a test's processes left in its folder, less the rendezvous file (if gloo kept it)."""
    return sorted(n for n in os.listdir(folder) if n != "init")


def _init(rank, init_file):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=K,
                            timeout=datetime.timedelta(seconds=30))
    torch.set_num_threads(1)


def _finish(out_dir, rank, result):
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    gc.collect()  # the optimizers go before the group does
    dist.barrier()
    dist.destroy_process_group()


def _worker_record(rank, init_file, out_dir):
    _init(rank, init_file)
    result = {}
    for name, (cls, kw, dtype, mode) in CASES.items():
        ps, opt = build(cls, kw, dtype, process_group=dist.group.WORLD, grad_reduce=mode)
        src = (lambda r: 0) if mode == "replicated" else (lambda r: r)
        scale = LOSS_SCALE.get(name)
        grads = lambda s: rank_grads(s, src(rank), dtype, 1.0 if scale is None else scale)
        advance(opt, ps, grads, range(BEFORE), scale)
        with rt.Recorder(opt, os.path.join(out_dir, name), steps=STEPS) as rec:
            advance(opt, ps, grads, range(BEFORE, BEFORE + STEPS + 1), scale)  # the last one is not recorded
        result[name] = rec.fingerprint
    _finish(out_dir, rank, result)


def test_recorded_cases_replay_on_one_process(tmp_path):
    mp.spawn(_worker_record, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=K, join=True)
    ranks = [json.loads((tmp_path / ("rank%d.json" % r)).read_text()) for r in range(K)]
    for name, (_, _, dtype, mode) in CASES.items():
        case = str(tmp_path / name)
        with open(os.path.join(case, "case.json")) as f:
            c = json.load(f)
        want = one_process_fingerprint(name)
        assert c["expected_fingerprint"] == want, name
        assert all(r[name] == want for r in ranks), name  # every rank's Recorder.fingerprint
        assert c["steps"] == STEPS and c["groups"][0].get("initial_step") == BEFORE, name
        names = ["g%d.%d" % (0, i) for i in range(len(SHAPES))] if len(c["groups"]) == 1 else \
            ["g0.0", "g0.1", "g1.0", "g1.1", "g1.2"]
        assert c["no_grad_per_step"] == [[], [names[1], names[3]], []], name
        assert c["loss_scale_per_step"] == [LOSS_SCALE.get(name, 1.0)] * STEPS, name
        if name.endswith("_sr"):
            assert "stochastic" in json.dumps(c), name
        r = renaissance.replay(case, threads=1, tolerance=0.0)
        assert r["fingerprint"] == want, name
        assert r["passed"] is (None if dtype == torch.float32 else True), (name, r["tensors"])
        assert r["steps_skipped"] == 0 and not r["tensor_step_mismatches"], name
    # Only rank 0 wrote: one case per name, no temporary folders left.
    assert written(tmp_path) == sorted(list(CASES) + ["rank0.json", "rank1.json"])


def test_ordered_case_is_not_rank_0s_gradient():
    """The ordered reference differs from a run on rank 0's gradients alone (else the ordered
    case could not tell a recording of rank 0's .grad apart from the mean)."""
    ps, opt = build(rt.AdamW, dict(lr=1e-2, max_grad_norm=0.5), torch.float32)
    advance(opt, ps, lambda s: rank_grads(s, 0, torch.float32), range(BEFORE + STEPS))
    assert opt.fingerprint() != one_process_fingerprint("ordered_fp32")


def _worker_refusals(rank, init_file, out_dir):
    _init(rank, init_file)
    result = {}

    def attempt(key, make, feed=None):
        try:
            rec = make()
            if feed is not None:
                feed()
            result[key] = "no error (fingerprint %s)" % rec.fingerprint
        except (ValueError, FileExistsError) as e:
            result[key] = "%s: %s" % (type(e).__name__, e)

    ps, opt = build(rt.AdamW, dict(lr=1e-2), torch.float32, process_group=dist.group.WORLD, grad_reduce="fast")
    attempt("fast", lambda: rt.Recorder(opt, os.path.join(out_dir, "fast"), steps=2))
    # replicated, but rank 1 feeds its own gradients at the second recorded step.
    ps, opt = build(rt.AdamW, dict(lr=1e-2), torch.float32, process_group=dist.group.WORLD)
    holder = {}
    attempt("differ", lambda: holder.setdefault("rec", rt.Recorder(opt, os.path.join(out_dir, "differ"), steps=2)),
            lambda: advance(opt, ps, lambda s: rank_grads(s, rank if s == 1 else 0, torch.float32), range(2)))
    # Rank 1 starts from other parameters.
    ps, opt = build(rt.AdamW, dict(lr=1e-2), torch.float32, rank, process_group=dist.group.WORLD)
    attempt("params", lambda: rt.Recorder(opt, os.path.join(out_dir, "params"), steps=2))
    # case_dir not empty where rank 0 writes: every rank hears of it.
    os.makedirs(os.path.join(out_dir, "full"), exist_ok=True)
    if rank == 0:
        with open(os.path.join(out_dir, "full", "x"), "w") as f:
            f.write("x")
    dist.barrier()
    ps, opt = build(rt.AdamW, dict(lr=1e-2), torch.float32, process_group=dist.group.WORLD)
    attempt("full", lambda: rt.Recorder(opt, os.path.join(out_dir, "full"), steps=2))
    _finish(out_dir, rank, result)


def test_refusals_on_every_rank_write_nothing(tmp_path):
    mp.spawn(_worker_refusals, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=K, join=True)
    for r in range(K):
        got = json.loads((tmp_path / ("rank%d.json" % r)).read_text())
        assert got["fast"].startswith("ValueError") and "grad_reduce='fast'" in got["fast"] \
            and "'ordered'" in got["fast"], got["fast"]
        assert got["differ"].startswith("ValueError") and "at step 1 the gradients of rank(s) [1] differ" in \
            got["differ"], got["differ"]
        assert got["params"].startswith("ValueError") and "rank(s) [1] differ from rank 0's" in got["params"], \
            got["params"]
        assert got["full"].startswith("FileExistsError") and ("not empty" if r == 0 else "rank 0 refused") in \
            got["full"], got["full"]
    assert written(tmp_path) == ["full", "rank0.json", "rank1.json"]
    assert os.listdir(tmp_path / "full") == ["x"]


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_ordered_mean_as_torch_forms_it(precision, k):
    """The Recorder's rank-order mean (the core's math/rank_reduction.h through _core) equals
    torch's fp32 sum (left to right), division by K and round-to-nearest-even cast, on random encodings incl. subnormals, ties, inf and NaN (K = 3:
    another order or a multiplication by 1/K would differ)."""
    from renaissance.recorder import _ordered_mean
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    g = torch.Generator().manual_seed(7 + k)
    n = 200000
    # Random encodings (every class of value); [0, 4096): subnormals of random sign on every rank;
    # [4096, 4196): rank 1 cancels rank 0, the others add zero (zero results); fp32 from 8192 on:
    # values of one scale.
    width, sign, tiny = (32, -2 ** 31, 2 ** 23) if precision == "fp32" else (16, -2 ** 15, 2 ** 10)
    bits = torch.int32 if precision == "fp32" else torch.int16
    codes = [torch.randint(-2 ** (width - 1), 2 ** (width - 1), (n,), generator=g, dtype=torch.int64) for _ in range(k)]
    for c in codes:
        c[:4096] = torch.randint(0, tiny, (4096,), generator=g) | (torch.randint(0, 2, (4096,), generator=g) * sign)
    if precision == "fp32":
        for c in codes:
            c[8192:] = torch.randn(n - 8192, generator=g).view(torch.int32).to(torch.int64)
    codes[1][4096:4196] = codes[0][4096:4196] ^ sign
    for c in codes[2:]:
        c[4096:4196] = 0
    # [4196, 4296): the largest finite value on every rank (fp32: the sum overflows to inf).
    largest = {"fp32": 0x7F7FFFFF, "bf16": 0x7F7F, "fp16": 0x7BFF}[precision]
    for c in codes:
        c[4196:4296] = largest
    codes = [c.to(bits) for c in codes]
    ranks = [c.view(dtype) for c in codes]
    total = ranks[0].float()
    for r in ranks[1:]:
        total = total + r.float()
    want = (total / float(k)).to(dtype)
    arrays = [c.numpy().view("float32" if precision == "fp32" else "uint16") for c in codes]
    got = torch.from_numpy(_ordered_mean(arrays, precision).view("int32" if precision == "fp32" else "int16"))
    got = got.view(dtype)
    nan = torch.isnan(want.float())  # NaN encodings may differ; any NaN skips the step
    wide = want.float()
    assert int(nan.sum()) > 0 and int((wide == 0).sum()) > 0 and int(torch.isinf(wide).sum()) > 0
    assert int(((wide != 0) & (wide.abs() < (torch.finfo(dtype).tiny))).sum()) > 0  # subnormal results
    assert torch.equal(got[~nan].view(bits), want[~nan].view(bits))
    assert torch.equal(torch.isnan(got.float()), nan)
