// CPU ops of the SGD family: sgd, sgd_momentum, sgd_nesterov, each in decoupled or L2 mode.
// Highway compiles this file once per SIMD target (foreach_target) and dispatches at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_sgd.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/fused_update-inl.h"
#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

enum class SgdVariant { kPlain, kMomentum, kNesterov };

template <SgdVariant kVariant, bool kL2>
struct SgdRule {
  static constexpr bool kHasM = kVariant != SgdVariant::kPlain, kHasV = false;
  template <class P, class V>
  static HWY_INLINE void apply(V& w, V g, V& m, V&, const rules::Coeffs<V>& c) {
    if (kVariant == SgdVariant::kPlain) rules::sgd<P, kL2>(w, g, c);
    if (kVariant == SgdVariant::kMomentum) rules::sgd_momentum<P, kL2>(w, g, m, c);
    if (kVariant == SgdVariant::kNesterov) rules::sgd_nesterov<P, kL2>(w, g, m, c);
  }
};

// One ElementwiseFn and one FusedFn (fused_update-inl.h) per variant; l2 picks the rule.
#define RN_SGD_KERNELS(name, variant)                                                                        \
  void name(float* w, const float* g, float* m, float*, size_t n, const float* s, CoeffSet set, bool l2) {    \
    l2 ? RuleChunk<SgdRule<variant, true>>(w, g, m, nullptr, n, s, set)                                      \
       : RuleChunk<SgdRule<variant, false>>(w, g, m, nullptr, n, s, set);                                    \
  }                                                                                                          \
  void name##Fused(const FusedPiece& p, FusedMode mode, const float* s, CoeffSet set, bool l2) {              \
    l2 ? FusedUpdate<SgdRule<variant, true>>(p, mode, s, set)                                                \
       : FusedUpdate<SgdRule<variant, false>>(p, mode, s, set);                                              \
  }
RN_SGD_KERNELS(SgdPlain, SgdVariant::kPlain)
RN_SGD_KERNELS(SgdMomentum, SgdVariant::kMomentum)
RN_SGD_KERNELS(SgdNesterov, SgdVariant::kNesterov)
#undef RN_SGD_KERNELS

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
HWY_EXPORT(SgdPlainFused);
HWY_EXPORT(SgdMomentumFused);
HWY_EXPORT(SgdNesterovFused);

void run_UPDATE_SGD(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(SgdPlain), &HWY_DYNAMIC_DISPATCH(SgdPlainFused));
}
void run_UPDATE_SGD_MOMENTUM(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(SgdMomentum), &HWY_DYNAMIC_DISPATCH(SgdMomentumFused));
}
void run_UPDATE_SGD_NESTEROV(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(SgdNesterov), &HWY_DYNAMIC_DISPATCH(SgdNesterovFused));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
