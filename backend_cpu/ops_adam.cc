// CPU ops of the Adam family: adam (L2 weight decay) and adamw (decoupled).
// Highway compiles this file once per SIMD target (foreach_target) and dispatches at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_adam.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

template <bool kDecoupled, size_t kUnroll>
void AdamChunk(float* w, const float* g, float* m, float* v, size_t n, const float* s, bool weight_group) {
  const auto cv = vector_coeffs(s, weight_group);
  const auto cs = scalar_coeffs(s, weight_group);
  auto apply = [](auto& wv, auto gv, auto& mv, auto& vv, const auto& c, auto policy) {
    using P = decltype(policy);
    if (kDecoupled) {
      rules::adamw<P>(wv, gv, mv, vv, c);
    } else {
      rules::adam<P>(wv, gv, mv, vv, c);
    }
  };
  for_each_element<true, true, kUnroll>(
      w, g, m, v, n,
      [&](FloatVec& wv, FloatVec gv, FloatVec& mv, FloatVec& vv) { apply(wv, gv, mv, vv, cv, VectorPolicy()); },
      [&](float& wv, float gv, float& mv, float& vv) { apply(wv, gv, mv, vv, cs, rules::ScalarPolicy()); });
}

// One exported kernel per (rule, vectors per iteration: CpuTuning::unroll).
#define RN_ADAM_KERNEL(name, decoupled, unroll)                                                              \
  void name(float* w, const float* g, float* m, float* v, size_t n, const float* s, bool wg, bool) {          \
    AdamChunk<decoupled, unroll>(w, g, m, v, n, s, wg);                                                        \
  }
RN_ADAM_KERNEL(Adam, false, 1)
RN_ADAM_KERNEL(Adam2, false, 2)
RN_ADAM_KERNEL(Adam4, false, 4)
RN_ADAM_KERNEL(AdamW, true, 1)
RN_ADAM_KERNEL(AdamW2, true, 2)
RN_ADAM_KERNEL(AdamW4, true, 4)
#undef RN_ADAM_KERNEL

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backend_cpu/cpu_ops.h"
#include "backend_cpu/ops_adam.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(Adam);
HWY_EXPORT(Adam2);
HWY_EXPORT(Adam4);
HWY_EXPORT(AdamW);
HWY_EXPORT(AdamW2);
HWY_EXPORT(AdamW4);

ElementwiseFn adam_kernel(bool decoupled, unsigned unroll) {
  switch (unroll) {
    case 2: return decoupled ? &HWY_DYNAMIC_DISPATCH(AdamW2) : &HWY_DYNAMIC_DISPATCH(Adam2);
    case 4: return decoupled ? &HWY_DYNAMIC_DISPATCH(AdamW4) : &HWY_DYNAMIC_DISPATCH(Adam4);
    default: return decoupled ? &HWY_DYNAMIC_DISPATCH(AdamW) : &HWY_DYNAMIC_DISPATCH(Adam);
  }
}

void run_UPDATE_ADAM(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, adam_kernel(false, ctx.tuning.unroll));
}
void run_UPDATE_ADAMW(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, adam_kernel(true, ctx.tuning.unroll));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
