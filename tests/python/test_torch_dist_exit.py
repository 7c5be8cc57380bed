"""A plain two-rank gloo script (dist_exit_script.py: renaissance.torch AdamW with a process
group, a few steps, never destroy_process_group) exits with status 0, run again and again: a
view of the arena freed on one of gloo's threads while the interpreter exits used to end the
process in std::terminate ("terminate called without an active exception", status 134) in some
runs (docs/distributed.md, torch.distributed)."""
import os
import subprocess
import sys
import time

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_exit_script.py")
RUNS = 20
BUDGET_S = 60.0  # stop starting runs after this long (at least MIN_RUNS run)
MIN_RUNS = 3


def _pair(tmp_path, i, mode):
    init = str(tmp_path / ("init%d" % i))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, SCRIPT, str(r), "2", init, mode], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env=env) for r in range(2)]
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=120)
        out.append((p.returncode, text.decode(errors="replace")))
    return out


def test_no_destroy_process_group_exits_cleanly(tmp_path):
    t0 = time.monotonic()
    done, failures = 0, []
    modes = ["ordered", "replicated"]  # ordered: point-to-point views; replicated: broadcasts only
    while done < RUNS and (done < MIN_RUNS or time.monotonic() - t0 < BUDGET_S):
        for r, (rc, text) in enumerate(_pair(tmp_path, done, modes[done % 2])):
            if rc != 0 or "rank %d done" % r not in text:
                failures.append("run %d rank %d: exit %d: %s" % (done, r, rc, text[-400:]))
        done += 1
    print("%d runs of 2 ranks in %.1f s, %d failures" % (done, time.monotonic() - t0, len(failures)))
    assert not failures, "\n".join(failures)
