#!/usr/bin/env python3
"""Side-by-side optimizer step timings: torch against Renaissance, in one run, timed the same way.

GPU, both sides timed by two methods:
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
so our SGD rows run with weight_decay_mode l2. Lion and LAMB: torch.optim has neither; the torch
side is timm's `Lion` and `Lamb` (foreach, uncaptured and captured; LAMB with max_grad_norm=None,
trust_clip=False, the semantics of docs/math.md), bias-like parameters in a group with weight
decay 0. Clipping (the row "adamw+clip"): torch.nn.utils.clip_grad_norm_(params, max_norm,
foreach=True) then fused AdamW (after the found_inf check in the checked paths, GradScaler's
order), against ours with bench_step --max-grad-norm. Each uncaptured torch path is also run once
under torch.cuda.set_sync_debug_mode("error"): the row records whether it synchronises the host.
Floor = ideal bytes / the same-traffic limit that bench_step measures over the task's own arena
(Backend::same_traffic_gbps).

CPU: torch's paths at equal thread counts (2 and all cores) against `bench_step --backend cpu`
(both methods are one there: the CPU step is synchronous).

usage: compare_torch.py --build BUILD_DIR [--layouts resnet50,bert_base,gpt2_small] [--replays 100]
                        [--kinds K1,K2,...,adamw+clip] [--max-grad-norm 1.0]
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


CLIP_SUFFIX = "+clip"  # "adamw+clip": the kind with gradient-norm clipping (ours: --max-grad-norm)


def base_kind(kind):
    return kind[:-len(CLIP_SUFFIX)] if kind.endswith(CLIP_SUFFIX) else kind


def clipped(kind):
    return kind.endswith(CLIP_SUFFIX)


def family(kind):
    return KIND_TABLE[base_kind(kind)]["family"]


def torch_hyperparameters(kind):
    """torch.optim keyword arguments equal to the kind's "bench" row."""
    b = KIND_TABLE[base_kind(kind)]["bench"]
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
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam if base_kind(kind) == "adam" else torch.optim.AdamW}[family(kind)]
    return cls(params, **h, **flags)


def make_timm_optimizer(kind, params, layout, impl):
    """timm's Lion or Lamb with the kind's bench hyperparameters; the bias-like parameters in a group
    of their own with weight decay 0 (this library's rule; timm's Lamb then skips the trust ratio
    there, r = 1, as ours). impl timm-foreach* or timm-for-loop."""
    import timm.optim
    b = KIND_TABLE[kind]["bench"]
    weights = [p for p, (_, wg) in zip(params, layout) if wg]
    biases = [p for p, (_, wg) in zip(params, layout) if not wg]
    groups = [g for g in (dict(params=weights, weight_decay=b["weight_decay"]), dict(params=biases, weight_decay=0.0))
              if g["params"]]
    foreach = impl.startswith("timm-foreach")
    if kind == "lion":
        return timm.optim.Lion(groups, lr=b["lr"], betas=(b["beta1"], b["beta2"]), foreach=foreach)
    # timm's Lamb has no foreach argument in every release (1.0.x on the GPU machine has none):
    # there it is the per-tensor loop, and the path is named timm-for-loop (timm_lamb_impls).
    extra = {"foreach": foreach} if timm_lamb_has_foreach() else {}
    return timm.optim.Lamb(groups, lr=b["lr"], betas=(b["beta1"], b["beta2"]), eps=b["eps"], max_grad_norm=None,
                           trust_clip=False, **extra)


def timm_lamb_has_foreach():
    import inspect
    import timm.optim
    return "foreach" in inspect.signature(timm.optim.Lamb.__init__).parameters


def timm_impls(kind):
    """timm's paths for lion and lamb: foreach where the installed timm has it, else its loop."""
    if kind == "lion" or timm_lamb_has_foreach():
        return ["timm-foreach", "timm-foreach+graph"]
    return ["timm-for-loop", "timm-for-loop+graph"]


def torch_step_function(kind, layout, impl, max_grad_norm, device="cuda"):
    """A callable doing one torch step, and what must stay alive with it. impl names the path:
    for-loop / foreach / fused (torch.optim), timm-* (timm), a "check+" prefix (GradScaler's
    found_inf check, then the fused step given grad_scale and found_inf), "clip+" (clip_grad_norm_
    foreach before the step, after the check), a "+graph" suffix (captured in one CUDA graph)."""
    g = torch.Generator(device=device).manual_seed(0)
    params = make_params(layout, device, g)
    grads = [p.grad for p in params]
    if family(kind) == "lars":
        from torch_lars import ForeachLars
        b = KIND_TABLE[kind]["bench"]
        opt = ForeachLars([p for p, (_, wg) in zip(params, layout) if wg], [p for p, (_, wg) in zip(params, layout) if not wg],
                          lr=b["lr"], momentum=b["momentum"], weight_decay=b["weight_decay"],
                          trust_coefficient=b["trust_coefficient"], eps=b["eps"], nesterov=kind.endswith("nesterov"))
    elif impl.startswith("timm-"):
        opt = make_timm_optimizer(kind, params, layout, impl.replace("+graph", ""))
    else:
        opt = make_torch_optimizer(kind, params, impl.replace("check+", "").replace("clip+", ""))
    parts = []
    if impl.startswith("check"):
        # GradScaler.step for an optimizer with _step_supports_amp_scaling: found_inf from the
        # non-finite check (inv_scale 1), then the fused step given grad_scale and found_inf.
        # 0-dim, as GradScaler's (fused Adam subtracts found_inf from its 0-dim step counts).
        found_inf = torch.zeros((), device=device)
        inv_scale = torch.ones((), device=device)
        opt.grad_scale = torch.ones((), device=device)
        opt.found_inf = found_inf

        def check():
            found_inf.zero_()
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        parts.append(check)
    if "clip+" in impl:
        parts.append(lambda: torch.nn.utils.clip_grad_norm_(params, max_grad_norm, foreach=True))
    parts.append(opt.step)

    def step():
        for part in parts:
            part()
    if impl.endswith("graph"):
        replay, graph = captured(step)
        return replay, (graph, opt, params)
    return step, (opt, params)


def captured(step):
    """`step` captured in one CUDA graph (after warm-up steps on a side stream, as torch asks):
    the graph's replay and the graph (keep it alive)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay, graph


def host_syncs(step):
    """Whether one uncaptured step synchronises the host with the device (a captured one cannot)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        return False
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


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
    if clipped(kind):
        if family(kind) != "adam":
            return [], []
        return ["clip+fused", "clip+fused+graph"], ["check+clip+fused", "check+clip+fused+graph"]
    if family(kind) in ("sgd", "adam"):
        return ["for-loop", "foreach", "fused", "fused+graph"], ["check+fused", "check+fused+graph"]
    if family(kind) in ("lion", "lamb"):
        # timm's; it has no found_inf path, so no checked variant. Captured, timm's Lamb keeps its
        # step count on the host: the replays reuse the bias corrections of the captured step
        # (the same kernels and bytes; only the timing is meaningful).
        return timm_impls(kind), []
    return [], []


def time_torch_gpu(kind, layout, impl, replays, slow_replays, max_grad_norm):
    step, keep = torch_step_function(kind, layout, impl, max_grad_norm)
    n = slow_replays if not impl.endswith("graph") and "fused" not in impl else replays
    out = {m: time_cuda(step, n, m == "synced") for m in METHODS}
    if not impl.endswith("graph"):
        out["syncs"] = host_syncs(step)
    del step, keep
    torch.cuda.empty_cache()
    return out


def time_torch_cpu(kind, layout, impl, threads, replays, max_grad_norm):
    torch.set_num_threads(threads)
    step, keep = torch_step_function(kind, layout, impl, max_grad_norm, device="cpu")
    ms = median_host_ms(step, replays)
    del keep
    return ms


def median_host_ms(step, replays, warmup=2):
    """Median ms of a synchronous (CPU) step, a steady clock around each after `warmup` steps."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(replays):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def cpu_impls(kind, impls):
    """The CPU paths of --cpu-impls that exist for a kind (timm's for lion and lamb)."""
    if family(kind) in ("lion", "lamb"):
        return [i for i in ("timm-for-loop", "timm-foreach") if i.replace("timm-", "") in impls]
    if clipped(kind):
        return ["clip+" + i for i in impls if i == "fused"]
    return impls


def default_gpu_kinds():
    """The GPU rows' kinds: every kind of the table but muon, and adamw+clip. Muon is left out: its
    torch side (torch.optim.Muon + fused AdamW, torch >= 2.9) and its batched Newton-Schulz belong to
    bench/bench_torch_muon.py."""
    return [k for k in KIND_TABLE if k != "muon"] + ["adamw" + CLIP_SUFFIX]


def bench_step_commands(build, backend, layout, kinds, replays, threads=0, timing="both", max_grad_norm=0.0):
    """Our rows' bench_step command lines, as (clip, argv): the plain kinds in one run, the "+clip"
    kinds in a second one with --max-grad-norm. bench/step_ab.py runs the same lines on two builds."""
    cmds = []
    for clip in (False, True):
        names = [base_kind(k) for k in kinds if clipped(k) == clip]
        if not names:
            continue
        # weight_decay_mode l2 applies to the kinds that allow it (the SGD kinds): torch.optim.SGD's decay.
        cmd = [os.path.join(build, "bench", "bench_step"), "--backend", backend, "--layouts", layout,
               "--kinds", ",".join(names), "--replays", str(replays), "--check", "both", "--threads", str(threads),
               "--timing", timing, "--weight-decay-mode", "l2"] + (["--max-grad-norm", str(max_grad_norm)] if clip else [])
        cmds.append((clip, cmd))
    return cmds


def bench_step_rows(stdout, clip):
    """bench_step's JSON rows keyed by (kind, check), the kind with the "+clip" suffix for a clip run."""
    return {(r["optimizer"] + (CLIP_SUFFIX if clip else ""), r["check_finite"]): r
            for r in (json.loads(l) for l in stdout.splitlines() if l.startswith("{"))}


def run_bench_step(build, backend, layout, kinds, replays, threads=0, timing="both", max_grad_norm=0.0):
    """Our rows keyed by (kind, check)."""
    found = {}
    for clip, cmd in bench_step_commands(build, backend, layout, kinds, replays, threads, timing, max_grad_norm):
        found.update(bench_step_rows(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout, clip))
    return found


def ours_times(r):
    return {m: r.get("ms_per_step" + ("_synced" if m == "synced" else "")) for m in METHODS}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=None)
    ap.add_argument("--layouts", default="resnet50,bert_base,gpt2_small")
    ap.add_argument("--kinds", default=None,
                    help="comma-separated kinds, K+clip for K with clipping (default: every kind of the table, adamw+clip)")
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="max_norm of the +clip rows (both sides)")
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
    kinds = args.kinds.split(",") if args.kinds else default_gpu_kinds()
    unknown = [k for k in kinds if base_kind(k) not in KIND_TABLE]
    if unknown:
        ap.error(f"unknown kinds {unknown}; the table has {list(KIND_TABLE)}")
    results = {"format": 2, "gpu": [], "cpu": [], "meta": {"max_grad_norm": args.max_grad_norm}}
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
            ours = run_bench_step(args.build, "cuda", layout_name, kinds, args.replays, max_grad_norm=args.max_grad_norm)
            for kind in kinds:
                on, off = ours[(kind, True)], ours[(kind, False)]
                row = {"layout": layout_name, "kind": kind, "wd_mode": off["weight_decay_mode"],
                       "max_grad_norm": off.get("max_grad_norm", 0.0),
                       "ours_checked": ours_times(on), "ours": ours_times(off),
                       "floor_checked": on["floor_ms"], "floor": off["floor_ms"], "limit_gbps": off["limit_gb_per_s"],
                       "launches_checked": on["launches_per_step"], "launches": off["launches_per_step"],
                       "torch": {}, "torch_checked": {}}
                plain, checked = gpu_impls(kind)
                for impl in plain + checked:
                    slot = row["torch_checked" if impl in checked else "torch"]
                    try:
                        slot[impl] = time_torch_gpu(kind, layout, impl, args.replays, args.slow_replays, args.max_grad_norm)
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
                ours = run_bench_step(args.build, "cpu", layout_name, cpu_kinds, args.cpu_replays, threads, "enqueued",
                                      args.max_grad_norm)
                for kind in cpu_kinds:
                    on, off = ours[(kind, True)], ours[(kind, False)]
                    row = {"layout": layout_name, "kind": kind, "threads": threads, "wd_mode": off["weight_decay_mode"],
                           "max_grad_norm": off.get("max_grad_norm", 0.0),
                           "ours": off["ms_per_step"], "ours_checked": on["ms_per_step"],
                           "share_of_limit": off["share_of_limit"], "torch": {}}
                    for impl in cpu_impls(kind, args.cpu_impls.split(",")):
                        try:
                            row["torch"][impl] = time_torch_cpu(kind, layout, impl, threads, args.cpu_replays,
                                                                args.max_grad_norm)
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
