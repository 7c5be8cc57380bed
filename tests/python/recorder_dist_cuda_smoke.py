"""GPU smoke test of renaissance.torch.Recorder under a torch.distributed NCCL process group
(recorder.py, "Under a torch.distributed process group"): a world of ONE rank on one
GPU. It exercises the CUDA side of the Recorder's own collectives (the int64 agreement words and
the ordered gradients' gather go through NCCL on the device) and the gathered reads of a CUDA
sharded Task; each case, recorded on the GPU with a None-gradient step, must replay on the CPU
to its expected_fingerprint, which must be the plain CUDA optimizer's (no process group).

Not collected by pytest (no test_ prefix): `scripts/gpu.sh python` runs it after the pytest suite,
on its CUDA install of the package; by hand on that install:
    PYTHONPATH=build-gpu-python/site python3 tests/python/recorder_dist_cuda_smoke.py
Last line: "recorder_dist cuda smoke: PASS (N cases)" or "... FAIL ..." (exit status 1).
"""
import os
import sys

import torch
import torch.distributed as dist

import renaissance
import renaissance.torch as rt
from cuda_smoke_util import cuda_params, one_rank_world_main
CASES = [
    ("adamw", rt.AdamW, dict(lr=1e-2, weight_decay=0.05), torch.float32),
    ("lamb_clip", rt.LAMB, dict(lr=1e-2, max_grad_norm=1.0), torch.float32),
    ("adamw_bf16", rt.AdamW, dict(lr=1e-2), torch.bfloat16),
]
STEPS = 3


def run(cls, kw, dtype, case_dir=None, **dist_kw):
    """Two steps, then STEPS recorded ones (when case_dir is given); parameter 1 has no gradient
    at the second recorded step. Returns the final fingerprint."""
    ps = cuda_params(dtype)
    opt = cls(ps, **kw, **dist_kw)
    rec = None
    for step in range(2 + STEPS):
        if step == 2 and case_dir is not None:
            rec = rt.Recorder(opt, case_dir, steps=STEPS)
        gg = torch.Generator().manual_seed(100 + step)
        for i, p in enumerate(ps):
            grad = torch.randn(*p.shape, generator=gg).to(dtype).cuda()
            p.grad = None if (step == 3 and i == 1) else grad
        opt.step()
    torch.cuda.synchronize()
    fp = opt.fingerprint()
    if rec is not None and rec.fingerprint != fp:
        raise AssertionError("the Recorder's fingerprint %s is not the optimizer's %s" % (rec.fingerprint, fp))
    return fp


def check(case, work):
    name, cls, kw, dtype = case
    want = run(cls, kw, dtype)

    def in_mode(mode):
        case_dir = os.path.join(work, "%s_%s" % (name, mode))
        try:
            got = run(cls, kw, dtype, case_dir, process_group=dist.group.WORLD, grad_reduce=mode)
            r = renaissance.replay(case_dir, backend="cpu", tolerance=0.0)
            ok = got == want and r["fingerprint"] == want and r["passed"] in (None, True)
            return ok, "plain %s recorded %s cpu replay %s" % (want, got, r["fingerprint"])
        except Exception as e:  # reported as a failure of this case
            return False, "%s: %s" % (type(e).__name__, e)

    return in_mode


def main():
    return one_rank_world_main("recorder_dist cuda smoke", CASES, check)


if __name__ == "__main__":
    sys.exit(main())
