#!/usr/bin/env python3
"""Interleaved A/B of bench_step's CPU mixed-precision rows between two builds.

Each round runs every configuration (resnet50, 2 threads, --replays 10, bf16/fp16 copies with
model-dtype gradients, nearest and stochastic, and fp32 as a control) on both builds, alternating
which goes first, so drifts of a shared machine hit both sides; prints the fastest and the median
ms per step and share_of_limit per (kind, configuration, check, build) and writes every value to
/tmp/ab_<kinds>_<time>.json. bench/RESULTS.md has its runs.

    python3 bench/step_ab.py BASE/bench/bench_step NEW/bench/bench_step [ROUNDS] [KINDS] [CONFIGS]
    python3 bench/step_ab.py ../base/build/bench/bench_step build/bench/bench_step 5 adamw
    python3 bench/step_ab.py A B 3 sgd_momentum,lion,adam bf16,fp16-sr
"""
import json, subprocess, sys, statistics, time
builds = {"base": sys.argv[1], "new": sys.argv[2]}
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
kinds = sys.argv[4] if len(sys.argv) > 4 else "adamw"
configs = [("bf16", False), ("fp16", False), ("bf16", True), ("fp16", True), ("fp32", False)]
if len(sys.argv) > 5: configs = [c for c in configs if f"{c[0]}{'-sr' if c[1] else ''}" in sys.argv[5].split(",")]
res = {}
for r in range(rounds):
    order = list(builds) if r % 2 == 0 else list(reversed(list(builds)))
    for (prec, sr) in configs:
        for b in order:
            cmd = [builds[b], "--backend", "cpu", "--threads", "2", "--layouts", "resnet50", "--kinds", kinds,
                   "--replays", "10", "--precision", prec] + (["--grad-dtype", "model"] if prec != "fp32" else []) + (["--stochastic-rounding"] if sr else [])
            out = subprocess.run(cmd, capture_output=True, text=True).stdout
            for line in out.splitlines():
                if not line.startswith("{"): continue
                d = json.loads(line)
                key = (d["optimizer"], prec + ("-sr" if sr else ""), "check" if d["check_finite"] else "nocheck", b)
                res.setdefault(key, []).append((d["ms_per_step"], d["share_of_limit"]))
            time.sleep(0.1)
    print(f"round {r+1} done {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
print(f"{'kind':6} {'config':8} {'check':8} {'build':5} {'min ms':>8} {'med ms':>8} {'max share':>9} {'med share':>9}  n")
for key in sorted(res):
    ms = [x[0] for x in res[key]]; sh = [x[1] for x in res[key]]
    print(f"{key[0]:6} {key[1]:8} {key[2]:8} {key[3]:5} {min(ms):8.2f} {statistics.median(ms):8.2f} {max(sh):9.3f} {statistics.median(sh):9.3f}  {len(ms)}")
json.dump({" ".join(k): v for k, v in res.items()}, open(f"/tmp/ab_{kinds}_{int(time.time())}.json", "w"))
