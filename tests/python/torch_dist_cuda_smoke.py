"""GPU smoke test of renaissance.torch with a torch.distributed NCCL process group (issue #16,
docs/distributed.md, "torch.distributed"): a world of ONE rank on one GPU, so it runs on the
one-GPU device machine. It exercises the CUDA path of the Python communicator (device views,
NCCL broadcasts and max, the staging copies and the workspace through torch) and checks that
the sharded step at K = 1 gives the plain CUDA optimizer's bits (replicated and ordered: the mean
of one rank is its gradient, exactly). K >= 2 on GPUs is not tested anywhere yet.

Not collected by pytest (no test_ prefix): `scripts/gpu.sh python` runs it after the pytest suite,
on its CUDA install of the package; by hand on that install:
    PYTHONPATH=build-gpu-python/site python3 tests/python/torch_dist_cuda_smoke.py
Last line: "torch_dist cuda smoke: PASS (N cases)" or "... FAIL ..." (exit status 1).
"""
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import renaissance.torch as rt

SHAPES = [(256, 128), (128,), (64, 32, 3, 3), (300,)]
CASES = [
    ("sgd", rt.SGD, dict(lr=0.1, momentum=0.9), torch.float32),
    ("adamw", rt.AdamW, dict(lr=1e-2, weight_decay=0.05), torch.float32),
    ("lamb_clip", rt.LAMB, dict(lr=1e-2, max_grad_norm=1.0), torch.float32),
    ("lars", rt.LARS, dict(lr=0.1), torch.float32),
    ("adamw_bf16", rt.AdamW, dict(lr=1e-2), torch.bfloat16),
]


def run(cls, kw, dtype, **dist_kw):
    g = torch.Generator().manual_seed(1)
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g).to(dtype).cuda()) for s in SHAPES]
    opt = cls(ps, **kw, **dist_kw)
    for step in range(3):
        gg = torch.Generator().manual_seed(100 + step)
        for p in ps:
            grad = torch.randn(*p.shape, generator=gg).to(dtype)
            if step == 1 and p is ps[0]:
                grad[0, 0] = float("inf")  # a skipped step: the non-finite flag's max
            p.grad.copy_(grad.cuda())
        opt.step()
    torch.cuda.synchronize()
    return [p.detach().cpu() for p in ps], opt.fingerprint()


def main():
    if not torch.cuda.is_available():
        print("torch_dist cuda smoke: no GPU")
        return 1
    torch.cuda.set_device(0)
    init = os.path.join(tempfile.mkdtemp(), "init")
    dist.init_process_group("nccl", init_method="file://" + init, rank=0, world_size=1)
    failures = []
    for name, cls, kw, dtype in CASES:
        want_p, want_fp = run(cls, kw, dtype)
        for mode in ("replicated", "ordered"):
            got_p, got_fp = run(cls, kw, dtype, process_group=dist.group.WORLD, grad_reduce=mode)
            same = all(torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                                   b.view(torch.int16 if b.element_size() == 2 else torch.int32))
                       for a, b in zip(got_p, want_p))
            ok = same and got_fp == want_fp
            print("%-11s %-10s plain %s sharded %s %s" % (name, mode, want_fp, got_fp, "ok" if ok else "DIFFERS"))
            if not ok:
                failures.append("%s/%s" % (name, mode))
    dist.destroy_process_group()
    if failures:
        print("torch_dist cuda smoke: FAIL (%s)" % ", ".join(failures))
        return 1
    print("torch_dist cuda smoke: PASS (%d cases)" % (2 * len(CASES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
