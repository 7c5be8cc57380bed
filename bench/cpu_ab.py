#!/usr/bin/env python3
"""Interleaved A/B of the CPU AdamW step against torch's CPU AdamW.

For each layout and thread count it keeps one long-lived AdamW task per variant of the CPU
backend's switches (`bench_cpu_step serve`, each under its RENAISSANCE_CPU_* environment: see
backend_cpu/cpu_ops.h), one with the non-finite check, and torch's AdamW on the same shapes in this
process. Every round visits all of them once, for --steps steps each, forward on even rounds and
backward on odd ones, so slow drifts of a shared host hit every column alike; a short pause
between visits lets the previous side's OpenMP threads stop spinning. The figures are medians of
all steps. The same-traffic kernel (Backend::same_traffic_gbps: reads w, g, m, v and writes w, m, v
in place with trivial arithmetic) runs in the same rounds over two arenas: the default one and the
"old" one (memset by one thread, no huge pages: the placement torch's tensors get).

torch: fused=True where torch has a fused CPU AdamW (2.4 and later); older torch (1.13 on the
development machine) has none, and the script falls back to foreach=True and says so in the table.

Target: the default variant, check off, >= 1.1x torch at 2 and all threads; where
torch already runs above 1/1.1 of the same-traffic limit (so 1.1x would be above the limit), the
target is >= 0.98 of that limit instead. The checked figure is printed beside it.

A compute-only column times the default kernel alone over as many elements as a step, on data
that stays in L1 (bench_cpu_step's `compute`): its share of the step says how close the step is
to being bound by its arithmetic (the IEEE division and square root per element) rather than by
memory.

All unchecked variants run the same steps on the same inputs, so their fingerprints must agree:
the script checks that and exits 1 otherwise (the switches must never change a bit).

    python3 bench/cpu_ab.py --build build                      # the full A/B, <= 4 min on 16 cores
    python3 bench/cpu_ab.py --build build --layouts resnet50 --threads 2 --rounds 3   # a quick check
    # the 2-thread target on a many-core host, about 2 min: see bench/JOURNAL.md
    python3 bench/cpu_ab.py --build build --layouts bert_base,gpt2_small --threads 2 --rounds 15 \
        --variants default,static,avx2,spread
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name -> the environment of that variant (empty: the defaults of backend_cpu/cpu_ops.h).
VARIANTS = {
    "default": {},
    "old": {"RENAISSANCE_CPU_FIRST_TOUCH": "0", "RENAISSANCE_CPU_HUGEPAGES": "0"},
    "memset": {"RENAISSANCE_CPU_FIRST_TOUCH": "0"},
    "no-thp": {"RENAISSANCE_CPU_HUGEPAGES": "0"},
    "chunk4k": {"RENAISSANCE_CPU_CHUNK": "4096"},
    "chunk64k": {"RENAISSANCE_CPU_CHUNK": "65536"},
    "chunk256k": {"RENAISSANCE_CPU_CHUNK": "262144"},   # 1 MiB per stream and block
    "static": {"RENAISSANCE_CPU_SCHEDULE": "static"},    # the default until 2026-12-01
    "no-prefetch": {"RENAISSANCE_CPU_PREFETCH": "0"},        # the default until 2026-12-01
    "prefetch256": {"RENAISSANCE_CPU_PREFETCH": "256"},      # 1 KiB ahead: the default
    "prefetch512": {"RENAISSANCE_CPU_PREFETCH": "512"},      # 2 KiB ahead
    "prefetch": {"RENAISSANCE_CPU_PREFETCH": "1024"},        # one 4 KiB page ahead
    "prefetch-far": {"RENAISSANCE_CPU_PREFETCH": "4096"},    # four pages ahead
    # Diagnosis only (bench_cpu_step's switch, not the backend's): Highway's AVX2 target on a
    # machine with AVX-512, to tell the 512-bit division and square root from the memory traffic.
    "avx2": {"RENAISSANCE_BENCH_NO_AVX512": "1"},
    # Diagnosis only (OpenMP's own variables): each thread pinned to its own core, spread apart,
    # in case the scheduler puts two of ours on one core's hyper-threads (one divider for both).
    "spread": {"OMP_PROC_BIND": "spread", "OMP_PLACES": "cores"},
}
PAUSE_S = 0.02  # between visits: libgomp's idle threads spin about a millisecond before sleeping


class Ours:
    """One `bench_cpu_step serve` process: an AdamW task of one variant."""

    def __init__(self, binary, layout, threads, check, env):
        full_env = dict(os.environ)
        full_env.update(env)
        self.proc = subprocess.Popen([binary, "serve", layout, str(threads), "1" if check else "0"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=full_env, text=True)

    def ready(self):
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"cpu_ab: bench_cpu_step serve exited ({self.proc.wait()})")
        self.info = json.loads(line)
        return self.info

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"cpu_ab: bench_cpu_step serve died on '{command}' ({self.proc.wait()})")
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
        self.proc.wait()


def load_shapes(name):
    with open(os.path.join(ROOT, "data", "layouts", name + ".json")) as f:
        return [tuple(p["shape"]) for p in json.load(f)["params"]]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def mem_available():
    """Bytes of MemAvailable (/proc/meminfo), or 0 where the kernel does not say."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 0


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def siblings():
    """Whether CPU 0 shares its core (hyper-threads): two threads on one core share its divider."""
    try:
        with open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as f:
            return "CPU 0's core runs CPUs " + f.read().strip()
    except OSError:
        return "core siblings unknown"


def bench_hyperparameters(build):
    out = subprocess.run([os.path.join(build, "cli", "renaissance"), "kinds", "--json"], check=True,
                         capture_output=True, text=True).stdout
    b = next(r for r in json.loads(out) if r["name"] == "adamw")["bench"]
    return dict(lr=b["lr"], weight_decay=b["weight_decay"], betas=(b["beta1"], b["beta2"]), eps=b["eps"])


class Torch:
    """torch's AdamW over the layout's shapes, fused where this torch has a fused CPU AdamW."""

    def __init__(self, torch, shapes, hyper, want):
        g = torch.Generator().manual_seed(0)
        self.params = []
        for shape in shapes:
            p = (torch.randn(shape, generator=g) * 0.02).requires_grad_(True)
            p.grad = torch.randn(shape, generator=g) * 1e-3
            self.params.append(p)
        self.impl = None
        for impl in (["fused", "foreach"] if want == "auto" else [want]):
            try:
                self.opt = torch.optim.AdamW(self.params, **hyper, **{impl: True})
                self.opt.step()
                self.impl = impl
                break
            except (RuntimeError, TypeError, ValueError) as e:
                print(f"cpu_ab: torch {torch.__version__} AdamW({impl}=True) on CPU: {type(e).__name__}: {e}",
                      file=sys.stderr)
        if self.impl is None:
            raise SystemExit("cpu_ab: no torch AdamW implementation ran")

    def steps(self, n):
        ms = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.opt.step()
            ms.append((time.perf_counter() - t0) * 1e3)
        return ms


def measure(args, torch, hyper, binary, layout, threads):
    """One (layout, threads) group: returns {column: [ms, ...]} and the servers' ready lines."""
    names = [v for v in args.variants.split(",") if v]
    # Every server holds an arena (W, G, M, V) and torch the same four arrays: refuse to start
    # what would not fit rather than swap or be killed half-way.
    need = (len(names) + (0 if args.no_checked else 1) + 1) * 16 * sum(numel(s) for s in load_shapes(layout))
    avail = mem_available()
    if avail and need > 0.9 * avail:
        raise SystemExit(f"cpu_ab: {layout} needs about {need / 2**30:.1f} GiB for {len(names)} variants and torch, "
                         f"{avail / 2**30:.1f} GiB available: pass fewer --variants or --layouts")
    servers = {v: Ours(binary, layout, threads, False, VARIANTS[v]) for v in names}
    if not args.no_checked:
        servers["default+check"] = Ours(binary, layout, threads, True, {})
    info = {name: s.ready() for name, s in servers.items()}  # built side by side, then timed one at a time
    torch.set_num_threads(threads)
    t = Torch(torch, load_shapes(layout), hyper, args.torch)
    # Columns: every server's step, torch, and the same-traffic kernel on the default and old arenas.
    columns = [(name, lambda s=s: s.ask(f"step {args.steps}")["ms"]) for name, s in servers.items()]
    columns.append(("torch", lambda: t.steps(args.steps)))
    for arena in ("default", "old"):
        if arena in servers:
            columns.append((f"same-traffic({arena})", lambda s=servers[arena]: s.ask(f"same {args.steps}")["ms"]))
    # The default kernel's arithmetic alone (data in L1, as many elements as a step): how much of
    # a step the division and square root would take if memory cost nothing.
    columns.append(("compute-only", lambda s=servers["default"]: s.ask(f"compute {args.steps}")["ms"]))
    times = {name: [] for name, _ in columns}
    for _ in range(1):  # one untimed visit each: first-touch faults, caches, torch's lazy state
        for name, run in columns:
            run()
    for r in range(args.rounds):
        order = columns if r % 2 == 0 else columns[::-1]
        for name, run in order:
            time.sleep(PAUSE_S)
            times[name].extend(run())
    fingerprints = {name: servers[name].ask("fingerprint")["fingerprint"] for name in names}
    for s in servers.values():
        s.close()
    impl = t.impl
    del t
    return times, info, fingerprints, impl


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--layouts", default="resnet50,bert_base,gpt2_small")
    ap.add_argument("--threads", default="2,all", help="comma-separated counts; 'all' is every core")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per visit")
    ap.add_argument("--torch", default="auto", choices=["auto", "fused", "foreach"])
    ap.add_argument("--no-checked", action="store_true", help="leave out the default variant with the check")
    ap.add_argument("--json", help="also write every step time here")
    args = ap.parse_args()
    unknown = [v for v in args.variants.split(",") if v and v not in VARIANTS]
    if unknown or "default" not in args.variants.split(","):
        raise SystemExit(f"cpu_ab: --variants must include default and only name {','.join(VARIANTS)} (got {unknown})")
    import torch  # late: --help works without it

    binary = os.path.join(args.build, "bench", "bench_cpu_step")
    hyper = bench_hyperparameters(args.build)
    cores = os.cpu_count()
    thread_counts = sorted({cores if x == "all" else int(x) for x in args.threads.split(",")})
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip() if os.path.exists(
        "/sys/kernel/mm/transparent_hugepage/enabled") else "unknown"
    numa = len([d for d in os.listdir("/sys/devices/system/node") if d.startswith("node")]) if os.path.isdir(
        "/sys/devices/system/node") else 0
    print(f"cpu_ab: {cpu_model()}, {cores} logical CPUs ({siblings()}), {numa} NUMA node(s), THP {thp}, "
          f"torch {torch.__version__}, {args.rounds} rounds x {args.steps} steps, medians in ms")
    start = time.time()
    failures, verdicts, dump = [], [], []
    for layout in args.layouts.split(","):
        for threads in thread_counts:
            times, info, fps, impl = measure(args, torch, hyper, binary, layout, threads)
            med = {k: statistics.median(v) for k, v in times.items()}
            torch_ms = med["torch"]
            limit_ms = med["same-traffic(default)"]
            bytes_step = info["default"]["bytes_per_step"]
            limit_gbps = info["default"]["same_traffic_bytes"] / limit_ms / 1e6
            torch_share = bytes_step / torch_ms / 1e6 / limit_gbps  # torch moves the same 28 B/param
            print(f"\n{layout}, {threads} threads: torch AdamW({impl}=True) {torch_ms:.3f}, "
                  f"same-traffic {limit_ms:.3f} (default arena, {limit_gbps:.1f} GB/s)"
                  + (f", {med['same-traffic(old)']:.3f} (old arena)" if "same-traffic(old)" in med else "")
                  + f"; torch at {torch_share:.3f} of the limit; the default kernel in L1 (compute only) "
                  f"{med['compute-only']:.3f} ({med['compute-only'] / med['default']:.2f} of its step)")
            print(f"  {'variant':<14} {'ms':>9} {'vs torch':>9} {'of limit':>9}  huge pages  backend")
            for name in info:
                ms = med[name]
                share = info[name]["bytes_per_step"] / ms / 1e6 / limit_gbps  # the check's 4 B/param counted
                print(f"  {name:<14} {ms:9.3f} {torch_ms / ms:8.3f}x {share:9.3f}"
                      f"  {info[name]['anon_huge_kb'] // 1024:6d} MiB  {info[name]['backend']}")
            distinct = set(fps.values())
            if len(distinct) != 1:
                failures.append(f"{layout}/{threads}: the variants' fingerprints differ: {fps}")
            speedup = torch_ms / med["default"]
            ours_share = bytes_step / med["default"] / 1e6 / limit_gbps
            if torch_share * 1.1 > 1.0:
                ok = ours_share >= 0.98
                rule = f"torch above 1/1.1 of the limit, so >= 0.98 of it: {ours_share:.3f}"
            else:
                ok = speedup >= 1.1
                rule = f">= 1.1x torch: {speedup:.3f}x"
            checked = med.get("default+check")
            verdicts.append(f"{layout:<11} {threads:3d} threads: {rule} -> {'met' if ok else 'MISSED'}"
                            + (f" (with the check: {checked:.3f} ms, {torch_ms / checked:.3f}x torch)" if checked else ""))
            others = [n for n in args.variants.split(",") if n and n != "default"]
            if others:  # the other switches against the same torch, to show which would meet it
                verdicts.append("    other variants: " + ", ".join(f"{n} {torch_ms / med[n]:.3f}x" for n in others))
            dump.append({"layout": layout, "threads": threads, "medians_ms": med, "steps_ms": times,
                         "servers": info, "bytes_per_step": bytes_step, "fingerprints": fps})
    print(f"\nTargets (torch {torch.__version__}, AdamW({impl}=True)):")
    for v in verdicts:
        print("  " + v)
    print(f"cpu_ab: {time.time() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dump, f, indent=1)
    for f in failures:
        print("cpu_ab: FAIL: " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
