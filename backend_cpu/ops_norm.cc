// CPU ops of the norm passes: NORM_TILE_PARTIALS (the per-tile squared norms in the canonical
// order of renaissance/math/norm_reduction.h) and NORM_TRUST_RATIO (each tensor's partials
// combined by math::add_tile_partials, then the kind's ratio formula from the math file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_norm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"
#include "renaissance/math/norm_reduction.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// Squared norms of w and ĝ over tiles [tile_begin, tile_end), lane by lane then the fixed
// tree. Full tiles use double vectors over consecutive lanes; a short tile takes the scalar
// path, which performs the same additions in the same order (missing elements would add +0.0,
// a no-op).
void WeightAndGradientPartials(const float* HWY_RESTRICT w, const float* HWY_RESTRICT g, const NormTile* tiles,
                               size_t tile_begin, size_t tile_end, float inv_scale, double* HWY_RESTRICT partials) {
  using math::kNormLanes;
  using math::kNormPerLane;
  using math::kNormTile;
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t lanes = hn::Lanes(dd);
  const auto inv = hn::Set(df, inv_scale);
  HWY_ALIGN double w_lanes[kNormLanes];
  HWY_ALIGN double g_lanes[kNormLanes];
  for (size_t t = tile_begin; t < tile_end; ++t) {
    const NormTile& tile = tiles[t];
    const float* tw = w + tile.start;
    const float* tg = g + tile.start;
    if (tile.length == kNormTile && kNormLanes % lanes == 0) {
      for (size_t j = 0; j < static_cast<size_t>(kNormLanes); j += lanes) {
        auto aw = hn::Zero(dd);
        auto ag = hn::Zero(dd);
        for (int k = 0; k < kNormPerLane; ++k) {
          const size_t idx = j + static_cast<size_t>(k) * kNormLanes;
          const auto wv = hn::PromoteTo(dd, hn::LoadU(df, tw + idx));
          const auto gv = hn::PromoteTo(dd, hn::Mul(hn::LoadU(df, tg + idx), inv));
          aw = hn::Add(aw, hn::Mul(wv, wv));
          ag = hn::Add(ag, hn::Mul(gv, gv));
        }
        hn::Store(aw, dd, w_lanes + j);
        hn::Store(ag, dd, g_lanes + j);
      }
    } else {
      for (int j = 0; j < kNormLanes; ++j) {
        double aw = 0.0, ag = 0.0;
        for (int idx = j; idx < tile.length; idx += kNormLanes) {
          aw = aw + math::square_in_double(tw[idx]);
          ag = ag + math::square_in_double(rules::ScalarPolicy::mul(tg[idx], inv_scale));
        }
        w_lanes[j] = aw;
        g_lanes[j] = ag;
      }
    }
    math::norm_lane_tree(w_lanes);
    math::norm_lane_tree(g_lanes);
    partials[math::kNormComponents * t] = w_lanes[0];
    partials[math::kNormComponents * t + 1] = g_lanes[0];
  }
}

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

void run_NORM_TILE_PARTIALS(const CpuContext& ctx, const GraphNode& node) {
  if (ctx.step_skipped()) return;
  const float* w = ctx.at<float>(node.w);
  const float* g = ctx.at<float>(node.g);
  const NormTile* tiles = ctx.at<NormTile>(node.norm.tiles);
  double* partials = ctx.at<double>(node.norm.partials);
  const float inv_scale = ctx.scalars.f32[kInvLossScale];
  // NormInputs has one member today; a new one gets its own partials function here.
  static_assert(static_cast<int>(NormInputs::kWeightAndGradient) == 0, "one NormInputs so far");
  auto* fn = &HWY_DYNAMIC_DISPATCH(WeightAndGradientPartials);
  parallel_blocks(ctx.threads, node.norm.tiles.count, kTilesPerBlock, [&](uint64_t b, uint64_t e) {
    fn(w, g, tiles, b, e, inv_scale, partials);
  });
}

void run_NORM_TRUST_RATIO(const CpuContext& ctx, const GraphNode& node) {
  if (ctx.step_skipped()) return;
  const NormTensor* tensors = ctx.at<NormTensor>(node.norm.tensors);
  const double* partials = ctx.at<double>(node.norm.partials);
  float* eta = ctx.at<float>(node.n);
  const double* f64 = ctx.scalars.f64;
  for (uint64_t k = 0; k < node.norm.tensors.count; ++k) {
    double sums[math::kNormComponents] = {0.0, 0.0};
    math::add_tile_partials(sums, partials + math::kNormComponents * tensors[k].first_tile, tensors[k].tile_count);
    eta[k] = math::lars_trust_ratio(sums[0], sums[1], f64[kTrustCoefficientD], f64[kWeightDecayD], f64[kEpsD]);
  }
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
