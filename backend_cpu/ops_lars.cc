// CPU ops of LARS: the per-tile squared norms in the canonical order of
// renaissance/math/lars_reduction.h, the per-tensor trust ratios, and the tile-wise update of
// the weight group (plain and Nesterov). The bias-like group uses the SGD ops.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_lars.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"
#include "renaissance/math/lars_reduction.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// Squared norms of w and ĝ over one tile, lane by lane then the fixed tree. Full tiles use
// double vectors over consecutive lanes; a short tile takes the scalar path, which performs
// the same additions in the same order (missing elements would add +0.0, a no-op).
void TileNorms(const float* HWY_RESTRICT w, const float* HWY_RESTRICT g, const LarsTile* tiles,
               size_t tile_begin, size_t tile_end, float inv_scale, double* HWY_RESTRICT partials) {
  using math::kLarsLanes;
  using math::kLarsPerLane;
  using math::kLarsTile;
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t lanes = hn::Lanes(dd);
  const auto inv = hn::Set(df, inv_scale);
  HWY_ALIGN double w_lanes[kLarsLanes];
  HWY_ALIGN double g_lanes[kLarsLanes];
  for (size_t t = tile_begin; t < tile_end; ++t) {
    const LarsTile& tile = tiles[t];
    const float* tw = w + tile.start;
    const float* tg = g + tile.start;
    if (tile.length == kLarsTile && kLarsLanes % lanes == 0) {
      for (size_t j = 0; j < static_cast<size_t>(kLarsLanes); j += lanes) {
        auto aw = hn::Zero(dd);
        auto ag = hn::Zero(dd);
        for (int k = 0; k < kLarsPerLane; ++k) {
          const size_t idx = j + static_cast<size_t>(k) * kLarsLanes;
          const auto wv = hn::PromoteTo(dd, hn::LoadU(df, tw + idx));
          const auto gv = hn::PromoteTo(dd, hn::Mul(hn::LoadU(df, tg + idx), inv));
          aw = hn::Add(aw, hn::Mul(wv, wv));
          ag = hn::Add(ag, hn::Mul(gv, gv));
        }
        hn::Store(aw, dd, w_lanes + j);
        hn::Store(ag, dd, g_lanes + j);
      }
    } else {
      for (int j = 0; j < kLarsLanes; ++j) {
        double aw = 0.0, ag = 0.0;
        for (int idx = j; idx < tile.length; idx += kLarsLanes) {
          aw = aw + math::square_in_double(tw[idx]);
          ag = ag + math::square_in_double(rules::ScalarPolicy::mul(tg[idx], inv_scale));
        }
        w_lanes[j] = aw;
        g_lanes[j] = ag;
      }
    }
    math::lars_lane_tree(w_lanes);
    math::lars_lane_tree(g_lanes);
    partials[2 * t] = w_lanes[0];
    partials[2 * t + 1] = g_lanes[0];
  }
}

// The LARS update of the weight-group elements of tiles [tile_begin, tile_end).
template <bool kNesterov>
void LarsTilesUpdate(float* w, const float* g, float* m, const LarsTile* tiles, size_t tile_begin,
                     size_t tile_end, const float* eta, const float* s) {
  const FloatTag d;
  const auto cv = vector_coeffs(s, true);
  const auto cs = scalar_coeffs(s, true);
  for (size_t t = tile_begin; t < tile_end; ++t) {
    const LarsTile& tile = tiles[t];
    const float lr_eta = rules::lars_lr_eta(s[kLr], eta[tile.tensor]);
    const FloatVec lr_eta_v = hn::Set(d, lr_eta);
    for_each_element<true, false>(
        w + tile.start, g + tile.start, m + tile.start, nullptr, static_cast<size_t>(tile.length),
        [&](FloatVec& wv, FloatVec gv, FloatVec& mv, FloatVec&) {
          rules::lars<VectorPolicy, kNesterov>(wv, gv, mv, lr_eta_v, cv);
        },
        [&](float& wv, float gv, float& mv, float&) {
          rules::lars<rules::ScalarPolicy, kNesterov>(wv, gv, mv, lr_eta, cs);
        });
  }
}

void LarsUpdate(float* w, const float* g, float* m, const LarsTile* tiles, size_t b, size_t e,
                const float* eta, const float* s) {
  LarsTilesUpdate<false>(w, g, m, tiles, b, e, eta, s);
}
void LarsNesterovUpdate(float* w, const float* g, float* m, const LarsTile* tiles, size_t b, size_t e,
                        const float* eta, const float* s) {
  LarsTilesUpdate<true>(w, g, m, tiles, b, e, eta, s);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backend_cpu/cpu_backend.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(TileNorms);
HWY_EXPORT(LarsUpdate);
HWY_EXPORT(LarsNesterovUpdate);

namespace {

// Tiles per OpenMP work item: 4 tiles are 16K elements, like kChunkElements.
constexpr int64_t kTilesPerItem = 4;

template <class Fn>
void parallel_tiles(const CpuContext& ctx, int64_t tiles, Fn&& fn) {
  const int64_t items = (tiles + kTilesPerItem - 1) / kTilesPerItem;
  const int threads = static_cast<int>(std::min<int64_t>(ctx.threads, std::max<int64_t>(items, 1)));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < items; ++i) {
    fn(static_cast<size_t>(i * kTilesPerItem), static_cast<size_t>(std::min(tiles, (i + 1) * kTilesPerItem)));
  }
}

using LarsFn = void (*)(float*, const float*, float*, const LarsTile*, size_t, size_t, const float*,
                        const float*);

void run_lars_update(const CpuContext& ctx, const GraphNode& node, LarsFn fn, const Span& tiles_span) {
  if (ctx.step_skipped()) return;
  float* w = ctx.at<float>(node.w);
  const float* g = ctx.at<float>(node.g);
  float* m = ctx.at<float>(node.m);
  const float* eta = ctx.at<float>(node.n);
  const LarsTile* tiles = ctx.at<LarsTile>(tiles_span);
  parallel_tiles(ctx, static_cast<int64_t>(tiles_span.count), [&](size_t b, size_t e) {
    fn(w, g, m, tiles, b, e, eta, ctx.scalars.f32);
  });
}

}  // namespace

void run_LARS_TILE_NORMS(const CpuContext& ctx, const GraphNode& node) {
  if (ctx.step_skipped()) return;
  const CompiledStep& step = *ctx.step;
  const float* w = ctx.at<float>(node.w);
  const float* g = ctx.at<float>(node.g);
  const LarsTile* tiles = ctx.at<LarsTile>(step.lars_tiles);
  double* partials = ctx.at<double>(step.lars_partials);
  const float inv_scale = ctx.scalars.f32[kInvLossScale];
  auto* fn = &HWY_DYNAMIC_DISPATCH(TileNorms);
  parallel_tiles(ctx, static_cast<int64_t>(step.lars_tiles.count), [&](size_t b, size_t e) {
    fn(w, g, tiles, b, e, inv_scale, partials);
  });
}

void run_LARS_TRUST_RATIO(const CpuContext& ctx, const GraphNode& node) {
  if (ctx.step_skipped()) return;
  const CompiledStep& step = *ctx.step;
  const LarsTensor* tensors = ctx.at<LarsTensor>(step.lars_tensors);
  const double* partials = ctx.at<double>(step.lars_partials);
  float* eta = ctx.at<float>(node.n);
  const double* f64 = ctx.scalars.f64;
  const int64_t count = static_cast<int64_t>(step.lars_tensors.count);
  for (int64_t k = 0; k < count; ++k) {
    // Tile partials in tile order, from 0, in double: the canonical combination.
    double w_sq = 0.0, g_sq = 0.0;
    for (int64_t t = tensors[k].first_tile; t < tensors[k].first_tile + tensors[k].tile_count; ++t) {
      w_sq = w_sq + partials[2 * t];
      g_sq = g_sq + partials[2 * t + 1];
    }
    eta[k] = math::lars_trust_ratio(w_sq, g_sq, f64[kTrustCoefficientD], f64[kWeightDecayD], f64[kEpsD]);
  }
}

void run_UPDATE_LARS(const CpuContext& ctx, const GraphNode& node) {
  run_lars_update(ctx, node, &HWY_DYNAMIC_DISPATCH(LarsUpdate), ctx.step->lars_tiles);
}
void run_UPDATE_LARS_NESTEROV(const CpuContext& ctx, const GraphNode& node) {
  run_lars_update(ctx, node, &HWY_DYNAMIC_DISPATCH(LarsNesterovUpdate), ctx.step->lars_tiles);
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
