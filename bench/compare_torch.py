#!/usr/bin/env python3
"""Side-by-side optimizer step timings: torch.optim against Renaissance, in one run.

GPU: for each layout and kind, torch's for-loop, foreach, fused and fused + capturable under a
CUDA graph (timm's Lars for LARS), each timed with CUDA events per step (median of --replays),
against `bench_step --backend cuda` (CUDA events around each graph replay). CPU: torch's paths
at equal thread counts (2 and all cores) against `bench_step --backend cpu --threads N`, plus
the same-traffic streaming kernel of `bench_cpu_step`. Writes bench/RESULTS.md (absolute
times, ratios to each torch path and to the bandwidth floor, date, device, versions) and a PNG.

usage: compare_torch.py --build BUILD_DIR [--layouts resnet50,bert_base,gpt2_small]
                        [--replays 100] [--out bench/RESULTS.md] [--plot bench/results.png]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

torch = None  # imported in main(): re-rendering from --from-json needs no torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The kinds and the benchmark hyperparameters come from the library's kind table
# (`renaissance kinds --json`, its "bench" column), the same values the C++ benchmarks use.
KIND_TABLE = {}


def load_kind_table(build):
    out = subprocess.run([os.path.join(build, "cli", "renaissance"), "kinds", "--json"], check=True,
                         capture_output=True, text=True).stdout
    for row in json.loads(out):
        KIND_TABLE[row["name"]] = row


def torch_hyperparameters(kind):
    """torch.optim / timm keyword arguments equal to the kind's "bench" row."""
    row, b = KIND_TABLE[kind], KIND_TABLE[kind]["bench"]
    h = dict(lr=b["lr"], weight_decay=b["weight_decay"])
    if row["family"] in ("sgd", "lars"):
        h["momentum"] = b["momentum"]
        if kind.endswith("nesterov"):
            h["nesterov"] = True
    if row["family"] == "adam":
        h.update(betas=(b["beta1"], b["beta2"]), eps=b["eps"])
    if row["family"] == "lars":
        h.update(trust_coeff=b["trust_coefficient"], eps=b["eps"])
    if h.get("momentum") == 0.0:
        del h["momentum"]
    return h


def load_layout(name):
    path = os.path.join(ROOT, "data", "layouts", name + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return [tuple(p["shape"]) for p in json.load(f)["params"]]
    raise SystemExit(f"compare_torch: layout {name} not found")


def make_optimizer(kind, params, impl):
    h = torch_hyperparameters(kind)
    if kind.startswith("lars"):
        import timm.optim  # timm's Lars: a per-tensor Python loop, its only implementation
        return timm.optim.Lars(params, **h)
    flags = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True),
             "fused+graph": dict(fused=True)}[impl]
    if impl == "fused+graph" and kind in ("adam", "adamw"):
        flags["capturable"] = True
    if kind.startswith("sgd"):
        return torch.optim.SGD(params, **h, **flags)
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return cls(params, **h, **flags)


def torch_impls(kind):
    return ["for-loop"] if kind.startswith("lars") else ["for-loop", "foreach", "fused", "fused+graph"]


def time_torch_gpu(shapes, kind, impl, replays):
    g = torch.Generator(device="cuda").manual_seed(0)
    params = [torch.randn(s, device="cuda", generator=g) * 0.02 for s in shapes]
    for p in params:
        p.requires_grad_(True)
        p.grad = torch.randn(p.shape, device="cuda", generator=g) * 1e-3
    opt = make_optimizer(kind, params, impl)
    step = opt.step
    if impl == "fused+graph":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            opt.step()
        step = graph.replay
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del opt, params
    torch.cuda.empty_cache()
    return statistics.median(times)


def time_torch_cpu(shapes, kind, impl, threads, replays):
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=g) * 0.02 for s in shapes]
    for p in params:
        p.requires_grad_(True)
        p.grad = torch.randn(p.shape, generator=g) * 1e-3
    opt = make_optimizer(kind, params, impl)
    for _ in range(2):
        opt.step()
    times = []
    for _ in range(replays):
        t0 = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_bench_step(build, backend, layout, kinds, replays, threads=0):
    cmd = [os.path.join(build, "bench", "bench_step"), "--backend", backend, "--layouts", layout,
           "--kinds", ",".join(kinds), "--replays", str(replays), "--check", "both", "--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def run_same_traffic(build):
    cmd = [os.path.join(build, "bench", "bench_cpu_step"), "--benchmark_format=json",
           "--benchmark_filter=^(Step|StepChecked)/adamw/resnet50/[12]/|^SameTraffic/resnet50/[12]/",
           "--benchmark_repetitions=5", "--benchmark_report_aggregates_only=true",
           "--benchmark_enable_random_interleaving=true"]
    data = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return {b["run_name"]: b["real_time"] for b in data["benchmarks"] if b.get("aggregate_name") == "median"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=None)
    ap.add_argument("--layouts", default="resnet50,bert_base,gpt2_small")
    ap.add_argument("--kinds", default=None, help="comma-separated kinds (default: every kind of the table)")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--cpu-replays", type=int, default=10)
    ap.add_argument("--cpu-kinds", default="adamw,sgd_momentum")
    ap.add_argument("--cpu-layouts", default="resnet50,gpt2_small")
    ap.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--plot", default=os.path.join(HERE, "results.png"))
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--from-json", default=None, help="re-render RESULTS.md and the plot from a saved --json-out")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        write_markdown(results, args.out)
        write_plot(results, args.plot)
        return
    global torch
    import torch as torch_module
    torch = torch_module
    if not args.build:
        ap.error("--build is required unless --from-json is given")
    load_kind_table(args.build)
    layouts = args.layouts.split(",")
    kinds = args.kinds.split(",") if args.kinds else list(KIND_TABLE)
    results = {"gpu": [], "cpu": [], "meta": {}}
    meta = results["meta"]
    meta["date"] = datetime.date.today().isoformat()
    meta["torch"] = torch.__version__
    meta["cuda"] = torch.version.cuda
    meta["cpu"] = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            meta["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    meta["cores"] = os.cpu_count()

    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name(0)
        for layout in layouts:
            shapes = load_layout(layout)
            ours = {(r["optimizer"], r["check_finite"]): r for r in run_bench_step(args.build, "cuda", layout, kinds, args.replays)}
            for kind in kinds:
                row = {"layout": layout, "kind": kind, "ours": ours[(kind, False)]["ms_per_step"],
                       "ours_checked": ours[(kind, True)]["ms_per_step"], "floor": ours[(kind, False)]["floor_ms"],
                       "copy_gbps": ours[(kind, False)]["copy_gb_per_s"], "launches": ours[(kind, False)]["launches_per_step"],
                       "torch": {}}
                for impl in torch_impls(kind):
                    try:
                        row["torch"][impl] = time_torch_gpu(shapes, kind, impl, args.replays)
                    except Exception as e:  # a path torch does not offer for this kind
                        row["torch"][impl] = None
                        print(f"torch {impl} {kind}: {type(e).__name__}: {e}", file=sys.stderr)
                results["gpu"].append(row)
                print(json.dumps(row), flush=True)

    all_cores = os.cpu_count()
    for threads in sorted({2, all_cores}):
        for layout in args.cpu_layouts.split(","):
            shapes = load_layout(layout)
            cpu_kinds = args.cpu_kinds.split(",")
            ours = {(r["optimizer"], r["check_finite"]): r
                    for r in run_bench_step(args.build, "cpu", layout, cpu_kinds, args.cpu_replays, threads)}
            for kind in cpu_kinds:
                row = {"layout": layout, "kind": kind, "threads": threads, "ours": ours[(kind, False)]["ms_per_step"],
                       "ours_checked": ours[(kind, True)]["ms_per_step"], "torch": {}}
                for impl in ["for-loop", "foreach", "fused"] if not kind.startswith("lars") else ["for-loop"]:
                    try:
                        row["torch"][impl] = time_torch_cpu(shapes, kind, impl, threads, args.cpu_replays)
                    except Exception as e:
                        row["torch"][impl] = None
                        print(f"torch cpu {impl} {kind}: {type(e).__name__}: {e}", file=sys.stderr)
                results["cpu"].append(row)
                print(json.dumps(row), flush=True)
    results["same_traffic"] = run_same_traffic(args.build)

    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)
    write_markdown(results, args.out)
    write_plot(results, args.plot)


MANUAL_MARKER = "<!-- Below: measurements not made by compare_torch.py; kept when it rewrites this file. -->"


def fmt(x):
    return "n/a" if x is None else f"{x:.3f}"


def ratio(a, b):
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"


def write_markdown(results, path):
    m = results["meta"]
    lines = ["<!-- Generated by bench/compare_torch.py; edit the script, not this table. -->", "",
             "## Renaissance vs torch.optim, measured side by side in one run", "",
             f"Date {m['date']}; GPU {m.get('gpu', 'none')}; CPU {m['cpu']} ({m['cores']} cores); "
             f"torch {m['torch']} (CUDA {m['cuda']}). Times are medians in ms per step.", ""]
    if results["gpu"]:
        lines += ["### GPU (CUDA events; ours = one CUDA graph per step)", "",
                  "| layout | kind | ours | ours + NaN check | launches | torch for-loop | foreach | fused | fused+graph | "
                  "speed-up vs best torch | floor | % of floor |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["gpu"]:
            t = r["torch"]
            best = min([v for v in t.values() if v is not None], default=None)
            lines.append(f"| {r['layout']} | {r['kind']} | {fmt(r['ours'])} | {fmt(r['ours_checked'])} | {r['launches']} | "
                         f"{fmt(t.get('for-loop'))} | {fmt(t.get('foreach'))} | {fmt(t.get('fused'))} | "
                         f"{fmt(t.get('fused+graph'))} | {ratio(best, r['ours'])} | {fmt(r['floor'])} | "
                         f"{100 * r['floor'] / r['ours']:.0f}% |")
        lines += ["", f"Floor = ideal bytes per parameter (docs/design.md) / device copy bandwidth measured in the same run "
                      f"({results['gpu'][0]['copy_gbps']:.0f} GB/s).", ""]
    if results["cpu"]:
        lines += ["### CPU (steady clock; equal thread counts)", "",
                  "| layout | kind | threads | ours | ours + NaN check | torch for-loop | foreach | fused | speed-up vs fused |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in results["cpu"]:
            t = r["torch"]
            lines.append(f"| {r['layout']} | {r['kind']} | {r['threads']} | {fmt(r['ours'])} | {fmt(r['ours_checked'])} | "
                         f"{fmt(t.get('for-loop'))} | {fmt(t.get('foreach'))} | {fmt(t.get('fused'))} | "
                         f"{ratio(t.get('fused'), r['ours'])} |")
        st = results.get("same_traffic", {})
        if st:
            lines += ["", "AdamW on resnet50 against the same-traffic streaming kernel (reads w, g, m, v and writes w, m, v "
                      "with trivial arithmetic: the memory-system limit of this access pattern), bench_cpu_step, "
                      "median of 5 repetitions:", "",
                      "| threads | AdamW step | AdamW + NaN check | same-traffic kernel | AdamW throughput / same-traffic |",
                      "|---|---|---|---|---|"]
            for t in (1, 2):
                # Names of runs from before the bench suite covered every kind are accepted too.
                a = st.get(f"Step/adamw/resnet50/{t}/real_time", st.get(f"BM_AdamWStep/resnet50/{t}/real_time"))
                c = st.get(f"StepChecked/adamw/resnet50/{t}/real_time", st.get(f"BM_AdamWStep/resnet50_checked/{t}/real_time"))
                k = st.get(f"SameTraffic/resnet50/{t}/real_time", st.get(f"BM_SameTraffic/resnet50/{t}/real_time"))
                if a and k:
                    lines.append(f"| {t} | {a:.2f} ms | {fmt(c)} ms | {k:.2f} ms | {100 * k / a:.0f}% |")
            lines.append("")
    # Keep the hand-maintained part (measurements this script does not make) below the marker.
    manual = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        if MANUAL_MARKER in old:
            manual = old[old.index(MANUAL_MARKER):]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n" + (("\n" + manual) if manual else ""))


def write_plot(results, path):
    try:
        import matplotlib
    except ImportError:
        print("compare_torch: matplotlib is not installed; no plot written", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("GPU", [r for r in results["gpu"] if r["kind"] in ("adamw", "sgd_momentum", "lars")]),
              ("CPU", results["cpu"])]
    panels = [(name, rows) for name, rows in panels if rows]
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 4.5 * len(panels)))
    axes = axes if len(panels) > 1 else [axes]
    for ax, (name, rows) in zip(axes, panels):
        labels = [f"{r['layout']}\n{r['kind']}" + (f"\n{r['threads']} thr" if "threads" in r else "") for r in rows]
        series = ["ours"] + sorted({k for r in rows for k in r["torch"]})
        width = 0.8 / len(series)
        for i, s in enumerate(series):
            vals = [r["ours"] if s == "ours" else (r["torch"].get(s) or 0) for r in rows]
            ax.bar([j + i * width for j in range(len(rows))], vals, width, label="renaissance" if s == "ours" else f"torch {s}")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("ms per step (log)")
        ax.set_title(f"{name}: optimizer step time, {results['meta']['date']}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
