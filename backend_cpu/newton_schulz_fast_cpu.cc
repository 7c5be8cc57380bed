// Muon's Newton–Schulz in fast mode on the CPU: fp32 products through Eigen (newton_schulz_fast_cpu.h).
// Eigen's own threading is off (EIGEN_DONT_PARALLELIZE): its GEMM blocking depends on the thread
// count, which would change the sums' order. Instead each product's result is cut into blocks of
// kFastProductBlockRows rows, each block one single-threaded Eigen product, the blocks spread over
// OpenMP threads: the same block always sums in the same order, so the bits depend only on the
// shapes and the machine (Eigen's SIMD and cache-size blocking), never on the thread count.
#define EIGEN_DONT_PARALLELIZE
#include "backend_cpu/newton_schulz_fast_cpu.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend_cpu/exact_matmul_cpu.h"

namespace renaissance {
namespace cpu {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

// C (m x n) = A (m x k) times B (k x n), or times Bᵀ (B n x k) when b_transposed; every matrix
// row-major. The rows of C in fixed blocks, one Eigen product each.
void product(const float* a, const float* b, float* c, size_t m, size_t k, size_t n, bool b_transposed, int threads) {
  const size_t blocks = (m + kFastProductBlockRows - 1) / kFastProductBlockRows;
  const int team = static_cast<int>(std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads), blocks)));
  const auto mi = static_cast<Eigen::Index>(m), ki = static_cast<Eigen::Index>(k), ni = static_cast<Eigen::Index>(n);
  const ConstMatrixMap am(a, mi, ki);
  MatrixMap cm(c, mi, ni);
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t blk = 0; blk < static_cast<int64_t>(blocks); ++blk) {
    const auto first = static_cast<Eigen::Index>(static_cast<size_t>(blk) * kFastProductBlockRows);
    const Eigen::Index count = std::min<Eigen::Index>(static_cast<Eigen::Index>(kFastProductBlockRows), mi - first);
    if (b_transposed) {
      const ConstMatrixMap bm(b, ni, ki);
      cm.middleRows(first, count).noalias() = am.middleRows(first, count) * bm.transpose();
    } else {
      const ConstMatrixMap bm(b, ki, ni);
      cm.middleRows(first, count).noalias() = am.middleRows(first, count) * bm;
    }
  }
}

}  // namespace

void newton_schulz_fast_cpu(const float* u, size_t rows, size_t cols, float* out,
                            const math::NewtonSchulzCoefficients& coeff, int steps, float eps,
                            NewtonSchulzFastScratch* scratch, int threads) {
  const bool transposed = rows > cols;
  const size_t r = transposed ? cols : rows, c = transposed ? rows : cols;  // X is r x c, r <= c
  NewtonSchulzFastScratch local;
  NewtonSchulzFastScratch& s = scratch != nullptr ? *scratch : local;
  threads = std::max(threads, 1);
  s.size_for(r, c);
  float* x = s.x.data();
  newton_schulz_load(u, rows, cols, eps, x, threads);  // exact mode's normalisation
  float* gram = s.gram.data();
  float* gram2 = s.gram2.data();
  float* poly = s.poly.data();
  float* q = s.q.data();
  for (int step = 0; step < steps; ++step) {
    product(x, x, gram, r, c, r, true, threads);          // A = X Xᵀ
    product(gram, gram, gram2, r, r, r, false, threads);  // P = A A
    elementwise(r * r, threads,
                [&](size_t e) { poly[e] = math::newton_schulz_polynomial(coeff.b, coeff.c, gram[e], gram2[e]); });
    product(poly, x, q, r, r, c, false, threads);  // Q = B X
    elementwise(r * c, threads, [&](size_t e) { x[e] = math::newton_schulz_combine(coeff.a, x[e], q[e]); });
  }
  newton_schulz_store(x, rows, cols, out, threads);
}

}  // namespace cpu
}  // namespace renaissance
