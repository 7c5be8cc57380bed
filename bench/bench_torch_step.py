#!/usr/bin/env python3
"""The optimizer step inside a real training step, on the GPU: renaissance.torch.AdamW against
torch.optim.AdamW(fused=True), both timed the same way: CUDA events on torch's current stream
around opt.step() in each iteration (zero_grad, forward, backward, step), median over the timed
iterations after a warm-up; the whole iteration too. Models: resnet50 (torchvision, batch 32 at
224x224) and GPT-2 small (transformers' GPT2Config(), random init, batch 8 x 512 tokens). Ours is
also timed with two param groups (decay for ndim > 1, none for the rest: the usual recipe) and
with one param group per tensor: groups of one structure are hyperparameter groups of ONE Task
(one graph whatever the number of groups; issue 13's target: a group per tensor within 10 % of
two groups, printed as a ratio per model).

usage: python3 bench/bench_torch_step.py [--iters 20] [--warmup 5] [--models resnet50,gpt2_small]
                                         [--json-out FILE]
Needs a CUDA build of the package (scripts/gpu_python.sh installs one; PYTHONPATH=BUILD/site).
"""
import argparse
import json
import statistics
import sys

import torch


def resnet50():
    import torchvision
    model = torchvision.models.resnet50()
    x = torch.randn(32, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (32,), device="cuda")
    return model, lambda m: torch.nn.functional.cross_entropy(m(x), y)


def gpt2_small():
    import transformers
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    ids = torch.randint(0, 50257, (8, 512), device="cuda")
    return model, lambda m: m(input_ids=ids, labels=ids).loss


MODELS = {"resnet50": resnet50, "gpt2_small": gpt2_small}


def time_optimizer(make_model, make_opt, iters, warmup):
    torch.manual_seed(0)
    model, loss_of = make_model()
    model = model.cuda()
    opt = make_opt(model)
    step_ms, iter_ms = [], []
    for i in range(warmup + iters):
        e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        e[0].record()
        opt.zero_grad()
        loss_of(model).backward()
        e[1].record()
        opt.step()
        e[2].record()
        if i >= warmup:
            torch.cuda.synchronize()
            step_ms.append(e[1].elapsed_time(e[2]))
            iter_ms.append(e[0].elapsed_time(e[2]))
    torch.cuda.synchronize()
    n = sum(p.numel() for p in model.parameters())
    return {"params": n, "tensors": len(list(model.parameters())), "step_ms": statistics.median(step_ms),
            "iter_ms": statistics.median(iter_ms)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="resnet50,gpt2_small")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_torch_step: no CUDA device")
        return 1
    import renaissance
    import renaissance.torch as rt
    if not renaissance.with_cuda:
        print("bench_torch_step: this renaissance build has no CUDA backend")
        return 1
    hp = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    sides = {
        "torch AdamW fused": lambda m: torch.optim.AdamW(m.parameters(), fused=True, **hp),
        "renaissance AdamW": lambda m: rt.AdamW(m.parameters(), **hp),
        "renaissance AdamW, two groups": lambda m: rt.AdamW(
            [{"params": [p for p in m.parameters() if p.dim() > 1]},
             {"params": [p for p in m.parameters() if p.dim() <= 1], "weight_decay": 0.0}], **hp),
        "renaissance AdamW, a group per tensor": lambda m: rt.AdamW([{"params": [p]} for p in m.parameters()], **hp),
    }
    results = []
    print("%-12s %-40s %12s %14s %12s" % ("model", "optimizer", "params", "step ms (med)", "iter ms"))
    for name in args.models.split(","):
        for side, make_opt in sides.items():
            try:
                r = time_optimizer(MODELS[name], make_opt, args.iters, args.warmup)
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
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
