// CPU op UPDATE_LION (both groups; the bias-like group gets wd = 0 through the coefficients):
// one element-wise pass, reads g, w, m and writes w, m (rules::lion).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_lion.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/fused_update-inl.h"
#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

struct LionRule {
  static constexpr bool kHasM = true, kHasV = false;
  template <class P, class V>
  static HWY_INLINE void apply(V& w, V g, V& m, V&, const rules::Coeffs<V>& c) {
    rules::lion<P>(w, g, m, c);
  }
};

void Lion(float* w, const float* g, float* m, float*, size_t n, const float* s, CoeffSet set, bool) {
  RuleChunk<LionRule>(w, g, m, nullptr, n, s, set);
}
// The fused update-and-copy loop (fused_update-inl.h).
void LionFused(const FusedPiece& p, FusedMode mode, const float* s, CoeffSet set, bool) {
  FusedUpdate<LionRule>(p, mode, s, set);
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
HWY_EXPORT(LionFused);

void run_UPDATE_LION(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(Lion), &HWY_DYNAMIC_DISPATCH(LionFused));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
