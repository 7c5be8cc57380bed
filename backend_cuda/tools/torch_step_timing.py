"""Times PyTorch's own optimizer steps on the same layouts as cuda_step_timing (issue 4 asks for
torch measured on the same machine in the same run): fused, and fused + capturable + CUDA graph;
timm's Lars for LARS. Median of CUDA-event-timed steps after a warm-up.

    python3 torch_step_timing.py LAYOUT_DIR
"""
import json
import statistics
import sys

import torch


def layout_params(path):
    with open(path) as f:
        doc = json.load(f)
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = []
    for p in doc["params"]:
        t = torch.rand(p["shape"], device="cuda", generator=gen) * 2 - 1
        t.requires_grad_(True)
        t.grad = (torch.rand(p["shape"], device="cuda", generator=gen) * 2 - 1) * 1e-2
        params.append(t)
    return params


def time_steps(fn, steps=100, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def graphed(opt):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step()
    return graph.replay


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "../shared/layouts"
    rows = []
    cases = [
        ("adamw", "resnet50", lambda ps, **k: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True, **k)),
        ("adamw", "gpt2_small", lambda ps, **k: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True, **k)),
        ("sgd_momentum", "resnet50",
         lambda ps, **k: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4, fused=True)),
    ]
    for kind, name, make in cases:
        for mode in ("fused", "fused+capturable+graph"):
            try:
                params = layout_params(f"{root}/{name}.json")
                if mode == "fused":
                    opt = make(params)
                    ms = time_steps(opt.step)
                else:
                    opt = make(params, capturable=True) if kind == "adamw" else make(params)
                    ms = time_steps(graphed(opt))
                rows.append((kind, name, mode, f"{ms:.4f}"))
            except Exception as e:  # report and go on: one failing mode must not hide the others
                rows.append((kind, name, mode, f"error: {type(e).__name__}: {e}"[:80]))
            del params
            torch.cuda.empty_cache()
    try:
        from timm.optim import Lars
        params = layout_params(f"{root}/resnet50.json")
        opt = Lars(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
        rows.append(("lars", "resnet50", "timm Lars", f"{time_steps(opt.step, steps=30):.4f}"))
    except Exception as e:
        rows.append(("lars", "resnet50", "timm Lars", f"error: {type(e).__name__}: {e}"[:80]))
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: median step ms")
    for r in rows:
        print(f"{r[0]:<13} {r[1]:<11} {r[2]:<24} {r[3]}")


if __name__ == "__main__":
    main()
