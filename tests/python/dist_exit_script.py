"""A plain two-rank training script under a gloo process group that never calls
destroy_process_group (as many scripts do): run by test_torch_dist_exit.py, which checks that
the process leaves with status 0 at interpreter exit.

Usage: python dist_exit_script.py RANK WORLD_SIZE INIT_FILE [GRAD_REDUCE [CLASS]]
CLASS: adamw (default) or muon (MuonWithAuxAdam: Muon on the weights, each owned by one rank, the
aux AdamW on the biases).
"""
import datetime
import sys

import torch
import torch.distributed as dist

import renaissance.torch as rt

rank, world, init_file = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else "ordered"
cls = sys.argv[5] if len(sys.argv) > 5 else "adamw"
dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
torch.set_num_threads(1)
if cls == "muon":
    # Weights of 2 and 1.25 grad-norm tiles (16384 elements): at K = 2 each rank owns one.
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 40))
    weights = [model[0].weight, model[2].weight]
    biases = [model[0].bias, model[2].bias]
    opt = rt.MuonWithAuxAdam([dict(params=weights, use_muon=True), dict(params=biases, use_muon=False)],
                             threads=1, process_group=dist.group.WORLD, grad_reduce=mode)
else:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = rt.AdamW(model.parameters(), lr=1e-3, max_grad_norm=1.0, threads=1, process_group=dist.group.WORLD,
                   grad_reduce=mode)
g = torch.Generator().manual_seed(rank)
for _ in range(3):
    x = torch.randn(32, 64, generator=g)
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print("rank %d done, fingerprint %s" % (rank, opt.fingerprint()))
