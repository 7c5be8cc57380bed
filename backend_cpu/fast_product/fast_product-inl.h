// The body of fast mode's fp32 product (backend_cpu/fast_product_cpu.h), included once by each of
// the translation units beside it with RN_FAST_PRODUCT (the function's name) and RN_EIGEN_NAMESPACE
// (the name Eigen's namespace takes in that copy) defined. Eigen's own threading is off
// (EIGEN_DONT_PARALLELIZE): its GEMM blocking depends on the thread count, which would change the
// sums' order; each block of rows is one single-threaded Eigen product instead, so the bits depend
// on the shapes and the copy (its SIMD width, FMA, Eigen's cache-size blocking), never on the
// thread count.
#if !defined(RN_FAST_PRODUCT) || !defined(RN_EIGEN_NAMESPACE)
#error "define RN_FAST_PRODUCT and RN_EIGEN_NAMESPACE before including fast_product-inl.h"
#endif
#define EIGEN_DONT_PARALLELIZE
// Eigen's symbols get this copy's namespace: the three copies (and the tests' baseline Eigen)
// would otherwise share inline functions and templates whose code differs in its instructions.
#define Eigen RN_EIGEN_NAMESPACE
#include <Eigen/Core>

#include <algorithm>
#include <cstdint>

#include "backend_cpu/fast_product_cpu.h"

namespace renaissance {
namespace cpu {

void RN_FAST_PRODUCT(const float* a, const float* b, float* c, size_t m, size_t k, size_t n, bool b_transposed,
                     int threads) {
  using RowMatrix = RN_EIGEN_NAMESPACE::Matrix<float, RN_EIGEN_NAMESPACE::Dynamic, RN_EIGEN_NAMESPACE::Dynamic,
                                               RN_EIGEN_NAMESPACE::RowMajor>;
  using Index = RN_EIGEN_NAMESPACE::Index;
  using MatrixMap = RN_EIGEN_NAMESPACE::Map<RowMatrix>;
  using ConstMatrixMap = RN_EIGEN_NAMESPACE::Map<const RowMatrix>;
  const size_t blocks = (m + kFastProductBlockRows - 1) / kFastProductBlockRows;
  const int team = static_cast<int>(std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads), blocks)));
  const auto mi = static_cast<Index>(m), ki = static_cast<Index>(k), ni = static_cast<Index>(n);
  const ConstMatrixMap am(a, mi, ki);
  MatrixMap cm(c, mi, ni);
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t blk = 0; blk < static_cast<int64_t>(blocks); ++blk) {
    const auto first = static_cast<Index>(static_cast<size_t>(blk) * kFastProductBlockRows);
    const Index count = std::min<Index>(static_cast<Index>(kFastProductBlockRows), mi - first);
    if (b_transposed) {
      const ConstMatrixMap bm(b, ni, ki);
      cm.middleRows(first, count).noalias() = am.middleRows(first, count) * bm.transpose();
    } else {
      const ConstMatrixMap bm(b, ki, ni);
      cm.middleRows(first, count).noalias() = am.middleRows(first, count) * bm;
    }
  }
}

}  // namespace cpu
}  // namespace renaissance
