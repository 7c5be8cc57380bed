#!/usr/bin/env python3
"""Interleaved A/B of bench_step between two builds (a base and a new one), on one backend.

Each round runs every configuration (layout x kind x precision) on both builds, alternating which
goes first, so drifts of a shared machine hit both sides; prints the fastest and the median ms per
step and share_of_limit per (layout, kind, configuration, check, build), the new/base ratio of the
medians, and writes every value to --json (default /tmp/ab_<backend>_<time>.json) after every
round. Beside each ratio, a 95 % bootstrap interval of it (the medians of 2000 resamples of each
build's values, with a fixed seed): how far the host's spread alone could move that ratio. A run
stopped by SIGTERM or SIGINT (a time limit) prints the table of the rounds it finished. On CUDA,
bench_step times with CUDA events. bench/JOURNAL.md has its runs.

    python3 bench/step_ab.py BASE/bench/bench_step NEW/bench/bench_step [options]
    python3 bench/step_ab.py ../base/build/bench/bench_step build/bench/bench_step --rounds 5
    python3 bench/step_ab.py A B --backend cuda --layouts resnet50,gpt2_small \\
        --kinds adamw,sgd_momentum,lars --configs fp32,bf16 --rounds 3
    python3 bench/step_ab.py --from-json ab1.json,ab2.json   # earlier runs' values pooled, no run

Configurations: fp32 (no model copy), bf16 / fp16 (a model copy with model-dtype gradients,
nearest rounding), bf16-sr / fp16-sr (stochastic rounding). The defaults are the CPU A/B rows of
bench/JOURNAL.md: resnet50, 2 threads, adamw, --replays 10, every configuration.

--rows compare: instead of the configurations, our rows of bench/compare_torch.py, run with the
very command lines that script builds (bench_step_commands): on cuda every kind of the table but
muon plus adamw+clip, both timing methods (the "config" column says enqueued or synced), on
resnet50, bert_base and gpt2_small; on cpu adamw and sgd_momentum on resnet50 and gpt2_small at
--threads. The kind table comes from the new build's CLI (NEW/../cli/renaissance); the base needs
only its bench_step.
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch  # noqa: E402  (the compare rows' command lines; imports no torch)

CONFIGS = {"fp32": ("fp32", False), "bf16": ("bf16", False), "fp16": ("fp16", False),
           "bf16-sr": ("bf16", True), "fp16-sr": ("fp16", True)}

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("base", nargs="?")
ap.add_argument("new", nargs="?")
# The older positional form, BASE NEW [ROUNDS] [KINDS] [CONFIGS], as bench/JOURNAL.md quotes it.
ap.add_argument("legacy", nargs="*", metavar="ROUNDS KINDS CONFIGS", help=argparse.SUPPRESS)
ap.add_argument("--backend", choices=["cpu", "cuda"], default="cpu")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--rows", choices=["configs", "compare"], default="configs")
ap.add_argument("--layouts", default=None, help="default: resnet50 (configs), compare_torch.py's (compare)")
ap.add_argument("--kinds", default=None, help="default: adamw (configs), compare_torch.py's (compare)")
ap.add_argument("--configs", default="bf16,fp16,bf16-sr,fp16-sr,fp32")
ap.add_argument("--threads", type=int, default=2, help="CPU threads (cpu backend)")
ap.add_argument("--replays", type=int, default=10)
ap.add_argument("--json", default=None)
ap.add_argument("--from-json", default=None, metavar="FILE[,FILE...]",
                help="no run: the table of the values in these --json files (of one machine), pooled")
args = ap.parse_args()
if args.from_json is None and (args.base is None or args.new is None):
    sys.exit("step_ab: give the base and the new bench_step (or --from-json)")
if len(args.legacy) > 3:
    sys.exit("step_ab: at most ROUNDS KINDS CONFIGS after the two builds")
for name, value in zip(["rounds", "kinds", "configs"], args.legacy):
    setattr(args, name, int(value) if name == "rounds" else value)
unknown = [c for c in args.configs.split(",") if c not in CONFIGS]
if unknown:
    sys.exit(f"step_ab: unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
if args.rounds < 1:
    sys.exit("step_ab: --rounds must be >= 1")
builds = {"base": args.base, "new": args.new}
if args.from_json is not None:
    pass  # nothing runs: report() of the pooled files, at the end
elif args.rows == "compare":
    compare_torch.load_kind_table(os.path.dirname(os.path.dirname(os.path.abspath(args.new))))
    if args.backend == "cuda":
        layouts = args.layouts or "resnet50,bert_base,gpt2_small"
        kinds = args.kinds.split(",") if args.kinds else compare_torch.default_gpu_kinds()
    else:
        layouts = args.layouts or "resnet50,gpt2_small"
        kinds = (args.kinds or "adamw,sgd_momentum").split(",")
    unknown = [k for k in kinds if compare_torch.base_kind(k) not in compare_torch.KIND_TABLE]
    if unknown:
        sys.exit(f"step_ab: unknown kinds {unknown}; the table has {list(compare_torch.KIND_TABLE)}")
else:
    layouts = args.layouts or "resnet50"
    kinds = (args.kinds or "adamw").split(",")
out = args.json or f"/tmp/ab_{args.backend}_{int(time.time())}.json"


class Stopped(Exception):
    pass


def stop(signum, frame):
    raise Stopped(signal.Signals(signum).name)


def bench(cmd):
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"step_ab: {' '.join(cmd)} failed (rc {run.returncode}):\n{run.stderr[-2000:]}")
    if not any(line.startswith("{") for line in run.stdout.splitlines()):
        sys.exit(f"step_ab: {' '.join(cmd)} printed no result row")
    time.sleep(0.1)
    return run.stdout


def check_name(row):
    return "check" if row["check_finite"] else "nocheck"


def run_config(config, b, res):
    """One configuration (all layouts and kinds) on build b."""
    prec, sr = CONFIGS[config]
    cmd = [builds[b], "--backend", args.backend, "--layouts", layouts, "--kinds", ",".join(kinds),
           "--replays", str(args.replays), "--precision", prec]
    if args.backend == "cpu":
        cmd += ["--threads", str(args.threads)]
    if prec != "fp32":
        cmd += ["--grad-dtype", "model"]
    if sr:
        cmd += ["--stochastic-rounding"]
    for line in bench(cmd).splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            key = (d["layout"], d["optimizer"], config, check_name(d), b)
            res.setdefault(key, []).append((d["ms_per_step"], d["share_of_limit"]))


COMPARE_MAX_GRAD_NORM = 1.0  # compare_torch.py's --max-grad-norm default: the +clip rows


def run_compare(layout, b, res):
    """compare_torch.py's rows of one layout on build b."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(builds[b])))
    cuda = args.backend == "cuda"
    for clip, cmd in compare_torch.bench_step_commands(
            build, args.backend, layout, kinds, args.replays, 0 if cuda else args.threads,
            "both" if cuda else "enqueued", COMPARE_MAX_GRAD_NORM):
        cmd[0] = builds[b]  # the path given, which may not be BUILD/bench/bench_step
        for (kind, _), d in compare_torch.bench_step_rows(bench(cmd), clip).items():
            for method, field in (("enqueued", "ms_per_step"), ("synced", "ms_per_step_synced")):
                if d.get(field) is not None and (cuda or method == "enqueued"):
                    key = (layout, kind, method, check_name(d), b)
                    res.setdefault(key, []).append((d[field], d["share_of_limit"]))


def run_round(r, res):
    """One round: every row on both builds, the first build alternating by round."""
    order = list(builds) if r % 2 == 0 else list(reversed(list(builds)))
    if args.rows == "compare":
        for layout in layouts.split(","):
            for b in order:
                run_compare(layout, b, res)
    else:
        for config in args.configs.split(","):
            for b in order:
                run_config(config, b, res)


def save(res):
    with open(out + ".tmp", "w") as f:
        json.dump({" ".join(k): v for k, v in res.items()}, f)
    os.replace(out + ".tmp", out)


BOOTSTRAP_RESAMPLES = 2000


def ratio_interval(new, base):
    """The 2.5th and 97.5th percentiles of median(new*) / median(base*) over resamples (with
    replacement, each build's own count) of the two lists; seeded, so a table reprints the same."""
    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(new, k=len(new))) / statistics.median(rng.choices(base, k=len(base)))
                    for _ in range(BOOTSTRAP_RESAMPLES))
    return ratios[int(0.025 * BOOTSTRAP_RESAMPLES)], ratios[int(0.975 * BOOTSTRAP_RESAMPLES) - 1]


def report(res):
    print(f"{'layout':12} {'kind':13} {'config':8} {'check':8} {'build':5} {'min ms':>8} {'med ms':>8} "
          f"{'med share':>9} {'new/base':>8} {'95% interval':>13}  n")
    ratios = []  # new/base of the medians, one per configuration
    intervals = []  # their bootstrap intervals
    for key in sorted(res):
        ms = [x[0] for x in res[key]]
        sh = [x[1] for x in res[key]]
        ratio = interval = ""
        if key[4] == "new":
            base = res.get(key[:4] + ("base",))
            if base:
                base_ms = [x[0] for x in base]
                ratios.append(statistics.median(ms) / statistics.median(base_ms))
                ratio = f"{ratios[-1]:8.3f}"
                intervals.append(ratio_interval(ms, base_ms))
                interval = "%.3f-%.3f" % intervals[-1]
        print(f"{key[0]:12} {key[1]:13} {key[2]:8} {key[3]:8} {key[4]:5} {min(ms):8.3f} "
              f"{statistics.median(ms):8.3f} {statistics.median(sh):9.3f} {ratio:>8} {interval:>13}  {len(ms)}")
    # The last lines, for scripts (gpu.sh's ab phase): the spread of the new/base ratios and the
    # outer ends of their intervals.
    if ratios:
        print(f"new/base median ratios: max {max(ratios):.3f}, min {min(ratios):.3f} over {len(ratios)} rows")
        print(f"new/base 95% intervals: highest upper end {max(hi for _, hi in intervals):.3f}, "
              f"lowest lower end {min(lo for lo, _ in intervals):.3f}")


if args.from_json is not None:
    pooled = {}
    for path in args.from_json.split(","):
        with open(path) as f:
            for key, values in json.load(f).items():
                pooled.setdefault(tuple(key.split(" ")), []).extend(tuple(v) for v in values)
    report(pooled)
    sys.exit(0)

signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
done = {}  # the values of the finished rounds only: a cut round would weigh one build more
finished = 0
try:
    for r in range(args.rounds):
        this = {k: list(v) for k, v in done.items()}
        run_round(r, this)
        done, finished = this, r + 1
        save(done)
        print(f"round {r + 1} done {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
except Stopped as e:
    print(f"step_ab: stopped by {e} during round {finished + 1}; the table holds the {finished} finished "
          f"round(s)", flush=True)
    if not done:
        sys.exit(1)
    report(done)
    print(f"step_ab: every value in {out}", file=sys.stderr)
    sys.exit(1)
report(done)
print(f"step_ab: every value in {out}", file=sys.stderr)
