// Fast mode's fp32 matrix product (newton_schulz_fast_cpu.cc), compiled three times from
// fast_product/fast_product-inl.h: for baseline x86-64, for AVX2 + FMA and for AVX-512 (the
// translation units in backend_cpu/fast_product/, each built with its own -m flags), the copy
// chosen at run time by the CPU's features as Highway dispatches. Fast mode is tolerance-only, so
// its products may use FMA; these files are the only code of the library built with those flags,
// and each copy includes Eigen under its own namespace (no symbol is shared between the copies or
// with code built for the baseline).
#pragma once

#include <cstddef>

namespace renaissance {
namespace cpu {

// Rows of a product's result per work item: fixed, so the split (and every sum's order) does not
// depend on the thread count.
constexpr size_t kFastProductBlockRows = 64;

// C (m x n) = A (m x k) times B (k x n), or times Bᵀ (B n x k) when b_transposed; every matrix
// row-major. The rows of C in fixed blocks of kFastProductBlockRows, one single-threaded Eigen
// product each, the blocks spread over `threads` OpenMP threads.
using FastProductFn = void (*)(const float* a, const float* b, float* c, size_t m, size_t k, size_t n,
                               bool b_transposed, int threads);

void fast_product_baseline(const float* a, const float* b, float* c, size_t m, size_t k, size_t n, bool b_transposed,
                           int threads);
void fast_product_avx2(const float* a, const float* b, float* c, size_t m, size_t k, size_t n, bool b_transposed,
                       int threads);
void fast_product_avx512(const float* a, const float* b, float* c, size_t m, size_t k, size_t n, bool b_transposed,
                         int threads);

// The copy for this CPU (hwy::SupportedTargets(), so a test can pin it): AVX-512 where Highway's
// AVX3 target runs (AVX-512 F, VL, DQ, BW), AVX2 + FMA where its AVX2 target runs, else baseline.
FastProductFn fast_product_for_cpu();
// Its name: "AVX-512", "AVX2+FMA" or "baseline".
const char* fast_product_target();

}  // namespace cpu
}  // namespace renaissance
