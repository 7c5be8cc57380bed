#!/usr/bin/env python3
"""An independent oracle of the exact matrix product and exact Newton-Schulz (docs/math.md, "Muon:
the exact matrix product" and "Muon: Newton-Schulz in exact mode"), written apart from the C++:
scales from numpy's frexp, q from np.rint (half to even), the integer products by numpy's int64
matmul, the canonical norm order, Newton-Schulz's diagonal split (A A and B X as the exact product
of the off-diagonal part plus the diagonal's share in fp32) and the fp32 element-wise steps in
numpy. Runs the CPU kernels through exact_matmul_tool and compares every result bit for bit.

    exact_matmul_numpy.py PATH/TO/exact_matmul_tool
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

TOOL = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="exact_matmul_numpy_")


def fixed_point(x, axis):
    """q (int64), shifts and finiteness of the vectors of x along `axis` (1: rows, 0: columns)."""
    x64 = x.astype(np.float64)
    finite = np.all(np.isfinite(x64), axis=axis)
    amax = np.max(np.abs(np.where(np.isfinite(x64), x64, 0.0)), axis=axis, initial=0.0)
    _, exp = np.frexp(amax)  # amax = f * 2^exp, f in [0.5, 1)
    shift = np.where(amax == 0.0, 0, 13 - exp).astype(np.int64)
    shift = np.where(finite, shift, 0)
    s = shift[:, None] if axis == 1 else shift[None, :]
    q = np.rint(np.ldexp(np.where(np.isfinite(x64), x64, 0.0), s)).astype(np.int64)
    q = np.where((finite[:, None] if axis == 1 else finite[None, :]), q, 0)
    assert np.max(np.abs(q), initial=0) <= 2**13
    return q, shift, finite


def oracle_matmul(a, b):
    qa, sa, fa = fixed_point(a, 1)
    qb, sb, fb = fixed_point(b, 0)
    sums = qa @ qb  # int64, exact: |sum| <= k * 2^26 < 2^53
    c = np.ldexp(sums.astype(np.float64), -(sa[:, None] + sb[None, :])).astype(np.float32)
    return np.where(fa[:, None] & fb[None, :], c, np.float32(np.nan)).astype(np.float32)


def canonical_sum_of_squares(x):
    """Sum of squares in double in docs/reproducibility.md's tile/lane/tree order."""
    sq = x.astype(np.float64).ravel() ** 2
    tiles = max(1, -(-sq.size // 4096))
    sq = np.concatenate([sq, np.zeros(tiles * 4096 - sq.size)]).reshape(tiles, 4, 256, 4)
    lanes = np.zeros((tiles, 256))
    for r in range(4):
        for e in range(4):
            lanes = lanes + sq[:, r, :, e]
    def tree(v):
        s = v.shape[-1] // 2
        while s > 0:
            v[..., :s] = v[..., :s] + v[..., s:2 * s]
            s //= 2
        return v[..., 0]
    partials = tree(lanes)
    rows = -(-partials.size // 256)
    p = np.concatenate([partials, np.zeros(rows * 256 - partials.size)]).reshape(rows, 256)
    sums = np.zeros(256)
    for t in range(rows):
        sums = sums + p[t]
    return tree(sums[None, :].copy())[0]


def oracle_ns(u, steps, coeff=("3.4445", "-4.7750", "2.0315"), eps=np.float32(1e-7)):
    a, b, c = (np.float32(float(v)) for v in coeff)
    transposed = u.shape[0] > u.shape[1]
    x = (u.T if transposed else u).astype(np.float32).copy()
    norm = np.float32(np.sqrt(canonical_sum_of_squares(u)))
    x = (x / (norm if norm > eps else eps)).astype(np.float32)
    r = x.shape[0]
    diag = np.arange(r)

    def split(m):
        """m's diagonal and m with a zero diagonal (zero even where the diagonal is not finite)."""
        off = m.copy()
        off[diag, diag] = np.float32(0.0)
        return m[diag, diag].copy(), off

    for _ in range(steps):
        gram = oracle_matmul(x, x.T)
        # A A through the diagonal split: the exact product of the off-diagonal part, the
        # diagonal's share added in fp32, one rounding per bracket.
        d, off = split(gram)
        gram2 = (oracle_matmul(off, off) + d[:, None] * off) + off * d[None, :]
        gram2[diag, diag] = gram2[diag, diag] + d * d
        poly = (b * gram) + (c * gram2)
        # B X the same way: the exact product of B's off-diagonal part, B's diagonal times X in fp32.
        e, off_b = split(poly)
        q = oracle_matmul(off_b, x) + e[:, None] * x
        x = (a * x) + q
    return (x.T if transposed else x).copy()


def tofile(name, x):
    path = os.path.join(TMP, name)
    np.ascontiguousarray(x, dtype="<f4").tofile(path)
    return path


def fromfile(path, shape):
    return np.fromfile(path, dtype="<f4").reshape(shape)


def same_bits(got, want):
    return np.array_equal(got.view(np.uint32), want.view(np.uint32))


failures = 0


def check(what, got, want):
    global failures
    if same_bits(got, want):
        print(f"ok    {what}")
        return
    failures += 1
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    i = tuple(bad[0])
    print(f"FAIL  {what}: {len(bad)} elements differ, first at {i}: {got[i]!r} vs numpy {want[i]!r}")


def run_matmul(what, a, b, threads=2):
    m, k = a.shape
    n = b.shape[1]
    out = os.path.join(TMP, "c.f32")
    subprocess.run([TOOL, "matmul", str(m), str(k), str(n), tofile("a.f32", a), tofile("b.f32", b), out,
                    str(threads)], check=True)
    check(f"matmul {what} {m}x{k}x{n}", fromfile(out, (m, n)), oracle_matmul(a, b))


def run_ns(what, u, steps, threads=2):
    out = os.path.join(TMP, "out.f32")
    subprocess.run([TOOL, "ns", str(u.shape[0]), str(u.shape[1]), str(steps), tofile("u.f32", u), out,
                    str(threads)], check=True)
    check(f"newton-schulz {what} {u.shape[0]}x{u.shape[1]} steps {steps}", fromfile(out, u.shape),
          oracle_ns(u, steps))


rng = np.random.default_rng(2026)


def spread(shape):
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 31, shape))
    x[rng.random(shape) < 0.06] = 0.0
    return x.astype(np.float32)


for m, k, n in [(1, 1, 1), (3, 5, 2), (5, 17, 4), (7, 33, 9), (13, 65, 6), (49, 961, 52), (8, 200, 70)]:
    run_matmul("random", spread((m, k)), spread((k, n)), threads=1 + (m % 2))

a, b = spread((6, 40)), spread((40, 5))
a[1, :] = 0.0
a[2, 39] = np.inf
a[4, 0] = np.nan
b[:, 3] = 0.0
b[7, 1] = -np.inf
run_matmul("zero and non-finite rows and columns", a, b)

sub = (rng.integers(1, 2**23, (5, 30)) * np.where(rng.random((5, 30)) < 0.5, -1, 1)).astype(np.float64)
a = np.ldexp(sub, -149).astype(np.float32)
a[1] *= np.float32(2.0**60)
run_matmul("subnormals", a, np.ldexp(rng.integers(0, 8, (30, 4)).astype(np.float64), -149).astype(np.float32))

# Worst-case digits (|q| = 2^13 everywhere) and k > 131071: the sums need 45 bits.
k = 131073 + 70
big = np.float32(1.99999988)
a = np.full((3, k), big, dtype=np.float32)
a[1, (np.arange(k) // 37) % 2 == 1] = -big
b = np.full((k, 2), big, dtype=np.float32)
b[(np.arange(k) // 37) % 2 == 1, 1] = -big
run_matmul("worst-case digits", a, b)

for rows, cols in [(5, 7), (7, 5), (16, 40), (33, 65), (1, 9), (9, 1), (1, 1), (60, 150), (130, 50)]:
    run_ns("random", (rng.standard_normal((rows, cols)) * 0.01).astype(np.float32), 5)
run_ns("one step", rng.standard_normal((12, 20)).astype(np.float32), 1)
run_ns("zero matrix", np.zeros((4, 6), dtype=np.float32), 5)
u = rng.standard_normal((6, 11)).astype(np.float32)
u[2, 3] = np.nan
run_ns("a NaN", u, 2)
u = rng.standard_normal((8, 24)).astype(np.float32)
u[:, 5] = 0.0
u[3, :] = 0.0
run_ns("a zero row and column", u, 5)

print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
