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

template <bool kDecoupled>
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
  for_each_element<true, true>(
      w, g, m, v, n,
      [&](FloatVec& wv, FloatVec gv, FloatVec& mv, FloatVec& vv) { apply(wv, gv, mv, vv, cv, VectorPolicy()); },
      [&](float& wv, float gv, float& mv, float& vv) { apply(wv, gv, mv, vv, cs, rules::ScalarPolicy()); });
}

void Adam(float* w, const float* g, float* m, float* v, size_t n, const float* s, bool wg) {
  AdamChunk<false>(w, g, m, v, n, s, wg);
}
void AdamW(float* w, const float* g, float* m, float* v, size_t n, const float* s, bool wg) {
  AdamChunk<true>(w, g, m, v, n, s, wg);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backend_cpu/cpu_ops.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(Adam);
HWY_EXPORT(AdamW);

namespace {

using AdamFn = void (*)(float*, const float*, float*, float*, size_t, const float*, bool);

void run_adam_kind(const CpuContext& ctx, const GraphNode& node, AdamFn fn) {
  if (ctx.step_skipped()) return;
  float* w = ctx.at<float>(node.w);
  const float* g = ctx.at<float>(node.g);
  float* m = ctx.at<float>(node.m);
  float* v = ctx.at<float>(node.v);
  const float* s = ctx.scalars.f32;
  const bool weight_group = node.group == Group::kWeight;
  parallel_blocks(ctx.threads, node.w.count, kChunkElements, [&](uint64_t begin, uint64_t end) {
    fn(w + begin, g + begin, m + begin, v + begin, end - begin, s, weight_group);
  });
}

}  // namespace

void run_UPDATE_ADAM(const CpuContext& ctx, const GraphNode& node) {
  run_adam_kind(ctx, node, &HWY_DYNAMIC_DISPATCH(Adam));
}
void run_UPDATE_ADAMW(const CpuContext& ctx, const GraphNode& node) {
  run_adam_kind(ctx, node, &HWY_DYNAMIC_DISPATCH(AdamW));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
