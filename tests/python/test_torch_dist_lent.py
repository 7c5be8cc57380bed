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
"""
import os
import subprocess
import sys

import pytest

CHILD = r'''
import atexit, datetime, gc, os, sys, weakref
import torch
import torch.distributed as dist

mode, init, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
seen = []  # (call, weakref) for every tensor handed to torch.distributed
ncalls = [0]

def tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from tensors(y)

def wrap(name):
    real = getattr(dist, name)
    def call(*args, **kw):
        ncalls[0] += 1
        for t in tensors(list(args) + [kw.get("gather_list")]):
            seen.append((name, weakref.ref(t)))
        return real(*args, **kw)
    setattr(dist, name, call)

for name in ("all_reduce", "all_gather", "broadcast", "gather", "barrier"):
    wrap(name)
real_batch = dist.batch_isend_irecv
def batch(ops):
    ncalls[0] += 1
    for op in ops:
        seen.append(("batch_isend_irecv", weakref.ref(op.tensor)))
    return real_batch(ops)
dist.batch_isend_irecv = batch

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

for grad_reduce in ("replicated", "ordered", "fast"):
    run(grad_reduce)
gc.collect()
calls = sorted(set(n for n, _ in seen))
assert len(seen) >= 20, seen  # the wrapping saw the collectives
# At most the last _KEEP calls are held: this script makes fewer, so all of its tensors must be.
assert ncalls[0] <= _torch_dist._KEEP, ncalls
dead = sorted(set(n for n, r in seen if r() is None))
print("after the calls: %d tensors (%d calls) in %s; freed: %s" % (len(seen), ncalls[0], calls, dead or "none"))
if mode == "exit":
    atexit._run_exitfuncs()
    _torch_dist._HELD = None  # what finalization does to a module's globals
    gc.collect()
    dead = sorted(set(n for n, r in seen if r() is None))
    print("after exit: freed: %s" % (dead or "none"))
sys.stdout.flush()
os._exit(0)
'''


@pytest.mark.parametrize("mode", ["calls", "exit"])
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
    if mode == "exit":
        assert "after exit: freed: none" in out, out
