// CPU ops of the SGD family: sgd, sgd_momentum, sgd_nesterov, each in decoupled or L2 mode.
// Highway compiles this file once per SIMD target (foreach_target) and dispatches at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_sgd.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

enum class SgdRule { kPlain, kMomentum, kNesterov };

template <SgdRule kRule, bool kL2>
void SgdChunk(float* w, const float* g, float* m, size_t n, const float* s, bool weight_group) {
  const auto cv = vector_coeffs(s, weight_group);
  const auto cs = scalar_coeffs(s, weight_group);
  constexpr bool kHasM = kRule != SgdRule::kPlain;
  auto apply = [](auto& wv, auto gv, auto& mv, const auto& c, auto policy) {
    using P = decltype(policy);
    if (kRule == SgdRule::kPlain) rules::sgd<P, kL2>(wv, gv, c);
    if (kRule == SgdRule::kMomentum) rules::sgd_momentum<P, kL2>(wv, gv, mv, c);
    if (kRule == SgdRule::kNesterov) rules::sgd_nesterov<P, kL2>(wv, gv, mv, c);
  };
  for_each_element<kHasM, false>(
      w, g, m, nullptr, n,
      [&](FloatVec& wv, FloatVec gv, FloatVec& mv, FloatVec&) { apply(wv, gv, mv, cv, VectorPolicy()); },
      [&](float& wv, float gv, float& mv, float&) { apply(wv, gv, mv, cs, rules::ScalarPolicy()); });
}

void SgdPlain(float* w, const float* g, float* m, float*, size_t n, const float* s, bool wg, bool l2) {
  l2 ? SgdChunk<SgdRule::kPlain, true>(w, g, m, n, s, wg) : SgdChunk<SgdRule::kPlain, false>(w, g, m, n, s, wg);
}
void SgdMomentum(float* w, const float* g, float* m, float*, size_t n, const float* s, bool wg, bool l2) {
  l2 ? SgdChunk<SgdRule::kMomentum, true>(w, g, m, n, s, wg)
     : SgdChunk<SgdRule::kMomentum, false>(w, g, m, n, s, wg);
}
void SgdNesterov(float* w, const float* g, float* m, float*, size_t n, const float* s, bool wg, bool l2) {
  l2 ? SgdChunk<SgdRule::kNesterov, true>(w, g, m, n, s, wg)
     : SgdChunk<SgdRule::kNesterov, false>(w, g, m, n, s, wg);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backend_cpu/cpu_ops.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(SgdPlain);
HWY_EXPORT(SgdMomentum);
HWY_EXPORT(SgdNesterov);

void run_UPDATE_SGD(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(SgdPlain));
}
void run_UPDATE_SGD_MOMENTUM(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(SgdMomentum));
}
void run_UPDATE_SGD_NESTEROV(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(SgdNesterov));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
