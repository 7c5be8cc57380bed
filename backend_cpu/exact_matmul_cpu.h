// The exact matrix product and Muon's exact Newton–Schulz on the CPU: the bits of
// math::exact_matmul_reference and math::newton_schulz_reference (renaissance/math/), computed
// fast. Each operand is converted once to the reference's fixed point (same scales, same q, held
// in int16 since |q| <= 2^13, both operands laid out contiguous along k), the integer dot
// products are summed exactly in Highway int16 lanes widened into int32 and flushed into int64
// (exact_matmul_cpu.cc proves the bound) — or, on a CPU with AMX-INT8, cut into int8 digits and
// summed by the tile unit (exact_matmul_amx.h) —, and each sum is rounded once to fp32 as the
// reference does. Integer sums do not depend on their order, so SIMD target, blocking and thread count
// change no bit (docs/math.md, "Muon: the exact matrix product").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend_cpu/exact_matmul_amx.h"
#include "renaissance/math/newton_schulz.h"

namespace renaissance {
namespace cpu {

// One operand in fixed point: `count` vectors (rows of a left operand, columns of a right one)
// of k elements each, vector v's q at q[v * kp + p] (kp = k rounded up to kExactMatmulPad, the
// padding is zero), its scale exponent and whether it was finite.
constexpr size_t kExactMatmulPad = 64;
struct FixedPointOperand {
  size_t count = 0, k = 0, kp = 0;
  std::vector<int16_t> q;
  std::vector<int> shift;
  std::vector<uint8_t> finite;
  // Working buffers of a column operand: the largest |x| bits per column, the shift each lane
  // applies, the digits in the input's (row-major) layout, rows staging_stride apart (the SIMD
  // lanes transpose them into q; the tile unit lays its digits out from these rows).
  std::vector<uint32_t> amax_bits;
  std::vector<int32_t> lane_shift;
  std::vector<int16_t> staging;
  size_t staging_stride = 0;
  // The digits of q for the tile unit, as rows (a left operand) and as columns (a right one).
  AmxDigits tile_rows, tile_columns;
};

// Which unit sums exact mode's integer products; every unit gives the same integers, so the same
// bits. kBest: the AMX tile unit where amx_int8_usable(), else the SIMD lanes (Highway).
enum class ExactProductUnit { kBest, kSimdLanes };
// Whether products asked of `unit` run on the tile unit in this process.
bool exact_products_on_tiles(ExactProductUnit unit);

// Buffers reused across calls (so a Newton–Schulz step allocates nothing once they have grown).
struct ExactMatmulScratch {
  FixedPointOperand a, b;
  ExactProductUnit unit = ExactProductUnit::kBest;
};

// C = A B (row-major; A m x k, B k x n, C m x n) with exactly the bits of
// math::exact_matmul_reference, non-finite rows and columns (NaN results) included. `threads`
// OpenMP threads (1 or more); `scratch` may be null (then it allocates). Returns false with C
// untouched when k > math::kExactMatmulMaxK, as the reference.
bool exact_matmul_cpu(const float* a, const float* b, float* c, size_t m, size_t k, size_t n,
                      ExactMatmulScratch* scratch = nullptr, int threads = 1);

// Buffers of newton_schulz_exact_cpu.
// The fp32 matrices of one Newton–Schulz iteration on an r x c X (r <= c), in either mode.
struct NewtonSchulzMatrices {
  std::vector<float> x, gram, gram2, poly, q;
  void size_for(size_t r, size_t c) {
    x.resize(r * c);
    q.resize(r * c);
    gram.resize(r * r);
    gram2.resize(r * r);
    poly.resize(r * r);
  }
};

// Exact mode's own: the zero-diagonal operand of the split products (A's, then B's) and the
// fixed-point operands.
struct NewtonSchulzScratch : NewtonSchulzMatrices {
  std::vector<float> off;
  FixedPointOperand qx, qxt, qg, qp;
  ExactProductUnit unit = ExactProductUnit::kBest;
};

// out (rows x cols, row-major) = math::newton_schulz_reference(u, rows, cols, out, coeff, steps,
// eps), bit for bit: the same norm (canonical order), the same fp32 element-wise operations in the
// same order, the products above (P = A A and Q = B X through the reference's diagonal split). out may be u (in place: u is read before out is written), or
// else must not overlap it. Returns false (out untouched) when the reference does
// (max(rows, cols) > math::kExactMatmulMaxK).
bool newton_schulz_exact_cpu(const float* u, size_t rows, size_t cols, float* out,
                             const math::NewtonSchulzCoefficients& coeff = {},
                             int steps = math::kDefaultNewtonSchulzSteps, float eps = math::kDefaultNewtonSchulzEps,
                             NewtonSchulzScratch* scratch = nullptr, int threads = 1);

// What both modes of Newton–Schulz share (newton_schulz_fast_cpu.cc too):
// fn(e) for e < count over the threads: each item computed alone (fp32 operations in the
// reference's order), so the split changes no bit. `width`: elements an item touches (a thread
// gets at least 16K elements).
template <class Fn>
void elementwise(size_t count, int threads, Fn&& fn, size_t width = 1) {
  const int team = static_cast<int>(std::max<size_t>(1, std::min<size_t>(threads, count * width / 16384 + 1)));
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t e = 0; e < static_cast<int64_t>(count); ++e) fn(static_cast<size_t>(e));
}
// x (r x c, r = min(rows, cols)) = u / max(‖u‖_F, eps), on uᵀ when rows > cols: the reference's
// normalisation (the canonical sum over u in its own order, one division per element);
void newton_schulz_load(const float* u, size_t rows, size_t cols, float eps, float* x, int threads);
// out (rows x cols) = x, transposed back when rows > cols.
void newton_schulz_store(const float* x, size_t rows, size_t cols, float* out, int threads);

// Pieces, exposed for the tests:
// the reference's math::to_fixed_point(x, shift) computed on the float's bits (no double, no
// rounding mode), for |x| * 2^shift <= 2^13 + 1/2 (what a row's own shift guarantees);
int32_t fixed_point_from_bits(float x, int shift);
// the same for x[0, count) with the dispatched SIMD code (the kernels' own conversion of a row);
void fixed_point_row(const float* x, size_t count, int shift, int16_t* q);
// Σ x² of x[0, count) in the canonical order of a tensor norm (math::tensor_sum_of_squares, the
// same double), its tiles over the threads;
double sum_of_squares_canonical(const float* x, size_t count, int threads);
// the name of the Highway target the integer kernel dispatches to now.
const char* exact_matmul_target();

}  // namespace cpu
}  // namespace renaissance
