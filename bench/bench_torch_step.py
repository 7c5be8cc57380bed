#!/usr/bin/env python3
"""The optimizer step inside a real training step, on the GPU: renaissance.torch.AdamW against
torch.optim.AdamW(fused=True), both timed the same way: CUDA events on torch's current stream
around opt.step() in each iteration (zero_grad, forward, backward, step), median over the timed
iterations after a warm-up; the whole iteration too. Models: resnet50 (torchvision, batch 32 at
224x224; `resnet50:64` for batch 64) and GPT-2 small (transformers' GPT2Config(), random init,
batch 8 x 512 tokens). Ours is
also timed with two param groups (decay for ndim > 1, none for the rest: the usual recipe) and
with one param group per tensor: groups of one structure are hyperparameter groups of ONE Task
(one graph whatever the number of groups; the target: a group per tensor within 10 % of
two groups, printed as a ratio per model).

--phases (where does the whole iteration lose against torch?): every phase of the
iteration timed with CUDA events (zero_grad, forward + loss, backward, step) and on the host's
clock (how long the host took to enqueue it), for four ways of clearing the gradients, the four
models built side by side and run interleaved (rounds in rotated order, medians of every timed
iteration), two ways: enqueued (the iterations of a round back to back, one sync at the end) and
synced (a sync after every iteration, as the table above):
  torch fused, set_to_none=True    torch 2.x's default: backward hands its fresh gradient over
  torch fused, set_to_none=False   zeroed in place; backward ADDS into the kept .grad
  renaissance, zero_grad()         ours, the default (set_to_none=True, as torch): .grad set to None;
                                   step() reads autograd's fresh gradients in place (the Task's
                                   gradient table: no copy, no zeroing)
  renaissance, set_to_none=False   G zeroed in place in the arena; backward adds into the views
--profile: per variant, the CUDA kernels of 3 iterations by name (torch.profiler), and the kernels
whose time differs most from the first variant's.
--bench-step PATH (with --phases): also the C++ bench_step time of each phase model's layout
(adamw, check on, enqueued medians) and, last, a short table against the targets: ours
with the default zero_grad() within 5 % of bench_step on the step, and the whole iteration
(enqueued) never slower than torch fused with torch's default zero_grad(); then one verdict line.

usage: python3 bench/bench_torch_step.py [--iters 20] [--warmup 5] [--models resnet50,gpt2_small]
            [--phases] [--no-sides] [--rounds 5] [--phase-iters 10] [--profile] [--json-out FILE]
            [--bench-step BUILD/bench/bench_step]
       python3 bench/bench_torch_step.py --quick [--phases --profile]   (CPU, tiny stand-in models:
            tests the script; torch's foreach AdamW stands in where this torch has no fused one)
Needs a CUDA build of the package (`scripts/gpu.sh python` installs one into build-gpu-python/site;
`scripts/gpu.sh torchbench:step` runs this script with it).
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings

import torch

STAND_INS = set()  # what a CPU run used instead of a torch feature it lacks (never on CUDA)


def resnet50(device, batch=32):
    import torchvision
    model = torchvision.models.resnet50()
    x = torch.randn(batch, 3, 224, 224, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)
    return model, lambda m: torch.nn.functional.cross_entropy(m(x), y)


def gpt2_small(device, batch=8):
    import transformers
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    ids = torch.randint(0, 50257, (batch, 512), device=device)
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def tiny_cnn(device, batch=4):
    """--quick's stand-in for resnet50: conv, batch norm, linear (weights and bias-like tensors)."""
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    x = torch.randn(batch, 3, 16, 16, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return model, lambda m: torch.nn.functional.cross_entropy(m(x), y)


class TinyLM(torch.nn.Module):
    """--quick's stand-in for GPT-2: embedding, two transformer layers, a language-model head."""

    def __init__(self, vocab=100, width=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        layer = torch.nn.TransformerEncoderLayer(width, 2, 64, dropout=0.1, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, 2)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)))


def tiny_lm(device, batch=2):
    ids = torch.randint(0, 100, (batch, 8), device=device)
    return TinyLM(), lambda m: torch.nn.functional.cross_entropy(m(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())


MODELS = {"resnet50": resnet50, "gpt2_small": gpt2_small}
QUICK_MODELS = {"resnet50": tiny_cnn, "gpt2_small": tiny_lm}


def model_maker(spec, quick):
    """'name' or 'name:batch' -> (label, a function device -> (model, loss_of))."""
    name, _, batch = spec.partition(":")
    make = (QUICK_MODELS if quick else MODELS)[name]
    label = spec + (" (tiny stand-in)" if quick else "")
    return label, (lambda device: make(device, int(batch))) if batch else make


def torch_adamw(params, device, **hp):
    try:
        return torch.optim.AdamW(params, fused=True, **hp)
    except TypeError:  # torch 1.13: no fused AdamW (on CUDA that is an error)
        if device == "cuda":
            raise
        STAND_INS.add("torch's foreach AdamW for the fused one (torch %s has none)" % torch.__version__)
        return torch.optim.AdamW(params, foreach=True, **hp)


class Clock:
    """Marks on torch's current stream (CUDA events) and on the host's clock; on the CPU the step
    is synchronous and the host's clock is the device's."""

    def __init__(self, device):
        self.cuda = device == "cuda"

    def mark(self):
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return event, time.perf_counter()

    def device_ms(self, a, b):
        return a[0].elapsed_time(b[0]) if self.cuda else (b[1] - a[1]) * 1e3

    @staticmethod
    def host_ms(a, b):
        return (b[1] - a[1]) * 1e3

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def time_optimizer(make_model, make_opt, iters, warmup, device):
    torch.manual_seed(0)
    model, loss_of = make_model(device)
    model = model.to(device)
    opt = make_opt(model)
    clock = Clock(device)
    step_ms, iter_ms = [], []
    for i in range(warmup + iters):
        e0 = clock.mark()
        opt.zero_grad()
        loss_of(model).backward()
        e1 = clock.mark()
        opt.step()
        e2 = clock.mark()
        if i >= warmup:
            clock.sync()
            step_ms.append(clock.device_ms(e1, e2))
            iter_ms.append(clock.device_ms(e0, e2))
    clock.sync()
    n = sum(p.numel() for p in model.parameters())
    return {"params": n, "tensors": len(list(model.parameters())), "step_ms": statistics.median(step_ms),
            "iter_ms": statistics.median(iter_ms)}


def run_sides(args, device, hp, rt, results):
    threads = {"threads": 1} if device == "cpu" else {}  # the loaded 2-core machine: see phase_variants
    sides = {
        "torch AdamW fused": lambda m: torch_adamw(m.parameters(), device, **hp),
        "renaissance AdamW": lambda m: rt.AdamW(m.parameters(), **hp, **threads),
        "renaissance AdamW, two groups": lambda m: rt.AdamW(
            [{"params": [p for p in m.parameters() if p.dim() > 1]},
             {"params": [p for p in m.parameters() if p.dim() <= 1], "weight_decay": 0.0}], **hp, **threads),
        "renaissance AdamW, a group per tensor": lambda m: rt.AdamW([{"params": [p]} for p in m.parameters()], **hp,
                                                                    **threads),
    }
    print("%-12s %-40s %12s %14s %12s" % ("model", "optimizer", "params", "step ms (med)", "iter ms"))
    for spec in args.models.split(","):
        name, make_model = model_maker(spec, args.quick)
        for side, make_opt in sides.items():
            try:
                r = time_optimizer(make_model, make_opt, args.iters, args.warmup, device)
            except ImportError as e:
                print("%-12s skipped: %s" % (name, e))
                break
            r.update(model=name, optimizer=side)
            results.append(r)
            print("%-12s %-40s %12d %14.3f %12.3f" % (name, side, r["params"], r["step_ms"], r["iter_ms"]))
            sys.stdout.flush()
        by_side = {r["optimizer"]: r["step_ms"] for r in results if r["model"] == name}
        two, per_tensor = by_side.get("renaissance AdamW, two groups"), by_side.get("renaissance AdamW, a group per tensor")
        if two and per_tensor:
            print("%-12s a group per tensor / two groups: %.3f (target <= 1.10)" % (name, per_tensor / two))


# ---- --phases ---------------------------------------------------------------------------------
PHASES = ("zero_grad", "forward", "backward", "step")


def phase_variants(device, hp, rt):
    """name -> (make the optimizer from the model, clear the gradients)."""
    ours = {"threads": 1} if device == "cpu" else {}  # CPU: one thread; a second waits for a core here
    return {
        "torch fused, set_to_none=True": (lambda m: torch_adamw(m.parameters(), device, **hp),
                                          lambda opt, params: opt.zero_grad(set_to_none=True)),
        "torch fused, set_to_none=False": (lambda m: torch_adamw(m.parameters(), device, **hp),
                                           lambda opt, params: opt.zero_grad(set_to_none=False)),
        "renaissance, zero_grad()": (lambda m: rt.AdamW(m.parameters(), **hp, **ours),
                                     lambda opt, params: opt.zero_grad()),
        "renaissance, set_to_none=False": (lambda m: rt.AdamW(m.parameters(), **hp, **ours),
                                           lambda opt, params: opt.zero_grad(set_to_none=False)),
    }


def iteration(v, clock):
    """One training iteration with a mark between the phases: 5 marks."""
    m = [clock.mark()]
    v["zero"](v["opt"], v["params"])
    m.append(clock.mark())
    loss = v["loss_of"](v["model"])
    m.append(clock.mark())
    loss.backward()
    m.append(clock.mark())
    v["opt"].step()
    m.append(clock.mark())
    return m


def phase_breakdown(spec, args, device, hp, rt):
    name, make_model = model_maker(spec, args.quick)
    clock = Clock(device)
    variants = []
    for vname, (make_opt, zero) in phase_variants(device, hp, rt).items():
        torch.manual_seed(0)  # the same weights and data for every variant
        model, loss_of = make_model(device)
        model = model.to(device)
        params = list(model.parameters())
        v = dict(name=vname, model=model, loss_of=loss_of, opt=make_opt(model), zero=zero, params=params)
        for _ in range(args.warmup):
            iteration(v, clock)
        clock.sync()
        variants.append(v)
    samples = {v["name"]: {mode: [] for mode in ("enqueued", "synced")} for v in variants}
    for r in range(args.rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:  # rotated: no variant always first
            iteration(v, clock)  # after the switch of model, untimed
            clock.sync()
            for mode in ("enqueued", "synced"):
                marks = []
                for _ in range(args.phase_iters):
                    marks.append(iteration(v, clock))
                    if mode == "synced":
                        clock.sync()
                clock.sync()
                for m in marks:
                    samples[v["name"]][mode].append(
                        [clock.device_ms(m[i], m[i + 1]) for i in range(4)] + [clock.device_ms(m[0], m[4]), clock.host_ms(m[0], m[4])]
                        + [clock.host_ms(m[i], m[i + 1]) for i in range(4)])
    out = {"model": name, "params": sum(p.numel() for p in variants[0]["params"]), "variants": {}}
    for vname, modes in samples.items():
        out["variants"][vname] = {}
        for mode, rows in modes.items():
            cols = list(zip(*rows))
            med = [statistics.median(c) for c in cols]
            out["variants"][vname][mode] = dict(zip(PHASES, med[:4]), iteration=med[4], host_iteration=med[5],
                                                **{"host_" + p: x for p, x in zip(PHASES, med[6:])}, n=len(rows))
    if args.profile:
        try:
            out["profile"] = profile_kernels(variants, device)
        except Exception as e:  # a diagnostic: say it failed, keep the timings
            out["profile_error"] = "%s: %s" % (type(e).__name__, e)
    for v in variants:
        v.clear()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def profile_kernels(variants, device, iters=3):
    """variant -> {kernel (CPU: op) name: [calls, ms] per iteration}, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    clock = Clock(device)
    cuda = device == "cuda"
    found = {}
    for v in variants:
        clock.sync()
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(iters):
                iteration(v, clock)
            clock.sync()
        table = {}
        for evt in prof.key_averages():
            if cuda:
                if evt.device_type != torch.autograd.DeviceType.CUDA:
                    continue
                us = getattr(evt, "device_time_total", None)
                us = evt.cuda_time_total if us is None else us
            else:
                us = evt.self_cpu_time_total
            table[evt.key] = [evt.count / iters, us / 1e3 / iters]
        found[v["name"]] = table
    return found


def print_phases(out):
    print("\n### %s (%.1f M params): iteration phases, medians, ms (device: CUDA events; host: time to enqueue)\n"
          % (out["model"], out["params"] / 1e6))
    base_name = next(iter(out["variants"]))
    for mode in ("enqueued", "synced"):
        base = out["variants"][base_name][mode]["iteration"]
        print("| mode | variant | zero_grad | forward | backward | step | iteration | vs first | host: zero_grad / step / iteration |")
        print("|---|---|---|---|---|---|---|---|---|")
        for vname, modes in out["variants"].items():
            r = modes[mode]
            print("| %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %+.2f %% | %.3f / %.3f / %.3f |" % (
                mode, vname, r["zero_grad"], r["forward"], r["backward"], r["step"], r["iteration"],
                100 * (r["iteration"] / base - 1), r["host_zero_grad"], r["host_step"], r["host_iteration"]))
        print()
    if "profile_error" in out:
        print("profile FAILED: %s" % out["profile_error"])
    if "profile" in out:
        prof = out["profile"]
        base = prof[base_name]
        for vname, table in prof.items():
            if vname == base_name:
                continue
            diffs = []
            for k in set(table) | set(base):
                a, b = base.get(k, [0, 0.0]), table.get(k, [0, 0.0])
                diffs.append((b[1] - a[1], k, a, b))
            diffs.sort(key=lambda d: -abs(d[0]))
            total = sum(x[1] for x in table.values()) - sum(x[1] for x in base.values())
            print("profile, %s - %s: %+.3f ms of kernel time per iteration; largest differences (calls, ms per iteration):"
                  % (vname, base_name, total))
            for d, k, a, b in diffs[:8]:
                print("  %+8.3f ms  %5.0f -> %5.0f calls  %.3f -> %.3f ms  %s" % (d, a[0], b[0], a[1], b[1], k[:90]))
        print()


def bench_step_ms(path, spec, device, replays=200):
    """The C++ step of a phase model's layout (the built-in layout of that name; the batch does
    not change it): bench_step's enqueued median, adamw with the check on."""
    layout = spec.partition(":")[0]
    cmd = [path, "--backend", device, "--layouts", layout, "--kinds", "adamw", "--check", "on", "--replays",
           str(replays), "--timing", "enqueued"]
    if device == "cpu":
        cmd += ["--threads", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows[-1]["ms_per_step"]


OURS, OURS_ARENA = "renaissance, zero_grad()", "renaissance, set_to_none=False"
TORCH, TORCH_KEPT = "torch fused, set_to_none=True", "torch fused, set_to_none=False"


def print_targets(phases):
    """The short table of the targets (enqueued medians) and one verdict line; returns
    whether every target is met."""
    print("\n### targets (enqueued medians, ms)\n")
    print("| model | bench_step | ours step (default zero_grad) | / bench_step (<= 1.05) | ours step, set_to_none=False "
          "| torch fused step | ours iteration | torch fused iteration | ours vs torch (<= 0 %) |")
    print("|---|---|---|---|---|---|---|---|---|")
    met = True
    for out in phases:
        v = {name: modes["enqueued"] for name, modes in out["variants"].items()}
        cpp = out.get("bench_step_ms")
        ratio = v[OURS]["step"] / cpp if cpp else float("nan")
        diff = 100 * (v[OURS]["iteration"] / v[TORCH]["iteration"] - 1)
        met = met and cpp is not None and ratio <= 1.05 and diff <= 0.0
        print("| %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %+.2f %% |" % (
            out["model"], "%.3f" % cpp if cpp else "n/a", v[OURS]["step"], ratio, v[OURS_ARENA]["step"],
            v[TORCH]["step"], v[OURS]["iteration"], v[TORCH]["iteration"], diff))
    print()
    if met:
        print("bench_torch_step: SUCCESS: the default zero_grad() step is within 5 % of bench_step and the iteration "
              "is not slower than torch fused, on every model")
    else:
        print("bench_torch_step: NOT MET: see the table above (step / bench_step > 1.05, or the iteration slower "
              "than torch fused)")
    return met


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="resnet50,gpt2_small", help="NAME or NAME:BATCH (resnet50 32, gpt2_small 8)")
    ap.add_argument("--json-out")
    ap.add_argument("--phases", action="store_true", help="also the phase breakdown of the whole iteration")
    ap.add_argument("--no-sides", action="store_true", help="skip the step table (only --phases)")
    ap.add_argument("--phase-models", help="models of --phases (default: --models)")
    ap.add_argument("--rounds", type=int, default=5, help="--phases: interleaved rounds")
    ap.add_argument("--phase-iters", type=int, default=10, help="--phases: timed iterations per round, variant and mode")
    ap.add_argument("--profile", action="store_true", help="--phases: also the kernels per variant (torch.profiler)")
    ap.add_argument("--quick", action="store_true", help="CPU, tiny stand-in models, few iterations (tests the script)")
    ap.add_argument("--bench-step", help="--phases: the bench_step binary; adds the C++ step and the targets' table")
    args = ap.parse_args()
    if args.quick:
        device = "cpu"
        args.iters, args.warmup, args.rounds, args.phase_iters = 3, 1, 2, 2
    else:
        device = "cuda"
        if not torch.cuda.is_available():
            print("bench_torch_step: no CUDA device (--quick runs the CPU check of the script)")
            return 1
    import renaissance
    import renaissance.torch as rt
    if device == "cuda" and not renaissance.with_cuda:
        print("bench_torch_step: this renaissance build has no CUDA backend")
        return 1
    # The copy-in of the None-gradient variant warns once by design; the rest stays loud.
    warnings.filterwarnings("ignore", message="renaissance.torch: a parameter's .grad is not")
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    results, phases = [], []

    def save():  # after each part: a run cut short keeps what it measured
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "stand_ins": sorted(STAND_INS), "results": results, "phases": phases}, f, indent=1)
    if not args.no_sides:
        run_sides(args, device, hp, rt, results)
        save()
    if args.phases:
        for spec in (args.phase_models or args.models).split(","):
            try:
                out = phase_breakdown(spec, args, device, hp, rt)
            except ImportError as e:
                print("%s: phases skipped: %s" % (spec, e))
                continue
            if args.bench_step and not args.quick:
                out["bench_step_ms"] = bench_step_ms(args.bench_step, spec, device)
            elif args.bench_step:  # the tiny stand-ins are not the built-in layouts: no C++ figure
                out["bench_step_ms"] = None
            phases.append(out)
            save()
            print_phases(out)
            sys.stdout.flush()
    for note in sorted(STAND_INS):
        print("CPU stand-in: %s" % note)
    save()
    if args.phases and args.bench_step and phases:
        print_targets(phases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
