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


CHILD_HELD = r"""
import resource
import torch
import renaissance.torch as rt

MIB = 1 << 20
N = 1 << 24  # bf16 AdamW: 16 bytes per element in the arena = 256 MiB


def vm_bytes():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))


p = torch.nn.Parameter(torch.zeros(N, dtype=torch.bfloat16))
opt = rt.AdamW([p], lr=0.1, threads=1)  # still held below: no collector can free it
limit = vm_bytes() + 160 * MIB  # room for the new parameter and gradient, not for a second arena
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
q = torch.nn.Parameter(torch.zeros(N, dtype=torch.bfloat16))
q.grad = torch.ones(N, dtype=torch.bfloat16)
try:
    rt.AdamW([q], lr=0.1, threads=1)
except RuntimeError as e:
    print("REFUSED", str(e))
    raise SystemExit(3)
print("BUILT")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status and RLIMIT_AS")
def test_an_arena_that_does_not_fit_says_what_it_holds():
    """An arena that still does not fit after the retry: the error adds what the arena holds per
    element (bf16 AdamW: float32 masters, exp_avg and exp_avg_sq, 4 bytes each, the bf16 copy and
    gradient, 2 each) and that torch.optim's state of such a parameter takes 8; the torch-suite
    harness counts exactly that text as the by-design `fp32 state` class."""
    out = subprocess.run([sys.executable, "-c", CHILD_HELD], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert out.returncode == 3 and "REFUSED" in out.stdout, (out.returncode, out.stdout, out.stderr[-2000:])
    msg = out.stdout.split("REFUSED ", 1)[1]
    assert "cannot allocate an arena" in msg
    assert ("renaissance.torch: 16777216 elements of bfloat16 parameters take 16 bytes each in the arena "
            "(float32 master weights 4, exp_avg 4, exp_avg_sq 4, the bfloat16 copy 2, the bfloat16 gradient 2); "
            "the state is float32 for bfloat16 parameters (torch.optim keeps it in the parameter's dtype: 8 bytes "
            "each)") in msg, msg
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_suite",
                        "run_torch_optim_suite.py")
    spec = importlib.util.spec_from_file_location("run_torch_optim_suite", path)
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    assert suite.design_reason("test_foreach_large_tensor_AdamW_cuda_float16", "RuntimeError: " + msg) == "fp32 state"
