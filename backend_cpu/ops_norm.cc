// CPU ops of the norm passes: NORM_TILE_PARTIALS (the tile walker's norm pass, tile_walker-inl.h:
// the per-tile squared norms of w and of a second array in the canonical order of
// renaissance/math/norm_reduction.h; the second array is the rule node.norm.inputs names: ĝ for
// LARS, LAMB's u after the moment update) and NORM_TRUST_RATIO (each tensor's partials combined by
// math::combine_tile_partials, then the formula node.norm.ratio names, from the math file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_norm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"
#include "backend_cpu/tile_walker-inl.h"
#include "renaissance/math/norm_reduction.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// The norm-pass rules, one per NormInputs member: x, the array squared beside w, from the rule's
// operands (and the state it writes).

// NormInputs::kWeightAndGradient: x = ĝ = (g*(1/scale))*clip (rules::unscale); reads G only.
struct WeightAndGradientRule {
  static std::tuple<In> operands(const TileArgs& a) { return {In{a.g}}; }
  template <class P, class V>
  static HWY_INLINE void apply(V& x, V g, const rules::Coeffs<V>& c) {
    x = rules::unscale<P>(g, c);
  }
};

// NormInputs::kLambMoments, LAMB phase 1: m and v updated from ĝ and x = u (rules::lamb_moments);
// w is unchanged in phase 1. Phase 2 recomputes u from the new m and v with the same function
// (ops_lamb.cc).
struct LambMomentsRule {
  static std::tuple<In, In, InOut, InOut> operands(const TileArgs& a) {
    return {In{a.w}, In{a.g}, InOut{a.state[0]}, InOut{a.state[1]}};
  }
  template <class P, class V>
  static HWY_INLINE void apply(V& x, V w, V g, V& m, V& v, const rules::Coeffs<V>& c) {
    x = rules::lamb_moments<P>(w, g, m, v, c);
  }
};

void WeightAndGradientPartials(const TileArgs& a) { PartialsTiles<WeightAndGradientRule>(a); }
void LambMomentPartials(const TileArgs& a) { PartialsTiles<LambMomentsRule>(a); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backend_cpu/cpu_ops.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(WeightAndGradientPartials);
HWY_EXPORT(LambMomentPartials);

// TileArgs::state: none for LARS, {M, V} for LAMB, as the rules' operands read them.
void run_NORM_TILE_PARTIALS(const CpuContext& ctx, const GraphNode& node) {
  switch (node.norm.inputs) {
    case NormInputs::kWeightAndGradient:
      return run_tiles(ctx, node, &HWY_DYNAMIC_DISPATCH(WeightAndGradientPartials), TileGrad::kRead);
    case NormInputs::kLambMoments:
      return run_tiles(ctx, node, &HWY_DYNAMIC_DISPATCH(LambMomentPartials), TileGrad::kRead, node.span(Family::kM), node.span(Family::kV));
  }
}

void run_NORM_TRUST_RATIO(const CpuContext& ctx, const GraphNode& node) {
  if (ctx.step_skipped()) return;
  const NormTensor* tensors = ctx.at<NormTensor>(node.norm.tensors);
  const double* partials = ctx.at<double>(node.norm.partials);
  float* ratio = ctx.at<float>(node.span(Family::kN));
  // H > 1: each tensor's ratio from its own block's configured doubles (scalars.h).
  const int32_t* blocks = node.work.tensor_blocks.count ? ctx.at<int32_t>(node.work.tensor_blocks) : nullptr;
  for (uint64_t k = 0; k < node.norm.tensors.count; ++k) {
    double sums[math::kNormComponents];
    math::combine_tile_partials(partials + math::kNormComponents * tensors[k].first_tile, tensors[k].tile_count, sums);
    const double* f64 = ctx.scalars.f64 + (blocks ? blocks[k] * kNumScalarF64 : 0);
    ratio[k] = math::trust_ratio(node.norm.ratio == NormRatio::kLamb, sums[0], sums[1], f64);
  }
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
