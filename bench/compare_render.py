"""Renders bench/compare_torch.py's results (its --json-out) as RESULTS.md and results.png. Needs no
torch, so `compare_torch.py --from-json` re-renders anywhere. Files of the first format (one
figure each: ours enqueued, torch synced per step) are read too, each figure filed
under the method it was measured with, so nothing is shown as what it was not.
"""
import os
import sys

METHODS = ("enqueued", "synced")
MANUAL_MARKER = "<!-- Below: measurements not made by compare_torch.py; kept when it rewrites this file. -->"
TORCH_ORDER = ["for-loop", "foreach", "fused", "fused+graph", "foreach+graph", "check+fused", "check+fused+graph",
               "timm-for-loop", "timm-for-loop+graph", "timm-foreach", "timm-foreach+graph",
               "clip+fused", "clip+fused+graph", "check+clip+fused", "check+clip+fused+graph"]


def _timed(x, method):
    """A {method: ms} dict from a new-format figure, or from an old single figure of `method`."""
    if isinstance(x, dict) or x is None:
        return x
    return {method: x}


def normalise(results):
    if results.get("format", 1) >= 2:
        return results
    for r in results.get("gpu", []):
        r["ours"], r["ours_checked"] = _timed(r["ours"], "enqueued"), _timed(r["ours_checked"], "enqueued")
        r["torch"] = {k: _timed(v, "synced") for k, v in r["torch"].items()}
        r.setdefault("torch_checked", {})
        r.setdefault("floor_checked", None)
        r.setdefault("wd_mode", "decoupled")
        r.setdefault("launches_checked", None)
    return results


def fmt(x):
    return "n/a" if x is None else f"{x:.3f}"


def ratio(a, b):
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"


def pct(floor, t):
    return "n/a" if floor is None or not t else f"{100 * floor / t:.0f}%"


def get(timed, method):
    return None if not timed else timed.get(method)


def best(paths, method):
    """(ms, path) of the fastest path measured with `method`, or (None, None)."""
    found = [(v[method], k) for k, v in paths.items() if v and v.get(method) is not None]
    return min(found) if found else (None, None)


def floor_table(results):
    """% of floor per kind: one row per kind, a column per layout and mode."""
    rows = results["gpu"]
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    cell = {(r["layout"], r["kind"]): r for r in rows}
    out = ["### GPU, % of floor per kind (enqueued; check on / check off)", "",
           "| kind | " + " | ".join(layouts) + " |", "|---|" + "---|" * len(layouts)]
    for k in kinds:
        cells = []
        for l in layouts:
            r = cell.get((l, k))
            cells.append("" if r is None else f"{pct(r.get('floor_checked'), get(r['ours_checked'], 'enqueued'))} / "
                                              f"{pct(r.get('floor'), get(r['ours'], 'enqueued'))}")
        out.append(f"| {k} | " + " | ".join(cells) + " |")
    return out + [""]


def table_head(title, columns):
    """The lines that open a markdown table: its title, a blank line, the header row and its rule."""
    return ["### " + title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def gpu_tables(results):
    rows = results["gpu"]
    out = floor_table(results)
    out += table_head("GPU, default mode (non-finite check on), enqueued: the headline",
                      ["layout", "kind", "ours, check on", "torch with found_inf check (fastest path)", "speed-up",
                       "ours: % of floor", "launches"])
    for r in rows:
        on = get(r["ours_checked"], "enqueued")
        t, path = best(r["torch_checked"], "enqueued")
        none = results.get("format", 1) >= 2 and not r["torch_checked"]  # no path offered, not just unmeasured
        torch_cell = f"{fmt(t)} ({path})" if t is not None else "n/a (torch has none)" if none else "n/a"
        out.append(f"| {r['layout']} | {r['kind']} | {fmt(on)} | {torch_cell} | {ratio(t, on)} | "
                   f"{pct(r.get('floor_checked'), on)} | {r.get('launches_checked') or 'n/a'} |")
    out += [""] + table_head("GPU, non-finite check off, enqueued",
                             ["layout", "kind", "ours, check off", "fastest torch (path)", "speed-up",
                              "ours: % of floor", "launches"])
    for r in rows:
        off = get(r["ours"], "enqueued")
        t, path = best(r["torch"], "enqueued")
        out.append(f"| {r['layout']} | {r['kind']} | {fmt(off)} | {fmt(t)}{f' ({path})' if path else ''} | {ratio(t, off)} | "
                   f"{pct(r.get('floor'), off)} | {r.get('launches')} |")
    out += [""] + table_head("GPU, synced: a synchronisation after every step (what a loop with host work sees)",
                             ["layout", "kind", "ours, check on", "torch with check (path)", "speed-up",
                              "ours, check off", "fastest torch (path)", "speed-up"])
    for r in rows:
        on, off = get(r["ours_checked"], "synced"), get(r["ours"], "synced")
        tc, pc = best(r["torch_checked"], "synced")
        t, p = best(r["torch"], "synced")
        out.append(f"| {r['layout']} | {r['kind']} | {fmt(on)} | {fmt(tc)}{f' ({pc})' if pc else ''} | {ratio(tc, on)} | "
                   f"{fmt(off)} | {fmt(t)}{f' ({p})' if p else ''} | {ratio(t, off)} |")
    impls = [i for i in TORCH_ORDER if any(i in r["torch"] or i in r["torch_checked"] for r in rows)]
    out += ["", "### Every torch path, ms per step: enqueued / synced", "",
            "| layout | kind | " + " | ".join(impls) + " |", "|---|---|" + "---|" * len(impls)]
    for r in rows:
        cells = []
        for i in impls:
            v = r["torch"].get(i, r["torch_checked"].get(i))
            cells.append("" if i not in r["torch"] and i not in r["torch_checked"] else
                         "n/a" if v is None else f"{fmt(v.get('enqueued'))} / {fmt(v.get('synced'))}"
                         + (" (syncs)" if v.get("syncs") else ""))
        out.append(f"| {r['layout']} | {r['kind']} | " + " | ".join(cells) + " |")
    limit = rows[0].get("limit_gbps")
    out += ["", "How to read these tables:", "",
            "- Both sides are timed the same way. *Enqueued*: N steps launched back to back with CUDA events around "
            "each and one synchronisation at the end (the device's time per step). *Synced*: a synchronisation after "
            "each step, so host launch latency shows. Ours is one CUDA graph per step (`bench_step`).",
            "- *Floor* = ideal bytes per parameter (docs/design.md) / the same-traffic limit measured in the same run "
            "over the task's own arena (`Backend::same_traffic_gbps`: an in-place kernel that reads and writes "
            "exactly what the step does, with trivial arithmetic)"
            + (f"; {limit:.0f} GB/s for the first row." if limit else "."),
            "- The torch check is GradScaler's way for fused optimizers: "
            "`torch._amp_foreach_non_finite_check_and_unscale_` into `found_inf`, then the fused step given "
            "`grad_scale` and `found_inf` (it skips on the device), captured in a CUDA graph where possible.",
            "- LARS: torch has no LARS, and timm's `Lars` is a per-tensor Python loop with other semantics. The torch "
            "side is bench/torch_lars.py: `torch._foreach_norm` per-tensor norms and foreach updates, captured in a "
            "CUDA graph, with THIS library's LARS semantics (docs/math.md: lr inside the momentum, bias-like "
            "parameters plain momentum with weight decay 0, trust ratio clamped at 100; bench/check_torch_lars.py "
            "checks it against the float64 reference). It has no checked variant.",
            "- Lion and LAMB: torch.optim has neither. The torch side is timm's `Lion` and `Lamb` with foreach "
            "(`timm-foreach`), uncaptured and captured in a CUDA graph (`+graph`); LAMB with `max_grad_norm=None`, "
            "`trust_clip=False` (this library's semantics, docs/math.md), bias-like parameters in a group with weight "
            "decay 0 in both. timm has no found_inf path, so there is no checked torch figure. Captured, timm's Lamb "
            "keeps its step count on the host, so replays reuse the captured step's bias corrections: the same "
            "kernels and bytes, a valid timing, not a valid training loop.",
            "- Clipping (`adamw+clip`, max_norm " + f"{results['meta'].get('max_grad_norm', 'n/a')}" + "): torch "
            "is `torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)` then fused AdamW (checked: the "
            "found_inf check first, GradScaler's order; `+graph`: captured, with capturable AdamW); ours is the same "
            "kind with `--max-grad-norm` (the norm fused with the non-finite check: no extra pass over G; its floor is "
            "AdamW's). *(syncs)* marks an uncaptured torch path that synchronised the host in a step run under "
            "`torch.cuda.set_sync_debug_mode(\"error\")`.",
            "- SGD: torch.optim.SGD decays the L2 way, so our SGD rows run with `weight_decay_mode l2`"
            + (" (this run)." if any(r.get("wd_mode") == "l2" for r in rows) else
               " in new runs; this file's data predate that (decoupled)."), ""]
    return out


def cpu_reference(paths):
    """torch's fused path where it has one, else the fastest path measured (timm's, clip+fused)."""
    if paths.get("fused") is not None:
        return paths["fused"]
    found = [v for v in paths.values() if v is not None]
    return min(found) if found else None


def cpu_table(results):
    rows = results["cpu"]
    impls = [i for i in TORCH_ORDER if any(i in r["torch"] for r in rows)]
    out = ["### CPU (steady clock; equal thread counts; the CPU step is synchronous, so both methods are one)", "",
           "| layout | kind | threads | ours | ours + NaN check | ours: % of same-traffic limit | "
           + " | ".join(f"torch {i}" for i in impls) + " | speed-up vs fused (else the fastest torch) |",
           "|---|---|---|---|---|---|" + "---|" * len(impls) + "---|"]
    for r in rows:
        share = r.get("share_of_limit")
        out.append(f"| {r['layout']} | {r['kind']} | {r['threads']} | {fmt(r['ours'])} | {fmt(r['ours_checked'])} | "
                   f"{'n/a' if share is None else f'{100 * share:.0f}%'} | "
                   + " | ".join(fmt(r["torch"].get(i)) for i in impls) + f" | {ratio(cpu_reference(r['torch']), r['ours'])} |")
    return out + [""]


def write_markdown(results, path):
    results = normalise(results)
    m = results["meta"]
    lines = ["<!-- Generated by bench/compare_torch.py; edit the script, not this table. -->", "",
             "## Renaissance vs torch, measured side by side in one run, timed the same way", "",
             f"Date {m['date']}; GPU {m.get('gpu', 'none')}; CPU {m['cpu']} ({m['cores']} cores); "
             f"torch {m['torch']} (CUDA {m['cuda']}). Times are medians in ms per step.",
             "The dated runs behind these tables, each naming its machine, are in [JOURNAL.md](JOURNAL.md), newest first.",
             ""]
    if results.get("format", 1) < 2:
        lines += ["Data of the first format: ours was timed enqueued, torch synced per step; each figure is shown "
                  "under the method it was measured with. Its floor was a memcpy's bandwidth, not the same-traffic limit.", ""]
    if results["gpu"]:
        lines += gpu_tables(results)
    if results["cpu"]:
        lines += cpu_table(results)
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
    results = normalise(results)
    panels = []
    if results["gpu"]:
        rows = results["gpu"]
        series = [("renaissance, check on", [get(r["ours_checked"], "enqueued") for r in rows]),
                  ("torch with check (fastest)", [best(r["torch_checked"], "enqueued")[0] for r in rows]),
                  ("renaissance, check off", [get(r["ours"], "enqueued") for r in rows]),
                  ("torch (fastest)", [best(r["torch"], "enqueued")[0] for r in rows])]
        floors = [("check on", [r.get("floor_checked") and get(r["ours_checked"], "enqueued") and
                                100 * r["floor_checked"] / get(r["ours_checked"], "enqueued") for r in rows]),
                  ("check off", [r.get("floor") and get(r["ours"], "enqueued") and
                                 100 * r["floor"] / get(r["ours"], "enqueued") for r in rows])]
        panels.append(("GPU, enqueued", [f"{r['layout']}\n{r['kind']}" for r in rows], series, floors, "% of floor"))
    if results["cpu"]:
        rows = results["cpu"]
        impls = [i for i in TORCH_ORDER if any(i in r["torch"] for r in rows)]
        series = [("renaissance, check on", [r["ours_checked"] for r in rows]), ("renaissance, check off", [r["ours"] for r in rows])]
        series += [(f"torch {i}", [r["torch"].get(i) for r in rows]) for i in impls]
        shares = [("check off", [r.get("share_of_limit") and 100 * r["share_of_limit"] for r in rows])]
        panels.append(("CPU", [f"{r['layout']}\n{r['kind']}\n{r['threads']} thr" for r in rows], series, shares,
                       "% of same-traffic limit"))
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 2, figsize=(18, 5 * len(panels)), gridspec_kw={"width_ratios": [3, 1.4]},
                             squeeze=False)
    for (ax, ax_floor), (name, labels, series, floors, floor_label) in zip(axes, panels):
        n = len(labels)
        width = 0.8 / len(series)
        for i, (label, vals) in enumerate(series):
            ax.bar([j + i * width for j in range(n)], [v or 0 for v in vals], width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(n)])
        ax.set_xticklabels(labels, fontsize=6, rotation=90)
        ax.set_yscale("log")
        ax.set_ylabel("ms per step (log)")
        ax.set_title(f"{name}: optimizer step time, {results['meta']['date']}")
        ax.legend(fontsize=7)
        width = 0.8 / len(floors)
        for i, (label, vals) in enumerate(floors):
            ax_floor.barh([j + i * width for j in range(n)], [v or 0 for v in vals], width, label=label)
        ax_floor.axvline(100, color="black", linewidth=0.8)
        ax_floor.set_yticks([j + 0.4 - width / 2 for j in range(n)])
        ax_floor.set_yticklabels([l.replace("\n", " ") for l in labels], fontsize=6)
        ax_floor.invert_yaxis()
        ax_floor.set_xlabel(f"renaissance: {floor_label}")
        ax_floor.set_title(f"{name}: {floor_label} per kind (100% = the limit)")
        ax_floor.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
