"""Shared by the one-GPU smoke scripts (*_cuda_smoke.py, run by `scripts/gpu.sh python`): their
parameter shapes and the main loop that runs each case in both grad_reduce modes inside a
torch.distributed NCCL world of one rank."""
import os
import tempfile

import torch
import torch.distributed as dist

SHAPES = [(256, 128), (128,), (64, 32, 3, 3), (300,)]
MODES = ("replicated", "ordered")


def cuda_params(dtype):
    """The parameters of SHAPES on the GPU in `dtype`, from a fixed seed."""
    g = torch.Generator().manual_seed(1)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(dtype).cuda()) for s in SHAPES]


def one_rank_world_main(title, cases, check):
    """Runs check(case, work) once per case (work: a scratch folder); it returns a function of the
    grad_reduce mode giving (ok, detail). Prints a line per (case, mode), then
    "TITLE: PASS (N cases)" or "TITLE: FAIL (...)"; returns the exit status."""
    if not torch.cuda.is_available():
        print("%s: no GPU" % title)
        return 1
    torch.cuda.set_device(0)
    work = tempfile.mkdtemp()
    dist.init_process_group("nccl", init_method="file://" + os.path.join(work, "init"), rank=0, world_size=1)
    failures = []
    for case in cases:
        name = case[0]
        in_mode = check(case, work)
        for mode in MODES:
            ok, detail = in_mode(mode)
            print("%-13s %-10s %s %s" % (name, mode, detail, "ok" if ok else "DIFFERS"))
            if not ok:
                failures.append("%s/%s" % (name, mode))
    dist.destroy_process_group()
    if failures:
        print("%s: FAIL (%s)" % (title, ", ".join(failures)))
        return 1
    print("%s: PASS (%d cases)" % (title, len(MODES) * len(cases)))
    return 0
