"""A plain two-rank gloo script (dist_exit_script.py: renaissance.torch AdamW, or MuonWithAuxAdam,
with a process group, a few steps, never destroy_process_group) exits with status 0 in each of 20
runs (4 pairs at a time, under one time limit; MuonWithAuxAdam: 2 runs): a view of the arena
freed on one of gloo's threads while the interpreter exits used to end the process in
std::terminate ("terminate called without an active exception", status 134) in some runs
(docs/distributed.md, torch.distributed)."""
import os
import subprocess
import sys
import time

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_exit_script.py")
RUNS = 20  # pairs of ranks, every one must exit cleanly
MUON_RUNS = 2  # MuonWithAuxAdam (its matrices owned by one rank each): the same exit, fewer runs
PARALLEL = 4  # pairs running at once
TIMEOUT_S = 300.0  # for all of them


def _start(tmp_path, i, mode, cls):
    init = str(tmp_path / ("init%d" % i))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, SCRIPT, str(r), "2", init, mode, cls], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, env=env) for r in range(2)]


@pytest.mark.parametrize("cls, runs", [("adamw", RUNS), ("muon", MUON_RUNS)])
def test_no_destroy_process_group_exits_cleanly(tmp_path, cls, runs):
    t0 = time.monotonic()
    modes = ["ordered", "replicated"]  # ordered: point-to-point views; replicated: broadcasts only
    failures, running, started, done = [], [], 0, 0
    try:
        while started < runs or running:
            assert time.monotonic() - t0 < TIMEOUT_S, "%d of %d runs done in %.0f s" % (done, runs, TIMEOUT_S)
            while started < runs and len(running) < PARALLEL:
                running.append((started, _start(tmp_path, started, modes[started % 2], cls)))
                started += 1
            i, procs = running[0]
            for r, p in enumerate(procs):
                try:
                    text, _ = p.communicate(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - t0)))
                except subprocess.TimeoutExpired:
                    failures.append("run %d rank %d: still running after %.0f s" % (i, r, TIMEOUT_S))
                    continue
                text = text.decode(errors="replace")
                if p.returncode != 0 or "rank %d done" % r not in text:
                    failures.append("run %d rank %d: exit %d: %s" % (i, r, p.returncode, text[-400:]))
            running.pop(0)
            done += 1
            if any("still running" in f for f in failures):
                break
    finally:
        for _, procs in running:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    print("%s: %d runs of 2 ranks (%d at a time) in %.1f s, %d failures" % (cls, done, PARALLEL,
                                                                              time.monotonic() - t0, len(failures)))
    assert not failures, "\n".join(failures)
    assert done == runs
