// Muon's Newton–Schulz in fast mode on the CPU (newton_schulz_fast_cpu.h): exact mode's frame (the
// normalisation, the transposition, the element-wise steps, all built for the baseline like the
// rest of the library) around three fp32 products per step, each through the copy of
// fast_product_cpu.h that this CPU runs (AVX-512, AVX2 + FMA or baseline; FMA only there, since
// fast mode is held to a tolerance, not to bits). The copy is chosen once per call, so the bits
// depend on the shapes and the machine, never on the thread count.
#include "backend_cpu/newton_schulz_fast_cpu.h"

#include <hwy/targets.h>

#include <algorithm>

#include "backend_cpu/exact_matmul_cpu.h"
#include "backend_cpu/fast_product_cpu.h"

namespace renaissance {
namespace cpu {

FastProductFn fast_product_for_cpu() {
  const int64_t targets = hwy::SupportedTargets();
  if ((targets & (HWY_AVX3 | HWY_AVX3_DL)) != 0) return &fast_product_avx512;
  if ((targets & HWY_AVX2) != 0) return &fast_product_avx2;
  return &fast_product_baseline;
}

const char* fast_product_target() {
  const FastProductFn fn = fast_product_for_cpu();
  return fn == &fast_product_avx512 ? "AVX-512" : fn == &fast_product_avx2 ? "AVX2+FMA" : "baseline";
}

void newton_schulz_fast_cpu(const float* u, size_t rows, size_t cols, float* out,
                            const math::NewtonSchulzCoefficients& coeff, int steps, float eps,
                            NewtonSchulzFastScratch* scratch, int threads) {
  const bool transposed = rows > cols;
  const size_t r = transposed ? cols : rows, c = transposed ? rows : cols;  // X is r x c, r <= c
  NewtonSchulzFastScratch local;
  NewtonSchulzFastScratch& s = scratch != nullptr ? *scratch : local;
  threads = std::max(threads, 1);
  s.size_for(r, c);
  const FastProductFn product = fast_product_for_cpu();
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
