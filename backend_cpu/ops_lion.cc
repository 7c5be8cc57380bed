// CPU op UPDATE_LION (both groups; the bias-like group gets wd = 0 through the coefficients):
// one element-wise pass, reads g, w, m and writes w, m (rules::lion).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_lion.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

void Lion(float* w, const float* g, float* m, float*, size_t n, const float* s, bool weight_group, bool) {
  const auto cv = vector_coeffs(s, weight_group);
  const auto cs = scalar_coeffs(s, weight_group);
  for_each_element<true, false>(
      w, g, m, nullptr, n,
      [&](FloatVec& wv, FloatVec gv, FloatVec& mv, FloatVec&) { rules::lion<VectorPolicy>(wv, gv, mv, cv); },
      [&](float& wv, float gv, float& mv, float&) { rules::lion<rules::ScalarPolicy>(wv, gv, mv, cs); });
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backend_cpu/cpu_ops.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(Lion);

void run_UPDATE_LION(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(Lion));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
