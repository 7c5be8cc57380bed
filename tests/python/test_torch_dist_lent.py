"""Every tensor renaissance.torch hands to torch.distributed outlives gloo's reference to it: its
Python object is still alive after the call (held by renaissance._torch_dist), and from
interpreter exit on it is never freed. A gloo worker thread lets go of a finished collective's
tensors a moment after wait() returned; had the Python object gone first, that thread would free
it, taking the GIL, which ends the process in std::terminate ("terminate called without an active
exception") once the interpreter is finalizing: at the exit of a script without
destroy_process_group, or with the optimizer still holding the group at destroy_process_group
(docs/distributed.md, "torch.distributed"). The race itself is timing-bound
(dist_exit_stress.py provokes it); these tests check what prevents it, deterministically.

Each case runs in a fresh process with a one-rank gloo group (every collective still goes through
gloo's worker threads): the calls to torch.distributed are wrapped to keep a weak reference to
every tensor passed, the optimizer is constructed, stepped with each grad_reduce, refuses a step
(the refusal's all_gather_text), saves (save()'s flag all_reduce), and then
- no such tensor's Python object has been freed (a gc.collect() later);
- after the atexit handlers ran and the module's holder is dropped (as finalization clears module
  globals), none is freed either.
The case "many" keeps one optimizer over 80 steps (over 300 collectives): every tensor lent, the
first step's included, must still be alive (a holder of the last N calls' tensors fails it).
test_lent_objects_stay_bounded: what is held does not grow with the number of steps or re-builds.
"""
import os
import subprocess
import sys

import pytest

# What both children run first: record_calls(names, note) wraps these torch.distributed functions
# and batch_isend_irecv so that each call counts in CALLS[0] and hands note(name, tensor) every
# tensor it passes.
_RECORD_CALLS = r'''
CALLS = [0]

def tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors(y)

def record_calls(names, note):
    def wrap(name):
        real = getattr(dist, name)
        def call(*args, **kw):
            CALLS[0] += 1
            for t in tensors(list(args) + [kw.get("gather_list")]):
                note(name, t)
            return real(*args, **kw)
        setattr(dist, name, call)
    for name in names:
        wrap(name)
    real_batch = dist.batch_isend_irecv
    def batch(ops):
        CALLS[0] += 1
        for op in ops:
            note("batch_isend_irecv", op.tensor)
        return real_batch(ops)
    dist.batch_isend_irecv = batch
'''

CHILD = r'''
import atexit, datetime, gc, os, sys, weakref
import torch
import torch.distributed as dist

mode, init, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
seen = []  # (call, weakref) for every tensor handed to torch.distributed
''' + _RECORD_CALLS + r'''
record_calls(("all_reduce", "all_gather", "broadcast", "gather", "barrier"),
             lambda name, t: seen.append((name, weakref.ref(t))))

dist.init_process_group("gloo", init_method="file://" + init, rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
torch.set_num_threads(1)
import renaissance.torch as rt
from renaissance import _torch_dist

def run(grad_reduce):
    g = torch.Generator().manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in [(16, 8), (8,), (5,)]]
    opt = rt.AdamW(ps, lr=1e-2, weight_decay=0.01, max_grad_norm=1.0, process_group=dist.group.WORLD,
                   grad_reduce=grad_reduce, threads=1)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    opt.step()
    opt.save(os.path.join(tmp, "ckpt-" + grad_reduce))
    opt.param_groups[0]["max_grad_norm"] = 2.0  # refused at the next step (on every rank)
    try:
        opt.step()
        raise SystemExit("the step was not refused")
    except ValueError:
        pass

def many(steps):
    """One optimizer kept alive, stepped `steps` times (each step several collectives: the step's
    flags, the ordered reduction's point-to-point blocks, the finite flag, the norm partials'
    and the weights' gathers)."""
    g = torch.Generator().manual_seed(2)
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in [(16, 8), (8,), (5,)]]
    opt = rt.AdamW(ps, lr=1e-2, weight_decay=0.01, max_grad_norm=1.0, process_group=dist.group.WORLD,
                   grad_reduce="ordered", threads=1)
    for _ in range(steps):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return opt

if mode == "many":
    # Far more collectives than a fixed window of recent calls would hold (the earlier holder
    # kept the last 64 calls' tensors): a gloo worker lagging that far behind must still find
    # every tensor it was lent alive.
    keep = many(80)
    assert CALLS[0] > 4 * 64, ncalls
else:
    for grad_reduce in ("replicated", "ordered", "fast"):
        run(grad_reduce)
gc.collect()
calls = sorted(set(n for n, _ in seen))
assert len(seen) >= 20, seen  # the wrapping saw the collectives
dead = sorted(set(n for n, r in seen if r() is None))
print("after the calls: %d tensors (%d calls) in %s; freed: %s" % (len(seen), CALLS[0], calls, dead or "none"))
if mode in ("exit", "many"):
    atexit._run_exitfuncs()
    for name in ("_HELD", "_LENT"):  # what finalization does to a module's globals
        setattr(_torch_dist, name, None)
    keep = None
    gc.collect()
    dead = sorted(set(n for n, r in seen if r() is None))
    print("after exit: freed: %s" % (dead or "none"))
sys.stdout.flush()
os._exit(0)
'''


@pytest.mark.parametrize("mode", ["calls", "exit", "many"])
def test_tensors_handed_to_torch_distributed_outlive_gloo(tmp_path, mode):
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(child), mode, str(tmp_path / "init"), str(tmp_path)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=300)
    out = p.stdout.decode(errors="replace")
    print(out)
    assert p.returncode == 0, out
    assert "after the calls:" in out and "freed: none" in out.split("after the calls:")[1].split("\n")[0], out
    if mode != "calls":
        assert "after exit: freed: none" in out, out


# What the package holds for torch.distributed stays bounded: a training loop lends the same
# objects at every step (the distinct tensors handed to torch.distributed and the holder's count do
# not grow from step 10 to step 210, fingerprints read every step included), and optimizers built
# and dropped again and again (each a new Task, a new arena) leave a count that stops growing.
CHILD_BOUNDED = r'''
import datetime, gc, sys
import torch
import torch.distributed as dist

init = sys.argv[1]
passed = {}  # id -> every distinct tensor handed to torch.distributed (held: ids stay unique)
''' + _RECORD_CALLS + r'''
record_calls(("all_reduce", "all_gather", "broadcast", "gather"), lambda name, t: passed.__setitem__(id(t), t))

dist.init_process_group("gloo", init_method="file://" + init, rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=60))
torch.set_num_threads(1)
import renaissance.torch as rt
from renaissance import _torch_dist

g = torch.Generator().manual_seed(3)

def build(grad_reduce, shapes):
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    return ps, rt.AdamW(ps, lr=1e-2, max_grad_norm=1.0, process_group=dist.group.WORLD, grad_reduce=grad_reduce,
                        threads=1)

def steps(ps, opt, n):
    for _ in range(n):
        for p in ps:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
        opt.fingerprint()

for grad_reduce in ("ordered", "fast", "replicated"):
    passed.clear()
    ps, opt = build(grad_reduce, [(16, 8), (8,), (5,)])
    steps(ps, opt, 10)
    at10 = (len(passed), _torch_dist._LENT.count())
    steps(ps, opt, 200)
    at210 = (len(passed), _torch_dist._LENT.count())
    print("%s: (distinct tensors lent, held) after 10 steps %s, after 210 %s" % (grad_reduce, at10, at210))
    assert at10 == at210, (grad_reduce, at10, at210)
    assert at10[1] >= at10[0] > 0, at10  # what was lent is held
passed.clear()
del ps, opt
counts = []
for i in range(3 * _torch_dist._RETIRED_KEEP):
    ps, opt = build("ordered", [(4 + i, 3), (7,)])  # another layout (another arena) each time
    steps(ps, opt, 2)
    del ps, opt
    gc.collect()
    counts.append(_torch_dist._LENT.count())
print("held after each re-build:", counts)
k = _torch_dist._RETIRED_KEEP
assert len(_torch_dist._LENT.retired) == k, len(_torch_dist._LENT.retired)
assert max(counts[k:]) <= 2 * counts[k], counts  # bounded: no growth with the number of re-builds
assert len(set(counts[-k:])) == 1, counts
print("bounded ok")
'''


def test_lent_objects_stay_bounded(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(CHILD_BOUNDED)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, str(child), str(tmp_path / "init")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env=env, timeout=300)
    out = p.stdout.decode(errors="replace")
    print(out)
    assert p.returncode == 0 and "bounded ok" in out, out
