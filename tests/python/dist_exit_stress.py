"""Stress driver (not a pytest file) for the exit of two-rank gloo jobs: many pairs of processes,
several at a time, beside busy loops, each process ending in one of the SCENARIOS; counts the
processes that do not exit with status 0 and prints a backtrace of each abort (a core file read
by gdb, and the Python stacks faulthandler writes). A process that ends at interpreter exit in
std::terminate prints "terminate called without an active exception" and dies of SIGABRT.

Usage: python dist_exit_stress.py [--scenario NAME] [--pairs N] [--parallel P] [--busy B]
                                  [--nice-gloo] [--seconds S] [--out DIR]
  --nice-gloo  lowers the priority of the threads torch.distributed starts (nice 19), so that a
               gloo worker thread is slower to let go of a finished collective (a wider window).
One process of a pair: python dist_exit_stress.py --rank R --init FILE --scenario NAME
"""
import argparse
import datetime
import faulthandler
import gc
import glob
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _threads():
    return set(os.listdir("/proc/self/task"))


def _nice_new_threads(before):
    for tid in _threads() - before:
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), 19)
        except OSError:
            pass


def _init(rank, init_file, nice):
    import torch
    import torch.distributed as dist
    before = _threads()
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    if nice:
        _nice_new_threads(before)
    torch.set_num_threads(1)
    return torch, dist


def _params(torch):
    g = torch.Generator().manual_seed(1)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in [(64, 32), (32,), (50,)]]


def _grads(torch, ps, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


KEEP = []  # what a scenario keeps alive until interpreter exit


def refusal_destroy_with_opt(rank, torch, dist):
    """test_torch_dist_agree's param_groups_max_grad_norm_edit as it was when a rank aborted in a
    CI run: rank 1 refuses a step (max_grad_norm edited), rank 0 hears of it; both raise; the
    optimizer is still alive at destroy_process_group."""
    import renaissance.torch as rt
    ps = _params(torch)
    opt = rt.AdamW(ps, lr=1e-2, weight_decay=0.01, process_group=dist.group.WORLD, threads=1)
    for s in range(2):
        _grads(torch, ps, s)
        opt.step()
    if rank == 1:
        opt.param_groups[0]["max_grad_norm"] = 1.0
    _grads(torch, ps, 2)
    try:
        opt.step()
        raise SystemExit("rank %d: the step was not refused" % rank)
    except ValueError:
        pass
    KEEP.append(opt)
    gc.collect()
    dist.destroy_process_group()


def train_no_destroy(rank, torch, dist, mode="ordered"):
    """dist_exit_script.py: a few steps, never destroy_process_group."""
    import renaissance.torch as rt
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = rt.AdamW(model.parameters(), lr=1e-3, max_grad_norm=1.0, threads=1, process_group=dist.group.WORLD,
                   grad_reduce=mode)
    g = torch.Generator().manual_seed(rank)
    for _ in range(3):
        loss = model(torch.randn(32, 64, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    KEEP.append(opt)


def save_no_destroy(rank, torch, dist, tmp):
    """A step, then save() (its last collective: an all_reduce of a flag tensor), never
    destroy_process_group."""
    import renaissance.torch as rt
    ps = _params(torch)
    opt = rt.AdamW(ps, lr=1e-2, process_group=dist.group.WORLD, threads=1)
    _grads(torch, ps, 0)
    opt.step()
    opt.save(os.path.join(tmp, "ckpt"))
    KEEP.append(opt)


def torch_only_no_destroy(rank, torch, dist):
    """No renaissance at all: torch's own collectives on tensors that the caller drops, then the
    interpreter exits without destroy_process_group."""
    def once(i):
        t = torch.full((8,), float(rank + i))
        dist.all_reduce(t)
        out = [torch.empty(8) for _ in range(2)]
        dist.all_gather(out, t)
        return float(out[1][0])
    for i in range(3):
        once(i)


SCENARIOS = {
    "refusal_destroy_with_opt": refusal_destroy_with_opt,
    "train_no_destroy": train_no_destroy,
    "save_no_destroy": save_no_destroy,
    "torch_only_no_destroy": torch_only_no_destroy,
}


def worker(args):
    faulthandler.enable(all_threads=True)
    torch, dist = _init(args.rank, args.init, args.nice_gloo)
    fn = SCENARIOS[args.scenario]
    if fn is save_no_destroy:
        fn(args.rank, torch, dist, os.path.dirname(args.init))
    else:
        fn(args.rank, torch, dist)
    mod = sys.modules.get("renaissance")
    print("rank %d done (renaissance: %s)" % (args.rank, mod.__file__ if mod else "not imported"), flush=True)


def _backtrace(core, python):
    try:
        bt = subprocess.run(["gdb", "-batch", "-nx", "-ex", "thread apply all bt 30", python, core],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300).stdout.decode(errors="replace")
    except Exception as e:  # noqa: BLE001
        bt = "gdb failed: %s" % e
    keep = []
    for block in bt.split("\nThread ")[1:]:  # the threads that are not just waiting
        if "terminate" in block or "abort" in block or "pthread_exit" in block or "take_gil" in block:
            keep.append("Thread " + block)
    return "\n".join(keep) if keep else bt[-6000:]


def driver(args):
    os.makedirs(args.out, exist_ok=True)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    t0 = time.monotonic()
    started = done = 0
    running = []  # (run dir, [procs])
    failures = []
    used = []  # where the first good run's renaissance came from
    try:
        while done < args.pairs and time.monotonic() - t0 < args.seconds or running:
            while (len(running) < args.parallel and started < args.pairs and time.monotonic() - t0 < args.seconds):
                d = os.path.join(args.out, "run%05d" % started)
                os.makedirs(d)
                procs = []
                for r in range(2):
                    rd = os.path.join(d, "rank%d" % r)
                    os.makedirs(rd)
                    cmd = [sys.executable, os.path.abspath(__file__), "--rank", str(r), "--init",
                           os.path.join(d, "init"), "--scenario", args.scenario]
                    if args.nice_gloo:
                        cmd.append("--nice-gloo")
                    log = open(os.path.join(rd, "log"), "wb")
                    procs.append((subprocess.Popen(cmd, cwd=rd, stdout=log, stderr=subprocess.STDOUT,
                                                   env=dict(os.environ, OMP_NUM_THREADS="1")), log, rd))
                running.append((d, procs))
                started += 1
            time.sleep(0.05)
            for item in list(running):
                d, procs = item
                if any(p.poll() is None for p, _, _ in procs):
                    continue
                running.remove(item)
                done += 1
                bad = False
                for r, (p, log, rd) in enumerate(procs):
                    log.close()
                    text = open(os.path.join(rd, "log"), errors="replace").read()
                    if p.returncode != 0 or "rank %d done" % r not in text:
                        bad = True
                        cores = glob.glob(os.path.join(rd, "core*"))
                        bt = _backtrace(cores[0], sys.executable) if cores else "(no core file)"
                        failures.append("%s rank %d: exit %d\n%s\n%s" % (d, r, p.returncode, text[-3000:], bt))
                        print(failures[-1], flush=True)
                        for c in cores:
                            os.remove(c)
                if not bad:
                    if not used:
                        text = open(os.path.join(procs[0][2], "log"), errors="replace").read()
                        used.append(text.split("(renaissance: ")[-1].split(")")[0] if "(renaissance: " in text else "?")
                    shutil.rmtree(d, ignore_errors=True)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    print("scenario %s: %d pairs (%d processes) in %.0f s, %d parallel, %d busy loops%s: %d failed processes "
          "(renaissance: %s)" % (args.scenario, done, 2 * done, time.monotonic() - t0, args.parallel, args.busy,
                                 ", gloo threads at nice 19" if args.nice_gloo else "", len(failures),
                                 used[0] if used else "-"), flush=True)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="refusal_destroy_with_opt", choices=sorted(SCENARIOS))
    ap.add_argument("--rank", type=int)
    ap.add_argument("--init")
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--nice-gloo", action="store_true")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--out", default="/tmp/dist_exit_stress")
    args = ap.parse_args()
    if args.rank is not None:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
