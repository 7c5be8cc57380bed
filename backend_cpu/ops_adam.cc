// CPU ops of the Adam family: adam (L2 weight decay) and adamw (decoupled).
// Highway compiles this file once per SIMD target (foreach_target) and dispatches at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_adam.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/fused_update-inl.h"
#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

template <bool kDecoupled>
struct AdamRule {
  static constexpr bool kHasM = true, kHasV = true;
  template <class P, class V>
  static HWY_INLINE void apply(V& w, V g, V& m, V& v, const rules::Coeffs<V>& c) {
    if (kDecoupled) {
      rules::adamw<P>(w, g, m, v, c);
    } else {
      rules::adam<P>(w, g, m, v, c);
    }
  }
  // amsgrad: x is the element's running max of v (VMAX).
  template <class P, class V>
  static HWY_INLINE void apply_x(V& w, V g, V& m, V& v, V& x, const rules::Coeffs<V>& c) {
    if (kDecoupled) {
      rules::adamw_amsgrad<P>(w, g, m, v, x, c);
    } else {
      rules::adam_amsgrad<P>(w, g, m, v, x, c);
    }
  }
};

// Two exported kernels per rule: the update (ElementwiseFn) and its amsgrad form
// (ElementwiseXFn), the same rule reading and writing VMAX too.
#define RN_ADAM_KERNELS(name, decoupled)                                                                      \
  void name(float* w, const float* g, float* m, float* v, size_t n, const float* s, CoeffSet set, bool) {      \
    RuleChunk<AdamRule<decoupled>>(w, g, m, v, n, s, set);                                                     \
  }                                                                                                          \
  void name##Amsgrad(float* w, const float* g, float* m, float* v, float* x, size_t n, const float* s,   \
                     CoeffSet set, bool) {                                                                   \
    RuleChunkX<AdamRule<decoupled>>(w, g, m, v, x, n, s, set);                                               \
  }
RN_ADAM_KERNELS(Adam, false)
RN_ADAM_KERNELS(AdamW, true)
#undef RN_ADAM_KERNELS

// The fused update-and-copy loops (fused_update-inl.h; one per vector width).
void AdamFused(const FusedPiece& p, FusedMode mode, const float* s, CoeffSet set, bool) {
  FusedUpdate<AdamRule<false>>(p, mode, s, set);
}
void AdamWFused(const FusedPiece& p, FusedMode mode, const float* s, CoeffSet set, bool) {
  FusedUpdate<AdamRule<true>>(p, mode, s, set);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <vector>

#include "backend_cpu/cpu_ops.h"
#include "backend_cpu/ops_adam.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(Adam);
HWY_EXPORT(AdamAmsgrad);
HWY_EXPORT(AdamW);
HWY_EXPORT(AdamWAmsgrad);
HWY_EXPORT(AdamFused);
HWY_EXPORT(AdamWFused);

ElementwiseFn adam_kernel(bool decoupled) {
  return decoupled ? &HWY_DYNAMIC_DISPATCH(AdamW) : &HWY_DYNAMIC_DISPATCH(Adam);
}

ElementwiseXFn adam_amsgrad_kernel(bool decoupled) {
  return decoupled ? &HWY_DYNAMIC_DISPATCH(AdamWAmsgrad) : &HWY_DYNAMIC_DISPATCH(AdamAmsgrad);
}

// A node with a VMAX span (amsgrad) runs the amsgrad kernel (run_elementwise's run-time choice).
void run_UPDATE_ADAM(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, adam_kernel(false), &HWY_DYNAMIC_DISPATCH(AdamFused), adam_amsgrad_kernel(false));
}
void run_UPDATE_ADAMW(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, adam_kernel(true), &HWY_DYNAMIC_DISPATCH(AdamWFused), adam_amsgrad_kernel(true));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
