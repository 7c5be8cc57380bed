"""renaissance.torch: an optimizer dropped by its user keeps its arena until Python's cyclic
collector runs (its Tasks and bindings refer to each other). When a new optimizer's arena cannot
be allocated, the collector runs and the allocation is tried once more, so that building one
optimizer after another (torch's test_foreach_large_tensor, one per configuration) does not run
out of memory on arenas nobody holds. Run in a child process under an address-space limit that
holds one arena but not two (CPU: the arena is an mmap)."""
import os
import subprocess
import sys

import pytest

CHILD = r"""
import gc, resource
import torch
import renaissance.torch as rt

gc.disable()  # only the optimizer's own collection may free the first arena
MIB = 1 << 20
N = 1 << 25  # 128 MiB per float32 tensor; SGD with momentum: W, G, M = 384 MiB of arena


def vm_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


p = torch.nn.Parameter(torch.zeros(N))
p.grad = torch.ones(N)
opt = rt.SGD([p], lr=0.1, momentum=0.9, threads=1)
opt.step()
del opt, p  # unreachable now, but its arena is still mapped (a reference cycle)
# Room for the new parameter and gradient (256 MiB) and slack, not for a second arena beside the first.
limit = vm_bytes() + 448 * MIB
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
q = torch.nn.Parameter(torch.zeros(N))
q.grad = torch.ones(N)
try:
    opt = rt.SGD([q], lr=0.1, momentum=0.9, threads=1)
except RuntimeError as e:
    print("REFUSED", str(e)[:120])
    raise SystemExit(3)
opt.step()
assert float(q.detach()[0]) == float(torch.tensor(-0.1)) and float(q.detach()[-1]) == float(torch.tensor(-0.1))
print("BUILT")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status and RLIMIT_AS")
def test_a_dropped_optimizers_arena_is_collected_when_a_new_one_does_not_fit():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 0 and "BUILT" in out.stdout, (out.returncode, out.stdout, out.stderr[-2000:])
