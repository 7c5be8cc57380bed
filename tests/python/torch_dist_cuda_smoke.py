"""GPU smoke test of renaissance.torch with a torch.distributed NCCL process group
(docs/distributed.md, "torch.distributed"): a world of ONE rank on one GPU, so it runs on the
one-GPU device machine. It exercises the CUDA path of the Python communicator (device views,
NCCL broadcasts and max, the staging copies and the workspace through torch) and checks that
the sharded step at K = 1 gives the plain CUDA optimizer's bits (replicated and ordered: the mean
of one rank is its gradient, exactly), Muon and MuonWithAuxAdam (exact mode) among the cases.
K >= 2 on GPUs is not tested anywhere yet.

Not collected by pytest (no test_ prefix): `scripts/gpu.sh python` runs it after the pytest suite,
on its CUDA install of the package; by hand on that install:
    PYTHONPATH=build-gpu-python/site python3 tests/python/torch_dist_cuda_smoke.py
Last line: "torch_dist cuda smoke: PASS (N cases)" or "... FAIL ..." (exit status 1).
"""
import sys

import torch
import torch.distributed as dist

import renaissance.torch as rt
from cuda_smoke_util import cuda_params, one_rank_world_main
CASES = [
    ("sgd", rt.SGD, dict(lr=0.1, momentum=0.9), torch.float32),
    ("adamw", rt.AdamW, dict(lr=1e-2, weight_decay=0.05), torch.float32),
    ("lamb_clip", rt.LAMB, dict(lr=1e-2, max_grad_norm=1.0), torch.float32),
    ("lars", rt.LARS, dict(lr=0.1), torch.float32),
    ("adamw_bf16", rt.AdamW, dict(lr=1e-2), torch.bfloat16),
    ("muon", lambda ps, **kw: rt.Muon([p for p in ps if p.dim() == 2], **kw), dict(lr=0.02), torch.float32),
    ("muon_aux", lambda ps, **kw: rt.MuonWithAuxAdam(muon_groups(ps), **kw), dict(max_grad_norm=1.0), torch.float32),
    ("muon_aux_bf16", lambda ps, **kw: rt.MuonWithAuxAdam(muon_groups(ps), **kw), {}, torch.bfloat16),
]


def muon_groups(ps):
    """MuonWithAuxAdam's groups over the smoke's parameters: the matrices and the conv weight
    (viewed as a matrix) in the Muon group, the 1-D tensors in the auxiliary AdamW's."""
    return [dict(params=[p for p in ps if p.dim() >= 2], use_muon=True, lr=0.02),
            dict(params=[p for p in ps if p.dim() < 2], use_muon=False, lr=1e-3)]


def run(cls, kw, dtype, **dist_kw):
    ps = cuda_params(dtype)
    opt = cls(ps, **kw, **dist_kw)
    for step in range(3):
        gg = torch.Generator().manual_seed(100 + step)
        for p in ps:
            grad = torch.randn(*p.shape, generator=gg).to(dtype)
            if step == 1 and p is ps[0]:
                grad[0, 0] = float("inf")  # a skipped step: the non-finite flag's max
            if p.grad is None:  # the first step: no .grad yet (as before a backward)
                p.grad = grad.cuda()
            else:
                p.grad.copy_(grad.cuda())
        opt.step()
    torch.cuda.synchronize()
    return [p.detach().cpu() for p in ps], opt.fingerprint()


def check(case, work):
    name, cls, kw, dtype = case
    want_p, want_fp = run(cls, kw, dtype)

    def in_mode(mode):
        got_p, got_fp = run(cls, kw, dtype, process_group=dist.group.WORLD, grad_reduce=mode)
        same = all(torch.equal(a.view(torch.int16 if a.element_size() == 2 else torch.int32),
                               b.view(torch.int16 if b.element_size() == 2 else torch.int32))
                   for a, b in zip(got_p, want_p))
        return same and got_fp == want_fp, "plain %s sharded %s" % (want_fp, got_fp)

    return in_mode


def main():
    return one_rank_world_main("torch_dist cuda smoke", CASES, check)


if __name__ == "__main__":
    sys.exit(main())
