// Muon's Newton–Schulz in fast mode on the CPU (docs/math.md, "Muon: fast mode"): the exact mode's
// normalisation, transposition rule and element-wise steps (math/newton_schulz.h), with the three
// matrix products of each step in plain fp32 through Eigen instead of the exact fixed-point ones.
// Not bitwise equal to exact mode nor to CUDA's fast mode; deterministic on one machine whatever
// the thread count (each product is split into fixed blocks of rows, fast_product_cpu.h).
#pragma once

#include <cstddef>
#include <vector>

#include "backend_cpu/exact_matmul_cpu.h"
#include "backend_cpu/fast_product_cpu.h"
#include "renaissance/math/newton_schulz.h"

namespace renaissance {
namespace cpu {

// Buffers of newton_schulz_fast_cpu, reused across calls.
struct NewtonSchulzFastScratch : NewtonSchulzMatrices {};

// out (rows x cols, row-major) = u's orthogonalisation: X = u / max(‖u‖_F, eps) (the canonical
// norm, on uᵀ when rows > cols), then `steps` times A = X Xᵀ, P = A A, B = (b*A) + (c*P),
// Q = B X, X = (a*X) + Q with the products in fp32 (fast_product_cpu.h: Eigen, single-threaded
// per block, the copy for the CPU's SIMD features), the
// element-wise steps those of math/newton_schulz.h. out may be u (in place) or must not overlap it.
// `threads` OpenMP threads (1 or more); `scratch` may be null (then it allocates).
void newton_schulz_fast_cpu(const float* u, size_t rows, size_t cols, float* out,
                            const math::NewtonSchulzCoefficients& coeff = {},
                            int steps = math::kDefaultNewtonSchulzSteps, float eps = math::kDefaultNewtonSchulzEps,
                            NewtonSchulzFastScratch* scratch = nullptr, int threads = 1);

}  // namespace cpu
}  // namespace renaissance
