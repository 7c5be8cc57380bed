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
// The total is sqrt of the partials added in tile order starting at 0.0 (add_grad_norm_partials).
// A tile is 16 norm tiles so that the serial, in-order sum of the partials stays short.
constexpr int64_t kGradNormTile = 16 * static_cast<int64_t>(kNormTile);

RN_HD int64_t grad_norm_tile_count(uint64_t count) {
  return static_cast<int64_t>((count + kGradNormTile - 1) / kGradNormTile);
}

// Adds `count` consecutive grad-norm tile partials, in order, to *sum (0.0 before the first).
RN_HD void add_grad_norm_partials(double* sum, const double* partials, int64_t count) {
  for (int64_t t = 0; t < count; ++t) *sum = *sum + partials[t];
}

}  // namespace math
}  // namespace renaissance
