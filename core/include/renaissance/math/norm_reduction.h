// The canonical reduction order of every per-tensor norm (docs/reproducibility.md), written once
// and used by both backends. Norm passes (NORM_TILE_PARTIALS, NORM_TRUST_RATIO) follow it, so a
// norm is the same double on every backend, SIMD target, thread count and launch shape.
//
// Each tensor of the group a norm pass covers is cut into tiles of kNormTile elements (the last
// one may be short). Within a tile, lane j (0 <= j < kNormLanes) accumulates in double, in order,
// the squares of elements j, j + kNormLanes, j + 2*kNormLanes, ...; an element past the tensor's
// end counts as +0.0, which leaves a sum of squares unchanged. The lanes are then combined by a
// fixed halving tree: for s = kNormLanes/2, ..., 1: lane[j] += lane[j + s] for j < s. Lane 0 is
// the tile's partial. A tensor's sum is its tile partials added in tile order, in double,
// starting at 0 (add_tile_partials).
#pragma once

#include <cstdint>

#include "renaissance/math/host_device.h"

namespace renaissance {
namespace math {

constexpr int kNormTile = 4096;
constexpr int kNormLanes = 256;
constexpr int kNormPerLane = kNormTile / kNormLanes;
static_assert(kNormTile % kNormLanes == 0, "a tile is a whole number of lane strides");

// Every tile partial holds this many sums (‖w‖² and ‖ĝ‖² for the LARS trust ratio), stored
// next to each other: partials[kNormComponents * tile + c].
constexpr int kNormComponents = 2;

// The square of ĝ = g*(1/scale) (or of w, with inv_scale = 1) in double.
RN_HD double square_in_double(float x) {
  const double d = static_cast<double>(x);
  return d * d;
}

// The fixed halving tree over kNormLanes lane sums; the result is left in lanes[0].
RN_HD void norm_lane_tree(double* lanes) {
  for (int s = kNormLanes / 2; s > 0; s >>= 1) {
    for (int j = 0; j < s; ++j) lanes[j] = lanes[j] + lanes[j + s];
  }
}

// The canonical combination: adds `count` consecutive tile partials, in tile order, to the
// running sums (sums[c] starts at 0.0 for a tensor's first tile). A backend may call it on
// consecutive chunks of a tensor's tiles; the additions are the same.
RN_HD void add_tile_partials(double* sums, const double* partials, int64_t count) {
  for (int64_t t = 0; t < count; ++t) {
    for (int c = 0; c < kNormComponents; ++c) sums[c] = sums[c] + partials[kNormComponents * t + c];
  }
}

// ---- Global gradient norm (clipping, docs/math.md "Gradient-norm clipping") ----
// The total ‖ĝ‖ of a step, ĝ = g*(1/scale) rounded to float, is reduced over the whole G family
// as one contiguous span in arena order (bias-like roles first, then the weight roles, every
// region's zero padding included: padding adds +0.0). The span is cut into grad-norm tiles of
// kGradNormTile elements, tile t = elements [t*kGradNormTile, min((t+1)*kGradNormTile, count));
// within a tile lane j accumulates in double, in order, the squares of elements j, j + kNormLanes,
// j + 2*kNormLanes, ... (as for tensor norms), then norm_lane_tree; lane 0 is the tile's partial.
// A NaN partial (a NaN gradient) is stored as one fixed NaN (stored_grad_norm_partial), so the
// scratch holds the same bytes on every backend. The partials are then summed like a tile's
// elements one level up (sum_grad_norm_partials): sum-lane j (0 <= j < kGradNormSumLanes) adds,
// in order from 0.0, partials j, j + kGradNormSumLanes, ...; a fixed halving tree combines the
// sum-lanes; the total norm is sqrt of lane 0. Both levels are short dependency chains, so one
// block of threads computes the total on a device without a long serial loop.
constexpr int64_t kGradNormTile = 4 * static_cast<int64_t>(kNormTile);
constexpr int kGradNormSumLanes = 1024;

RN_HD int64_t grad_norm_tile_count(uint64_t count) {
  return static_cast<int64_t>((count + kGradNormTile - 1) / kGradNormTile);
}

// The one NaN a grad-norm partial is stored as (a quiet NaN with an empty payload).
RN_HD double stored_grad_norm_partial(double x) {
  if (x == x) return x;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(0x7ff8000000000000LL);
#else
  const uint64_t bits = 0x7ff8000000000000ULL;
  double nan;
  __builtin_memcpy(&nan, &bits, sizeof(nan));
  return nan;
#endif
}

// Sum-lane j's part of the canonical sum of `count` partials: partials j, j + kGradNormSumLanes,
// ... added in order from 0.0.
RN_HD double grad_norm_sum_lane(const double* partials, int64_t count, int j) {
  double s = 0.0;
  for (int64_t t = j; t < count; t += kGradNormSumLanes) s = s + partials[t];
  return s;
}

// The fixed halving tree over kGradNormSumLanes sum-lanes; the result is left in lanes[0].
RN_HD void grad_norm_sum_tree(double* lanes) {
  for (int s = kGradNormSumLanes / 2; s > 0; s >>= 1) {
    for (int j = 0; j < s; ++j) lanes[j] = lanes[j] + lanes[j + s];
  }
}

}  // namespace math
}  // namespace renaissance
