#!/usr/bin/env python3
"""Side-by-side optimizer step timings: torch against Renaissance, in one run, timed the same way.

GPU, both sides timed by two methods (issue #17):
  enqueued  N steps launched back to back, CUDA events around each step, one synchronisation at
            the end: the device's time per step (the headline);
  synced    one step at a time, a synchronisation after each: what a loop with host work sees
            (host launch latency included).
Ours is `bench_step --backend cuda --timing both` (one CUDA graph per step). The headline is the
default mode, the non-finite check on, against torch's equivalent where torch has one: the
GradScaler way for fused optimizers (torch._amp_foreach_non_finite_check_and_unscale_ into a
found_inf tensor, then the fused step given grad_scale and found_inf), captured in a CUDA graph;
the unchecked figures are the extra columns, against torch's for-loop, foreach, fused and fused
captured in a CUDA graph. LARS: torch has none, timm's is a per-tensor Python loop with other
semantics, so the torch side is bench/torch_lars.py (torch._foreach_norm + foreach updates with
this library's LARS semantics, uncaptured and captured). SGD: torch.optim.SGD decays the L2 way,
so our SGD rows run with weight_decay_mode l2. Floor = ideal bytes / the same-traffic limit that
bench_step measures over the task's own arena (Backend::same_traffic_gbps).

CPU: torch's paths at equal thread counts (2 and all cores) against `bench_step --backend cpu`
(both methods are one there: the CPU step is synchronous).

usage: compare_torch.py --build BUILD_DIR [--layouts resnet50,bert_base,gpt2_small] [--replays 100]
                        [--json-out FILE] [--out bench/RESULTS.md] [--plot bench/results.png]
       compare_torch.py --from-json FILE [--out ...] [--plot ...]   (re-render, no torch needed)
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
METHODS = ("enqueued", "synced")
# The kinds and the benchmark hyperparameters come from the library's kind table
# (`renaissance kinds --json`, its "bench" column), the same values the C++ benchmarks use.
KIND_TABLE = {}


def load_kind_table(build):
    out = subprocess.run([os.path.join(build, "cli", "renaissance"), "kinds", "--json"], check=True,
                         capture_output=True, text=True).stdout
    for row in json.loads(out):
        KIND_TABLE[row["name"]] = row


def family(kind):
    return KIND_TABLE[kind]["family"]


def torch_hyperparameters(kind):
    """torch.optim keyword arguments equal to the kind's "bench" row."""
    b = KIND_TABLE[kind]["bench"]
    h = dict(lr=b["lr"], weight_decay=b["weight_decay"])
    if family(kind) == "sgd":
        if KIND_TABLE[kind]["state"]["m"]:
            h["momentum"] = b["momentum"]
        if kind.endswith("nesterov"):
            h["nesterov"] = True
    if family(kind) == "adam":
        h.update(betas=(b["beta1"], b["beta2"]), eps=b["eps"])
    return h


def load_layout(name):
    """(shapes, is_weight_group) per tensor, from data/layouts/<name>.json."""
    path = os.path.join(ROOT, "data", "layouts", name + ".json")
    if not os.path.exists(path):
        raise SystemExit(f"compare_torch: layout {name} not found")
    with open(path) as f:
        params = json.load(f)["params"]
    return [(tuple(p["shape"]), p.get("role", "deep_conv") in ("fc_weight", "first_conv", "deep_conv")) for p in params]


def make_params(layout, device, generator):
    params = []
    for shape, _ in layout:
        p = (torch.randn(shape, device=device, generator=generator) * 0.02).requires_grad_(True)
        p.grad = torch.randn(shape, device=device, generator=generator) * 1e-3
        params.append(p)
    return params


def make_torch_optimizer(kind, params, impl):
    h = torch_hyperparameters(kind)
    flags = {"for-loop": dict(foreach=False), "foreach": dict(foreach=True)}.get(impl, dict(fused=True))
    if impl.endswith("graph") and family(kind) == "adam":
        flags["capturable"] = True
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam if kind == "adam" else torch.optim.AdamW}[family(kind)]
    return cls(params, **h, **flags)


def gpu_step_function(kind, layout, impl):
    """A callable doing one torch step on the GPU, and what must stay alive with it."""
    g = torch.Generator(device="cuda").manual_seed(0)
    params = make_params(layout, "cuda", g)
    if family(kind) == "lars":
        from torch_lars import ForeachLars
        b = KIND_TABLE[kind]["bench"]
        opt = ForeachLars([p for p, (_, wg) in zip(params, layout) if wg], [p for p, (_, wg) in zip(params, layout) if not wg],
                          lr=b["lr"], momentum=b["momentum"], weight_decay=b["weight_decay"],
                          trust_coefficient=b["trust_coefficient"], eps=b["eps"], nesterov=kind.endswith("nesterov"))
        step = opt.step
    else:
        opt = make_torch_optimizer(kind, params, impl)
        step = opt.step
        if impl.startswith("check"):
            # GradScaler.step for an optimizer with _step_supports_amp_scaling: found_inf from the
            # non-finite check (inv_scale 1), then the fused step given grad_scale and found_inf.
            grads = [p.grad for p in params]
            # 0-dim, as GradScaler's (fused Adam subtracts found_inf from its 0-dim step counts).
            found_inf = torch.zeros((), device="cuda")
            inv_scale = torch.ones((), device="cuda")
            opt.grad_scale = torch.ones((), device="cuda")
            opt.found_inf = found_inf

            def step():
                found_inf.zero_()
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
                opt.step()
    if impl.endswith("graph"):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return graph.replay, (graph, opt, params)
    return step, (opt, params)


def time_cuda(step, replays, synced):
    """Median ms per step: CUDA events around each step; a sync after each (synced) or one at the end."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for a, b in events:
        a.record()
        step()
        b.record()
        if synced:
            b.synchronize()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def gpu_impls(kind):
    """Unchecked torch paths and checked ones (the found_inf equivalents) for a kind."""
    if family(kind) == "lars":
        return ["foreach", "foreach+graph"], []
    if family(kind) in ("sgd", "adam"):
        return ["for-loop", "foreach", "fused", "fused+graph"], ["check+fused", "check+fused+graph"]
    return [], []  # no torch.optim counterpart (lion, lamb): ours only


def time_torch_gpu(kind, layout, impl, replays, slow_replays):
    step, keep = gpu_step_function(kind, layout, impl)
    n = slow_replays if impl in ("for-loop", "foreach") else replays
    out = {m: time_cuda(step, n, m == "synced") for m in METHODS}
    del step, keep
    torch.cuda.empty_cache()
    return out


def time_torch_cpu(kind, layout, impl, threads, replays):
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    params = make_params(layout, "cpu", g)
    opt = make_torch_optimizer(kind, params, impl)
    for _ in range(2):
        opt.step()
    times = []
    for _ in range(replays):
        t0 = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run_bench_step(build, backend, layout, kinds, replays, threads=0, timing="both"):
    # weight_decay_mode l2 applies to the kinds that allow it (the SGD kinds): torch.optim.SGD's decay.
    cmd = [os.path.join(build, "bench", "bench_step"), "--backend", backend, "--layouts", layout,
           "--kinds", ",".join(kinds), "--replays", str(replays), "--check", "both", "--threads", str(threads),
           "--timing", timing, "--weight-decay-mode", "l2"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {(r["optimizer"], r["check_finite"]): r for r in (json.loads(l) for l in out.splitlines() if l.startswith("{"))}


def ours_times(r):
    return {m: r.get("ms_per_step" + ("_synced" if m == "synced" else "")) for m in METHODS}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=None)
    ap.add_argument("--layouts", default="resnet50,bert_base,gpt2_small")
    ap.add_argument("--kinds", default=None, help="comma-separated kinds (default: every kind of the table)")
    ap.add_argument("--replays", type=int, default=100, help="timed steps per GPU configuration and method")
    ap.add_argument("--slow-replays", type=int, default=20, help="... for torch's uncaptured for-loop and foreach")
    ap.add_argument("--cpu-replays", type=int, default=10)
    ap.add_argument("--cpu-kinds", default="adamw,sgd_momentum")
    ap.add_argument("--cpu-layouts", default="resnet50,gpt2_small")
    ap.add_argument("--cpu-impls", default="for-loop,foreach,fused")
    ap.add_argument("--no-cpu", action="store_true", help="GPU rows only")
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
    sys.path.insert(0, HERE)
    if not args.build:
        ap.error("--build is required unless --from-json is given")
    load_kind_table(args.build)
    kinds = args.kinds.split(",") if args.kinds else list(KIND_TABLE)
    results = {"format": 2, "gpu": [], "cpu": [], "meta": {}}
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

    def save():
        if args.json_out:  # after every row: a run cut short still leaves its rows
            with open(args.json_out, "w") as f:
                json.dump(results, f, indent=1)

    if torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name(0)
        for layout_name in args.layouts.split(","):
            layout = load_layout(layout_name)
            ours = run_bench_step(args.build, "cuda", layout_name, kinds, args.replays)
            for kind in kinds:
                on, off = ours[(kind, True)], ours[(kind, False)]
                row = {"layout": layout_name, "kind": kind, "wd_mode": off["weight_decay_mode"],
                       "ours_checked": ours_times(on), "ours": ours_times(off),
                       "floor_checked": on["floor_ms"], "floor": off["floor_ms"], "limit_gbps": off["limit_gb_per_s"],
                       "launches_checked": on["launches_per_step"], "launches": off["launches_per_step"],
                       "torch": {}, "torch_checked": {}}
                plain, checked = gpu_impls(kind)
                for impl in plain + checked:
                    slot = row["torch_checked" if impl in checked else "torch"]
                    try:
                        slot[impl] = time_torch_gpu(kind, layout, impl, args.replays, args.slow_replays)
                    except Exception as e:  # a path this torch does not offer for this kind
                        slot[impl] = None
                        print(f"torch {impl} {kind}: {type(e).__name__}: {e}", file=sys.stderr)
                results["gpu"].append(row)
                print(json.dumps(row), flush=True)
                save()

    if not args.no_cpu:
        for threads in sorted({2, os.cpu_count()}):
            for layout_name in args.cpu_layouts.split(","):
                layout = load_layout(layout_name)
                cpu_kinds = [k for k in args.cpu_kinds.split(",") if family(k) != "lars"]
                ours = run_bench_step(args.build, "cpu", layout_name, cpu_kinds, args.cpu_replays, threads, "enqueued")
                for kind in cpu_kinds:
                    on, off = ours[(kind, True)], ours[(kind, False)]
                    row = {"layout": layout_name, "kind": kind, "threads": threads, "wd_mode": off["weight_decay_mode"],
                           "ours": off["ms_per_step"], "ours_checked": on["ms_per_step"],
                           "share_of_limit": off["share_of_limit"], "torch": {}}
                    for impl in args.cpu_impls.split(","):
                        try:
                            row["torch"][impl] = time_torch_cpu(kind, layout, impl, threads, args.cpu_replays)
                        except Exception as e:
                            row["torch"][impl] = None
                            print(f"torch cpu {impl} {kind}: {type(e).__name__}: {e}", file=sys.stderr)
                    results["cpu"].append(row)
                    print(json.dumps(row), flush=True)
                    save()

    save()
    write_markdown(results, args.out)
    write_plot(results, args.plot)


from compare_render import write_markdown, write_plot  # noqa: E402  (no torch needed there)

if __name__ == "__main__":
    main()
