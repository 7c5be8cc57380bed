"""renaissance.torch: step() holds a per-optimizer lock, so threads stepping one optimizer take
turns instead of running two core steps over one arena at once."""
import threading
import time

import torch

import renaissance.torch as rt


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in ((64, 32), (64,), (16, 64))]


def _fixed_grads(ps):
    g = torch.Generator().manual_seed(5)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


def test_two_threads_never_step_at_once():
    """Each core step is watched: a second one starting while one runs is what the lock stops
    (the watch sleeps inside the step, which lets the other thread run)."""
    ps = _params()
    opt = rt.AdamW(ps, lr=1e-3)
    _fixed_grads(ps)
    shared = opt._shared()[0]
    inner = shared.run_step
    state = {"running": 0, "most": 0}
    guard = threading.Lock()

    def watched():
        with guard:
            state["running"] += 1
            state["most"] = max(state["most"], state["running"])
        time.sleep(0.01)
        inner()
        with guard:
            state["running"] -= 1

    shared.run_step = watched
    threads = [threading.Thread(target=lambda: [opt.step() for _ in range(10)]) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state["most"] == 1
    assert float(opt.state_dict()["state"][0]["step"]) == 20


def test_two_threads_give_the_bits_of_one():
    """Constant gradients and lr: 2 x 25 steps from two threads are 50 steps of one thread."""
    ps, qs = _params(), _params()
    a, b = rt.AdamW(ps, lr=1e-3, weight_decay=0.1), rt.AdamW(qs, lr=1e-3, weight_decay=0.1)
    _fixed_grads(ps)
    _fixed_grads(qs)
    threads = [threading.Thread(target=lambda: [a.step() for _ in range(25)]) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(50):
        b.step()
    assert a.fingerprint() == b.fingerprint()
