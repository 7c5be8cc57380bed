#!/usr/bin/env python3
"""Records a replay case (format 2) with renaissance.torch.Recorder for testdata/recorded/.

A small MLP on a fixed synthetic batch (drawn on the host from a seeded generator, so every
machine trains on the same numbers; no data set needed), two parameter groups (the hidden layer, and the output layer with its own lr and no weight decay),
AdamW, a StepLR schedule, 3 unrecorded steps (so the case starts from a real optimizer state),
then 5 recorded steps. The case's expected_fingerprint is what the recording run ended with;
`renaissance replay CASE` on any machine must reproduce it bit for bit.

    /usr/bin/python3 scripts/record_torch_case.py --out testdata/recorded/torch_adamw_h200 --device cuda
    /usr/bin/python3 scripts/record_torch_case.py --out testdata/recorded/torch_adamw_cpu --standin
    /usr/bin/python3 scripts/record_torch_case.py --out testdata/recorded/torch_adamw_clip_cpu --max-grad-norm 0.1
    /usr/bin/python3 scripts/record_torch_case.py --out testdata/recorded/torch_adamw_frozen_cpu --freeze-alternate
    scripts/gpu.sh python (GPU machine: --device cuda --freeze-alternate, replayed on the CPU backend)

--freeze-alternate leaves the hidden layer without gradients (.grad = None) at every odd step,
unrecorded ones included, so the case starts with per-tensor step counts that differ and masks
that layer in some recorded steps (no_grad_per_step).

--standin records with tests/python/recorder_standin.StandinAdamW (host copies, CPU only) in
place of renaissance.torch.AdamW, for a machine where renaissance.torch is not there yet.
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the case folder to write (must not be a non-empty folder)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--standin", action="store_true", help="use the test stand-in optimizer (CPU only)")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--max-grad-norm", type=float, default=None,
                    help="clip over both groups (one shared Task): testdata/recorded/torch_adamw_clip_cpu")
    ap.add_argument("--freeze-alternate", action="store_true",
                    help="no gradient for the hidden layer at odd steps: testdata/recorded/torch_adamw_frozen_cpu")
    args = ap.parse_args()

    from renaissance.recorder import Recorder
    if args.standin:
        if args.device != "cpu":
            sys.exit("--standin runs on the CPU only")
        sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
        from recorder_standin import StandinAdamW as AdamW
    else:
        from renaissance.torch import AdamW

    torch.manual_seed(1234)
    x = torch.rand(128, 64).to(args.device)
    y = torch.randint(0, 10, (128,)).to(args.device)
    model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10)).to(args.device)
    opt = AdamW([{"params": model[0].parameters()},
                 {"params": model[2].parameters(), "lr": 1e-2, "weight_decay": 0.0}], lr=3e-3, weight_decay=0.05,
                **({} if args.max_grad_norm is None else {"max_grad_norm": args.max_grad_norm}))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.7)

    counter = [0]

    def train(steps):
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if args.freeze_alternate and counter[0] % 2 == 1:
                for p in model[0].parameters():
                    p.grad = None  # torch skips it, and so does the optimizer's per-tensor mask
            counter[0] += 1
            opt.step()
            sched.step()

    train(3)
    with Recorder(opt, args.out, steps=5, overwrite=args.overwrite) as rec:
        train(5)
    print(f"recorded {args.out}: 5 steps, 2 groups, fingerprint {rec.fingerprint}")


if __name__ == "__main__":
    main()
