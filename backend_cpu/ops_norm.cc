// CPU ops of the norm passes: NORM_TILE_PARTIALS (the per-tile squared norms in the canonical
// order of renaissance/math/norm_reduction.h; what is squared follows node.norm_inputs: w and ĝ
// for LARS, w and LAMB's u after the moment update) and NORM_TRUST_RATIO (each tensor's partials
// combined by math::combine_tile_partials, then the formula node.ratio names, from the math file).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_norm.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"
#include "renaissance/math/norm_reduction.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// The lane sums of one tile of n elements in the canonical quad order (math/norm_reduction.h):
// element e goes to lane (e mod kNormRound) / kNormQuad, each lane adding its elements in
// increasing order. A whole round is read with LoadInterleaved4, which hands the k-th elements
// of the quads of consecutive lanes to consecutive double lanes, so every lane adds its quad's
// elements 0, 1, 2, 3 in that order, round after round, on any vector width. The elements after
// the last whole round go one by one in increasing order: the same additions per lane.
HWY_INLINE void AddSquaresByQuad(const float* HWY_RESTRICT x, size_t n, double* HWY_RESTRICT lanes_acc) {
  using math::kNormLanes;
  using math::kNormRound;
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t lanes = hn::Lanes(dd);
  const size_t rounds = n / kNormRound;
  size_t done = 0;
  if (rounds > 0 && kNormLanes % lanes == 0) {
    for (size_t j = 0; j < static_cast<size_t>(kNormLanes); j += lanes) {
      auto acc = hn::Load(dd, lanes_acc + j);
      for (size_t r = 0; r < rounds; ++r) {
        hn::Vec<decltype(df)> q0, q1, q2, q3;
        hn::LoadInterleaved4(df, x + r * kNormRound + math::kNormQuad * j, q0, q1, q2, q3);
        const auto d0 = hn::PromoteTo(dd, q0);
        acc = hn::Add(acc, hn::Mul(d0, d0));
        const auto d1 = hn::PromoteTo(dd, q1);
        acc = hn::Add(acc, hn::Mul(d1, d1));
        const auto d2 = hn::PromoteTo(dd, q2);
        acc = hn::Add(acc, hn::Mul(d2, d2));
        const auto d3 = hn::PromoteTo(dd, q3);
        acc = hn::Add(acc, hn::Mul(d3, d3));
      }
      hn::Store(acc, dd, lanes_acc + j);
    }
    done = rounds * kNormRound;
  }
  for (size_t e = done; e < n; ++e) {
    double& lane = lanes_acc[math::norm_lane_of(static_cast<int>(e))];
    lane = lane + math::square_in_double(x[e]);
  }
}

// The partials of tile t from its two squared arrays a and b (n elements each): lanes from 0,
// then the fixed tree (math::norm_lane_tree), as math/norm_reduction.h defines.
void StoreTilePartials(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n, size_t t,
                       double* HWY_RESTRICT partials) {
  HWY_ALIGN double a_lanes[math::kNormLanes];
  HWY_ALIGN double b_lanes[math::kNormLanes];
  std::fill(a_lanes, a_lanes + math::kNormLanes, 0.0);
  std::fill(b_lanes, b_lanes + math::kNormLanes, 0.0);
  AddSquaresByQuad(a, n, a_lanes);
  AddSquaresByQuad(b, n, b_lanes);
  math::norm_lane_tree(a_lanes);
  math::norm_lane_tree(b_lanes);
  partials[math::kNormComponents * t] = a_lanes[0];
  partials[math::kNormComponents * t + 1] = b_lanes[0];
}

// Squared norms of w and ĝ (LARS) over tiles [tile_begin, tile_end): ĝ = (g*(1/scale))*clip is
// formed in float into a tile buffer, then both arrays are reduced lane by lane and by the fixed
// tree (AddSquaresByQuad, math::norm_lane_tree).
void WeightAndGradientPartials(const float* HWY_RESTRICT w, const float* HWY_RESTRICT g, const NormTile* tiles,
                               size_t tile_begin, size_t tile_end, const float* s, double* HWY_RESTRICT partials) {
  const auto cv = vector_coeffs(s, true);
  const auto cs = scalar_coeffs(s, true);
  HWY_ALIGN float gh[math::kNormTile];
  for (size_t t = tile_begin; t < tile_end; ++t) {
    const NormTile& tile = tiles[t];
    const size_t n = static_cast<size_t>(tile.length);
    UnscaleInto(g + tile.start, n, cv, cs, gh);
    StoreTilePartials(w + tile.start, gh, n, t, partials);
  }
}

// LAMB phase 1 over tiles [tile_begin, tile_end): m and v updated from ĝ, the direction u formed
// (rules::lamb_moments) into a tile buffer, then the squared norms of w (unchanged in phase 1)
// and u. Phase 2 recomputes u from the new m and v with the same function (ops_lamb.cc).
void LambMomentPartials(const float* HWY_RESTRICT w, const float* HWY_RESTRICT g, float* HWY_RESTRICT m,
                        float* HWY_RESTRICT v, const NormTile* tiles, size_t tile_begin, size_t tile_end,
                        const float* s, double* HWY_RESTRICT partials) {
  const FloatTag d;
  const size_t lanes = hn::Lanes(d);
  const auto cv = vector_coeffs(s, true);
  const auto cs = scalar_coeffs(s, true);
  HWY_ALIGN float u[math::kNormTile];
  for (size_t t = tile_begin; t < tile_end; ++t) {
    const NormTile& tile = tiles[t];
    const size_t n = static_cast<size_t>(tile.length);
    const float* tw = w + tile.start;
    const float* tg = g + tile.start;
    float* tm = m + tile.start;
    float* tv = v + tile.start;
    size_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      FloatVec mv = hn::LoadU(d, tm + i);
      FloatVec vv = hn::LoadU(d, tv + i);
      const FloatVec uv = rules::lamb_moments<VectorPolicy>(hn::LoadU(d, tw + i), hn::LoadU(d, tg + i), mv, vv, cv);
      hn::StoreU(mv, d, tm + i);
      hn::StoreU(vv, d, tv + i);
      hn::StoreU(uv, d, u + i);
    }
    for (; i < n; ++i) u[i] = rules::lamb_moments<rules::ScalarPolicy>(tw[i], tg[i], tm[i], tv[i], cs);
    StoreTilePartials(tw, u, n, t, partials);
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
HWY_EXPORT(LambMomentPartials);

void run_NORM_TILE_PARTIALS(const CpuContext& ctx, const GraphNode& node) {
  if (ctx.step_skipped()) return;
  const float* w = ctx.at<float>(node.w);
  const GradSource g_src = grad_source(ctx, node);  // node.grad_dtype encodings (grad_dtype.h)
  const NormTile* tiles = ctx.at<NormTile>(node.norm.tiles);
  double* partials = ctx.at<double>(node.norm.partials);
  switch (node.norm_inputs) {
    case NormInputs::kWeightAndGradient: {
      auto* fn = &HWY_DYNAMIC_DISPATCH(WeightAndGradientPartials);
      parallel_blocks(ctx.threads, node.norm.tiles.count, kTilesPerBlock, [&](uint64_t b, uint64_t e) {
        const float* g = fp32_grad(g_src, tile_range_begin(tiles, b), tile_range_end(tiles, e));
        for_tile_blocks(ctx, node, tiles, b, e,
                        [&](uint64_t tb, uint64_t te, const float* s) { fn(w, g, tiles, tb, te, s, partials); });
      }, ctx.tuning.schedule);
      return;
    }
    case NormInputs::kLambMoments: {
      float* m = ctx.at<float>(node.m);
      float* v = ctx.at<float>(node.v);
      auto* fn = &HWY_DYNAMIC_DISPATCH(LambMomentPartials);
      parallel_blocks(ctx.threads, node.norm.tiles.count, kTilesPerBlock, [&](uint64_t b, uint64_t e) {
        const float* g = fp32_grad(g_src, tile_range_begin(tiles, b), tile_range_end(tiles, e));
        for_tile_blocks(ctx, node, tiles, b, e,
                        [&](uint64_t tb, uint64_t te, const float* s) { fn(w, g, m, v, tiles, tb, te, s, partials); });
      }, ctx.tuning.schedule);
      return;
    }
  }
}

void run_NORM_TRUST_RATIO(const CpuContext& ctx, const GraphNode& node) {
  if (ctx.step_skipped()) return;
  const NormTensor* tensors = ctx.at<NormTensor>(node.norm.tensors);
  const double* partials = ctx.at<double>(node.norm.partials);
  float* ratio = ctx.at<float>(node.n);
  // H > 1: each tensor's ratio from its own block's configured doubles (scalars.h).
  const int32_t* blocks = node.tensor_blocks.count ? ctx.at<int32_t>(node.tensor_blocks) : nullptr;
  for (uint64_t k = 0; k < node.norm.tensors.count; ++k) {
    double sums[math::kNormComponents];
    math::combine_tile_partials(partials + math::kNormComponents * tensors[k].first_tile, tensors[k].tile_count, sums);
    const double* f64 = ctx.scalars.f64 + (blocks ? blocks[k] * kNumScalarF64 : 0);
    ratio[k] = math::trust_ratio(node.ratio == NormRatio::kLamb, sums[0], sums[1], f64);
  }
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
