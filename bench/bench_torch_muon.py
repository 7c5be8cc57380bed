#!/usr/bin/env python3
"""Muon's step against torch's, side by side in one run (CUDA events on a GPU, wall time on a CPU).

For a layout (data/layouts or a JSON file), the Muon matrices are the weight-role tensors viewed as
(shape[0], prod(shape[1:])) except those whose names match --aux (embeddings by default); every
other tensor takes the auxiliary AdamW. Timed, each as the median over --steps steps after
--warmup:
- torch: torch.optim.Muon over the matrices (2-D tensors of those shapes) + torch.optim.AdamW over
  the rest (fused on CUDA, foreach on the CPU), given fixed gradients;
- the same Newton-Schulz products alone, bf16, batched by shape class with torch.baddbmm (the
  GEMM floor the issue's fast mode is measured against), with its TFLOP/s;
- ours: bench_step --kinds muon on a copy of the layout whose aux tensors carry
  "optimizer": "adamw" (or, with --aux-role, a bias-like role), in each --muon-mode given.
Prints a table, and the rows as JSON with --json FILE. With --phases (CUDA) bench_step also times
each phase of ours (bench_step --muon-phases: momentum, each Newton-Schulz phase per shape class,
the update, the aux AdamW), printed after the table and kept in the JSON as "phases".
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare_torch  # noqa: E402  (bench/: the timing of the other comparisons)

NS = (3.4445, -4.7750, 2.0315)
WEIGHT_ROLES = ("fc_weight", "first_conv", "deep_conv")  # the weight group; the rest are bias-like


def load_layout(name):
    path = name if os.path.exists(name) else os.path.join(HERE, "..", "data", "layouts", name + ".json")
    with open(path) as f:
        return json.load(f)


def split_params(layout, aux_pattern):
    aux_re = re.compile(aux_pattern) if aux_pattern else None
    matrices, aux = [], []
    for p in layout["params"]:
        shape = p["shape"]
        weight = p["role"] in WEIGHT_ROLES and len(shape) >= 2
        if weight and not (aux_re and aux_re.search(p["name"])):
            matrices.append((shape[0], math.prod(shape[1:])))
        else:
            aux.append(tuple(shape))
    return matrices, aux


def marked_layout(layout, aux_pattern, aux_role):
    """The layout with its aux weight tensors marked for the auxiliary AdamW."""
    aux_re = re.compile(aux_pattern) if aux_pattern else None
    out = {"name": layout["name"] + "_muon", "params": []}
    for p in layout["params"]:
        q = dict(p)
        if p["role"] in WEIGHT_ROLES and aux_re and aux_re.search(p["name"]):
            if aux_role:
                q["role"] = aux_role
            else:
                q["optimizer"] = "adamw"
        out["params"].append(q)
    return out


def timer(device):
    """compare_torch's timing: CUDA events around each step and one sync at the end (as bench_step's
    enqueued timing), or a steady clock around each synchronous CPU step."""
    compare_torch.torch = torch
    if device == "cuda":
        return lambda fn, steps, warmup: compare_torch.time_cuda(fn, steps, synced=False)
    return lambda fn, steps, warmup: compare_torch.median_host_ms(fn, steps, warmup)


def torch_step_ms(matrices, aux, device, steps, warmup):
    gen = torch.Generator(device="cpu").manual_seed(0)

    def make(shape):
        p = torch.nn.Parameter(torch.randn(shape, generator=gen).mul_(0.02).to(device))
        p.grad = torch.randn(shape, generator=gen).mul_(1e-3).to(device)
        return p

    mats = [make(s) for s in matrices]
    rest = [make(s) for s in aux]
    muon = torch.optim.Muon(mats, lr=0.02, weight_decay=0.1)
    fused = {"fused": True} if device == "cuda" else {"foreach": True}
    adamw = torch.optim.AdamW(rest, lr=3e-4, weight_decay=0.0, **fused) if rest else None
    run = timer(device)
    muon_ms = run(lambda: muon.step(), steps, warmup)
    adamw_ms = run(lambda: adamw.step(), steps, warmup) if adamw else 0.0
    return muon_ms, adamw_ms


def batched_gemm_ms(matrices, device, steps, warmup, ns_steps=5):
    """The Newton-Schulz products alone, bf16, one baddbmm chain per shape class."""
    classes = {}
    for r, c in matrices:
        key = (min(r, c), max(r, c))
        classes[key] = classes.get(key, 0) + 1
    a, b, c_ = NS
    xs = {k: torch.randn(n, k[0], k[1], device=device, dtype=torch.bfloat16) * 0.01 for k, n in classes.items()}
    flops = 0
    for (r, c), n in classes.items():
        flops += n * ns_steps * (2 * r * r * c + 2 * r * r * r + 2 * r * r * c)

    def chain():
        for x in xs.values():
            for _ in range(ns_steps):
                gram = torch.bmm(x, x.transpose(1, 2))
                poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c_)
                x = torch.baddbmm(x, poly, x, beta=a)

    ms = timer(device)(chain, steps, warmup)
    return ms, flops, sorted(classes.items())


def ours_ms(bench_step, layout_path, backend, mode, steps, warmup, threads, phases=False):
    """mode: exact or fast, with "+batches" for BackendOptions::cuda_muon_batches (the default) or
    without it for one matrix after another. phases: bench_step --muon-phases; its table lines are
    returned in the row as "phases"."""
    cmd = [bench_step, "--backend", backend, "--layouts", layout_path, "--kinds", "muon", "--check", "on",
           "--replays", str(steps), "--warmup", str(warmup), "--timing", "enqueued"]
    if phases:
        cmd += ["--muon-phases"]
    base, _, extra = mode.partition("+")
    if base != "exact":
        cmd += ["--muon-mode", base]
    cmd += ["--cuda-muon-batches" if extra == "batches" else "--no-cuda-muon-batches"]
    if backend == "cpu":
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None, (out.stderr.strip() or out.stdout.strip())[-400:]
    lines = out.stdout.splitlines()
    for line in lines:
        if line.startswith("{"):
            row = json.loads(line)
            if phases:
                row["phases"] = [l for l in lines if not l.startswith("{")]
            return row.get("ms_per_step") or row.get("ms_per_step_enqueued"), row
    return None, out.stdout[-400:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default="gpt2_small", help="comma-separated layout names or JSON files")
    ap.add_argument("--aux", default=r"wte|wpe|embeddings",
                    help="regex of weight tensors that take the auxiliary AdamW (default: embeddings)")
    ap.add_argument("--aux-role", default="", help="mark aux tensors with this bias-like role instead of optimizer=adamw")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for both sides (0: torch's default)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bench-step", default="", help="bench_step binary: time ours beside torch")
    ap.add_argument("--muon-modes", default="exact",
                    help="comma-separated modes for ours: exact, fast, with +batches for cuBLASLt batches "
                         "(e.g. exact,exact+batches,fast+batches)")
    ap.add_argument("--phases", action="store_true",
                    help="CUDA: also time each phase of ours (bench_step --muon-phases) and print the tables")
    ap.add_argument("--json", default="", help="write the rows here")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rows = []
    print(f"{'layout':<14} {'matrices':>8} {'torch Muon':>11} {'+AdamW':>8} {'torch total':>11} {'bf16 GEMMs':>11} "
          f"{'TFLOP/s':>8}  ours (ms, x torch)")
    for name in args.layouts.split(","):
        layout = load_layout(name)
        matrices, aux = split_params(layout, args.aux)
        muon_ms, adamw_ms = torch_step_ms(matrices, aux, args.device, args.steps, args.warmup)
        gemm_ms, flops, classes = (batched_gemm_ms(matrices, args.device, args.steps, args.warmup)
                                   if args.device == "cuda" else (float("nan"), 0, []))
        row = {"layout": layout["name"], "device": args.device, "threads": args.threads,
               "muon_matrices": len(matrices), "muon_params": sum(r * c for r, c in matrices),
               "aux_params": sum(math.prod(s) for s in aux), "classes": [[k[0], k[1], n] for k, n in classes],
               "torch_muon_ms": muon_ms, "torch_adamw_ms": adamw_ms, "torch_total_ms": muon_ms + adamw_ms,
               "bf16_gemm_ms": gemm_ms, "ns_tflop": flops / 1e12,
               "bf16_gemm_tflops": flops / (gemm_ms * 1e-3) / 1e12 if gemm_ms == gemm_ms and flops else None,
               "ours": {}}
        ours_text = ""
        if args.bench_step:
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(marked_layout(layout, args.aux, args.aux_role), f)
                path = f.name
            for mode in args.muon_modes.split(","):
                ms, detail = ours_ms(args.bench_step, path, "cuda" if args.device == "cuda" else "cpu", mode,
                                     args.steps, args.warmup, args.threads, args.phases and args.device == "cuda")
                entry = {"ms": ms, "vs_torch": (muon_ms + adamw_ms) / ms if ms else None}
                if ms and detail.get("phases"):
                    entry["phases"] = detail["phases"]
                if ms and flops:
                    entry["tops"] = flops / (ms * 1e-3) / 1e12
                    entry["vs_bf16_gemm"] = ms / gemm_ms
                if ms is None:
                    entry["error"] = detail
                row["ours"][mode] = entry
                ours_text += f"  {mode}: " + (f"{ms:.2f} ({(muon_ms + adamw_ms) / ms:.2f}x)" if ms else "failed")
            os.unlink(path)
        rows.append(row)
        tflops = row["bf16_gemm_tflops"]
        print(f"{layout['name']:<14} {len(matrices):>8} {muon_ms:>11.2f} {adamw_ms:>8.2f} {muon_ms + adamw_ms:>11.2f} "
              f"{gemm_ms:>11.2f} {(tflops or float('nan')):>8.1f} {ours_text}")
        sys.stdout.flush()
    for row in rows:
        for mode, entry in row["ours"].items():
            if entry.get("phases"):
                print(f"\n{row['layout']} {mode} (the same-class bf16 GEMMs alone: {row['bf16_gemm_ms']:.3f} ms)")
                print("\n".join(entry["phases"]))
    for row in rows:
        for mode, entry in row["ours"].items():
            if entry.get("error"):
                print(f"{row['layout']} {mode}: {entry['error']}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
