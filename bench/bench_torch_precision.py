#!/usr/bin/env python3
"""bf16 against torch: AdamW with bf16 model parameters and fp32 master weights, torch's best
ways and ours, in one run, timed one way (CUDA events around each step, N steps enqueued back to
back, one synchronisation at the end, medians: compare_torch.time_cuda).

torch paths (one CUDA graph each, capturable=True; on the layout's shapes, as compare_torch builds them):
  masters          fused AdamW on fp32 masters whose .grad is fp32, then torch._foreach_copy_(bf16
                   params, masters): the "best torch way" (reference figures of 2026-11-30: resnet50
                   0.331 ms, gpt2_small 1.233 ms). Computes what ours computes with --grad-dtype
                   fp32 (fp32 masters, the bf16 copy rounded to nearest; not the same bits: torch's
                   operation order is its own).
  masters+upcast   the gradients arrive in bf16 (autograd on bf16 parameters): _foreach_copy_ into
                   the masters' fp32 .grad first, then `masters`. Ours: --grad-dtype model.
  +check           GradScaler's way for fused optimizers before that: the found_inf check of the bf16
                   gradients (torch._amp_foreach_non_finite_check_and_unscale_), the fused step given
                   grad_scale and found_inf (the unscale by 1 rewrites the gradients, as GradScaler's
                   does). Ours: --grad-dtype model with the check.
  bf16 fused       fused AdamW directly on bf16 parameters, bf16 state, no masters (another result:
                   reference only; 0.213 / 0.665 ms on 2026-11-30), captured and eager.
Ours: bench_step --backend cuda --kinds adamw --precision bf16 --check both, --grad-dtype model|fp32,
nearest and --stochastic-rounding. The floor of a row is the ideal bytes per parameter of the result
it computes (bf16 gradients + bf16 copy: 28 B, 30 B with the check; fp32 gradients: 30 / 34 B;
docs/design.md, bytes_per_param) at the same-traffic rate bench_step measures over its own arena;
a torch row gets the floor of the ours row that computes the same thing, and ours ms / its ms (ours
rounding to nearest).

usage: bench_torch_precision.py --build BUILD [--layouts resnet50,bert_base,gpt2_small] [--replays 100]
                                [--rounds 1] [--json-out FILE]
       bench_torch_precision.py --build BUILD --quick    (CPU, a tiny layout: tests the script; torch
                                features this torch lacks on the CPU have stand-ins, named in the output,
                                or are n/a with the reason; never on CUDA, where they fail the run)
       bench_torch_precision.py --from-json FILE  (the table of a saved run)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_torch  # noqa: E402  (time_cuda: the same timing as compare_torch's rows)

compare_torch.torch = torch
# The kind table's bench row of adamw (what bench_step's bench_config uses); the timing does not
# depend on the values.
HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
BF16 = torch.bfloat16
# bench_step's configurations: (grad dtype, rounding) -> extra flags.
OURS = {("model", "nearest"): ["--grad-dtype", "model"],
        ("model", "stochastic"): ["--grad-dtype", "model", "--stochastic-rounding"],
        ("fp32", "nearest"): ["--grad-dtype", "fp32"],
        ("fp32", "stochastic"): ["--grad-dtype", "fp32", "--stochastic-rounding"]}
# torch path -> (the ours configuration computing the same result: grad dtype, check), or None.
TORCH_PATHS = {"masters": ("fp32", False), "masters+upcast": ("model", False), "masters+upcast+check": ("model", True),
               "bf16 fused": None, "bf16 fused eager": None}
# The reference torch figures (H200, torch 2.11, 2026-11-30), printed beside this run's.
ISSUE14 = {("resnet50", "masters"): 0.331, ("gpt2_small", "masters"): 1.233,
           ("resnet50", "bf16 fused"): 0.213, ("gpt2_small", "bf16 fused"): 0.665}
BF16_FUSED_BYTES = 14.0  # bf16 g, w, m, v read, w, m, v written: the ideal of the bf16-state result


class Unavailable(Exception):
    """A torch feature this torch lacks on the CPU (torch 1.13 here): the row is n/a, with why."""


FALLBACKS = set()  # what a CPU run used instead of a missing torch feature (never on CUDA)


def load_layout(spec):
    """Shapes of a layout: a name under data/layouts or a JSON file (bench_step takes both)."""
    path = spec if spec.endswith(".json") else os.path.join(os.path.dirname(HERE), "data", "layouts", spec + ".json")
    with open(path) as f:
        return [tuple(p["shape"]) for p in json.load(f)["params"]]


def adamw(params, device, capturable):
    try:
        return torch.optim.AdamW(params, fused=True, capturable=capturable, **HP)
    except TypeError:  # torch 1.13 has no fused AdamW: on the CPU its foreach path stands in
        if device == "cuda":
            raise
        FALLBACKS.add("foreach AdamW for fused (torch %s has no fused AdamW)" % torch.__version__)
        return torch.optim.AdamW(params, foreach=True, **HP)


def copy_all(dst, src):
    if hasattr(torch, "_foreach_copy_"):
        torch._foreach_copy_(dst, src)
        return
    if dst[0].is_cuda:
        raise RuntimeError("torch %s has no torch._foreach_copy_" % torch.__version__)
    FALLBACKS.add("a copy_ per tensor for torch._foreach_copy_ (torch %s has none)" % torch.__version__)
    for d, s in zip(dst, src):
        d.copy_(s)


def torch_step(path, shapes, device):
    """One step of a torch path as a callable, and what must stay alive with it."""
    g = torch.Generator(device=device).manual_seed(0)
    model = [(torch.randn(s, device=device, generator=g) * 0.02).to(BF16) for s in shapes]
    model_grads = [(torch.randn(s, device=device, generator=g) * 1e-3).to(BF16) for s in shapes]
    graph = device == "cuda" and not path.endswith("eager")
    if path.startswith("bf16 fused"):
        for p, gr in zip(model, model_grads):
            p.requires_grad_(True)
            p.grad = gr
        opt = adamw(model, device, graph)
        return opt.step, (opt, model)
    masters = [p.float().requires_grad_(True) for p in model]
    for m, gr in zip(masters, model_grads):
        m.grad = gr.float()
    master_grads = [m.grad for m in masters]
    opt = adamw(masters, device, graph)
    parts = []
    # GradScaler's unscale/found_inf check runs on the fp32 master gradients (torch has no bf16
    # version of _amp_foreach_non_finite_check_and_unscale_), so the upcast comes first.
    if "+upcast" in path:
        parts.append(lambda: copy_all(master_grads, model_grads))
    if path.endswith("+check"):
        found_inf = torch.zeros((), device=device)
        inv_scale = torch.ones((), device=device)
        opt.grad_scale, opt.found_inf = torch.ones((), device=device), found_inf

        def check():
            found_inf.zero_()
            try:
                torch._amp_foreach_non_finite_check_and_unscale_(master_grads, found_inf, inv_scale)
            except (NotImplementedError, RuntimeError) as e:
                if device == "cuda":
                    raise
                raise Unavailable("no CPU found_inf check in torch %s" % torch.__version__) from e
        parts.append(check)
    parts.append(opt.step)
    parts.append(lambda: copy_all(model, masters))

    def step():
        for part in parts:
            part()
    return step, (opt, masters, model, model_grads)


def time_torch(path, shapes, device, replays):
    step, keep = torch_step(path, shapes, device)
    if device == "cuda":
        if not path.endswith("eager"):
            step, graph = compare_torch.captured(step)
        ms = compare_torch.time_cuda(step, replays, synced=False)
    else:  # the CPU step is synchronous: a steady clock around each
        ms = compare_torch.median_host_ms(step, replays, warmup=1)
    del step, keep
    if device == "cuda":
        torch.cuda.empty_cache()
    return ms


def run_ours(bench_step, backend, layouts, replays, threads):
    """{(layout, grad dtype, rounding, check): bench_step's row}."""
    rows = {}
    for (gd, rounding), flags in OURS.items():
        cmd = [bench_step, "--backend", backend, "--layouts", ",".join(layouts), "--kinds", "adamw", "--check", "both",
               "--precision", "bf16", "--replays", str(replays), "--timing", "enqueued", "--threads", str(threads)] + flags
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        for r in (json.loads(l) for l in out.splitlines() if l.startswith("{")):
            rows[(r["layout"], gd, rounding, r["check_finite"])] = r
            print(json.dumps({k: r[k] for k in ("layout", "grad_dtype", "rounding", "check_finite", "ms_per_step",
                                                "floor_ms", "share_of_limit")}), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", help="the CMake build dir holding bench/bench_step")
    ap.add_argument("--bench-step", help="the bench_step binary (default BUILD/bench/bench_step)")
    ap.add_argument("--layouts", default="resnet50,bert_base,gpt2_small")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=1, help="each side this many times; a figure is the median of the rounds' medians")
    ap.add_argument("--quick", action="store_true", help="CPU, bench/traffic_layout.json, 5 replays (tests the script)")
    ap.add_argument("--json-out", help="written after every round: a run cut short keeps its complete rounds")
    ap.add_argument("--from-json", help="print the table of a saved --json-out (nothing is run)")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        print_table(saved["rows"], saved["meta"])
        return 0
    bench_step = args.bench_step or (args.build and os.path.join(args.build, "bench", "bench_step"))
    if not bench_step:
        ap.error("--build or --bench-step is required")
    if args.quick:
        # one CPU thread: on the loaded 2-core machine a second one waits for a core (ms of noise)
        device, layouts, replays, threads = "cpu", [os.path.join(HERE, "traffic_layout.json")], 5, 1
    else:
        if not torch.cuda.is_available():
            print("bench_torch_precision: no CUDA device (--quick runs the CPU check of the script)")
            return 1
        device, layouts, replays, threads = "cuda", args.layouts.split(","), args.replays, 0
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "replays": replays, "rounds": args.rounds}
    ours_rounds, torch_rounds, unavailable = [], [], {}
    for rnd in range(args.rounds):  # ours, then torch, per round: both sides see the same machine state
        ours_rounds.append(run_ours(bench_step, "cuda" if device == "cuda" else "cpu", layouts, replays, threads))
        times = {}
        for layout in layouts:
            shapes = load_layout(layout)
            for path in TORCH_PATHS:
                try:
                    times[(layout, path)] = time_torch(path, shapes, device, replays)
                except Unavailable as e:
                    unavailable[path] = str(e)
                print(json.dumps({"round": rnd, "layout": layout, "torch": path, "ms": times.get((layout, path))}), flush=True)
        torch_rounds.append(times)
        rows = summarise(layouts, ours_rounds, torch_rounds, unavailable)
        meta.update(rounds=rnd + 1, cpu_stand_ins=sorted(FALLBACKS))
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print_table(rows, meta)
    return 0


def median_of(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(layouts, ours_rounds, torch_rounds, unavailable):
    """One row per (layout, side, path, check): the median of the rounds, its ideal bytes per
    parameter and floor; a torch row with a same-result ours row also gets torch ms / ours ms."""
    rows = []
    for layout in layouts:
        ours = {}  # (grad dtype, rounding, check) -> row
        for (gd, rounding) in OURS:
            for check in (False, True):
                k = (layout, gd, rounding, check)
                r = ours_rounds[0][k]
                limit = median_of(o[k]["limit_gb_per_s"] for o in ours_rounds) * 1e9  # measured each round
                bytes_pp = r["floor_ms"] * 1e-3 * r["limit_gb_per_s"] * 1e9 / r["params"]  # bench_step's ideal bytes
                row = dict(layout=os.path.basename(layout), side="ours", check=check,
                           path="%s grads, %s" % ("bf16" if gd == "model" else "fp32", rounding),
                           ms=median_of(o[k]["ms_per_step"] for o in ours_rounds), floor_ms=bytes_pp * r["params"] / limit * 1e3,
                           bytes_per_param=bytes_pp, params=r["params"], limit=limit)
                ours[(gd, rounding, check)] = row
                rows.append(row)
        for path, pair in TORCH_PATHS.items():
            ref = ours[(pair[0], "nearest", pair[1])] if pair else None
            base = ref or ours[("model", "nearest", False)]  # the rate; unpaired: the bf16-state ideal bytes
            bytes_pp = ref["bytes_per_param"] if ref else BF16_FUSED_BYTES
            row = dict(layout=os.path.basename(layout), side="torch", path=path, check=path.endswith("+check"),
                       ms=median_of(t.get((layout, path)) for t in torch_rounds), bytes_per_param=bytes_pp,
                       floor_ms=bytes_pp * base["params"] / base["limit"] * 1e3, params=base["params"])
            if row["ms"] is None:
                row["n/a"] = unavailable.get(path, "not measured")
            elif ref is not None:
                row["ours_over_torch"] = ref["ms"] / row["ms"]  # < 1: ours faster
            rows.append(row)
    return rows


def print_table(rows, meta):
    f = lambda x, spec: "n/a" if x is None else format(x, spec)
    print("\n### AdamW, bf16 model + fp32 masters: torch vs renaissance (%s, torch %s, medians of %d enqueued steps, "
          "%d round(s))\n" % (meta["device"], meta["torch"], meta["replays"], meta["rounds"]))
    for note in meta["cpu_stand_ins"]:
        print("CPU stand-in: %s" % note)
    print("| layout | side | path | check | ms | B/param | % of floor | ours / torch (time; ours computing the same, nearest) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        pct = None if r["ms"] is None else 100 * r["floor_ms"] / r["ms"]
        ms = "n/a: " + r["n/a"] if "n/a" in r else f(r["ms"], ".4f")
        ratio = r.get("ours_over_torch")
        print("| %s | %s | %s | %s | %s | %.0f | %s | %s |" % (
            r["layout"], r["side"], r["path"], "on" if r["check"] else "off", ms, r["bytes_per_param"], f(pct, ".1f"),
            "%.3f" % ratio if ratio else ""))
    # The reference comparison, as speed-ups: torch's `masters` (fp32 gradients) against ours
    # with bf16 gradients (the 28 B/param mode).
    for t in (r for r in rows if r["side"] == "torch" and r["ms"] and (r["layout"], r["path"].replace(" eager", "")) in ISSUE14):
        print("%s: torch %s %.4f ms here; reference %.3f ms (2026-11-30)" % (
            t["layout"], t["path"], t["ms"], ISSUE14[(t["layout"], t["path"].replace(" eager", ""))]))
    for t in (r for r in rows if r["path"] == "masters" and r["ms"]):
        mine = [r for r in rows if r["layout"] == t["layout"] and r["side"] == "ours" and r["path"].startswith("bf16")]
        print("%s: speed-up over torch masters (%.4f ms / ours, bf16 grads): %s" % (t["layout"], t["ms"], ", ".join(
            "%s check %s %.2fx" % (r["path"].split(", ")[1], "on" if r["check"] else "off", t["ms"] / r["ms"]) for r in mine)))


if __name__ == "__main__":
    sys.exit(main())
