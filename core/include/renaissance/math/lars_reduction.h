// The canonical reduction order of the LARS norms (DESIGN.md §4), shared by both backends.
//
// Each weight-group tensor is cut into tiles of kLarsTile elements (the last one may be short).
// Within a tile, lane j (0 <= j < kLarsLanes) accumulates in double, in order, the squares of
// elements j, j + kLarsLanes, j + 2*kLarsLanes, ...; an element past the tensor's end counts as
// +0.0, which leaves a sum of squares unchanged. The lanes are then combined by a fixed halving
// tree: for s = kLarsLanes/2, ..., 1: lane[j] += lane[j + s] for j < s. Lane 0 is the tile's
// partial. A tensor's sum is its tile partials added in tile order, in double, starting at 0.
// Nothing here depends on thread count, grid size or SIMD width, so every backend that follows
// this order produces the same bits.
#pragma once

#include <cstdint>

#include "renaissance/math/host_device.h"

namespace renaissance {
namespace math {

constexpr int kLarsTile = 4096;
constexpr int kLarsLanes = 256;
constexpr int kLarsPerLane = kLarsTile / kLarsLanes;
static_assert(kLarsTile % kLarsLanes == 0, "a tile is a whole number of lane strides");

// The square of ĝ = g*(1/scale) (or of w, with inv_scale = 1) in double.
RN_HD double square_in_double(float x) {
  const double d = static_cast<double>(x);
  return d * d;
}

// The fixed halving tree over kLarsLanes lane sums; the result is left in lanes[0].
RN_HD void lars_lane_tree(double* lanes) {
  for (int s = kLarsLanes / 2; s > 0; s >>= 1) {
    for (int j = 0; j < s; ++j) lanes[j] = lanes[j] + lanes[j + s];
  }
}

}  // namespace math
}  // namespace renaissance
