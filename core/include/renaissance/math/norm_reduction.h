// The canonical reduction order of every per-tensor norm (docs/reproducibility.md), written once
// and used by both backends. Norm passes (NORM_TILE_PARTIALS, NORM_TRUST_RATIO) follow it, so a
// norm is the same double on every backend, SIMD target, thread count and launch shape.
//
// Each tensor of the group a norm pass covers is cut into tiles of kNormTile elements (the last
// one may be short). A tile is read in rounds of kNormRound = kNormLanes * kNormQuad elements;
// element e of the tile (0 <= e < length) belongs to lane norm_lane_of(e) = (e mod kNormRound) /
// kNormQuad, so lane j owns the quads [4j, 4j+4), [4j+1024, 4j+1028), ... (a 16-byte vector per
// lane and round on a GPU, consecutive lanes reading consecutive quads). Lane j accumulates in
// double, starting at 0.0, the squares of its elements in increasing element order (round by
// round, and within a quad element by element); an element past the tile's end is not added
// (adding its +0.0 would change nothing either). The lanes are then combined by a fixed halving
// tree: for s = kNormLanes/2, ..., 1: lane[j] += lane[j + s] for j < s. Lane 0 is the tile's
// partial.
//
// A tensor's sum combines its tile partials one level up in the same shape: sum-lane k
// (0 <= k < kNormLanes) adds, in order from 0.0, the partials of the tensor's tiles k, k + 256,
// k + 512, ...; the same halving tree combines the sum-lanes; lane 0 is the sum. Both levels are
// short dependency chains (16 elements per lane; tiles/256 partials per sum-lane), so a device
// computes a tensor's sum with one block and no long serial loop (a 50257x768 embedding has
// 9424 tiles: 37 additions per sum-lane instead of 9424 in a row).
#pragma once

#include <cstdint>
#include <vector>

#include "renaissance/math/host_device.h"

namespace renaissance {
namespace math {

constexpr int kNormTile = 4096;
constexpr int kNormLanes = 256;
constexpr int kNormQuad = 4;                            // consecutive elements of a lane per round
constexpr int kNormRound = kNormLanes * kNormQuad;      // elements of one round
constexpr int kNormRounds = kNormTile / kNormRound;     // rounds of a whole tile
static_assert(kNormTile % kNormRound == 0, "a tile is a whole number of rounds");

// Every tile partial holds this many sums (‖w‖² and ‖ĝ‖² for the LARS trust ratio, ‖w‖² and
// ‖u‖² for LAMB), stored next to each other: partials[kNormComponents * tile + c].
constexpr int kNormComponents = 2;

// The lane that accumulates element e of a tile.
RN_HD int norm_lane_of(int e) { return (e % kNormRound) / kNormQuad; }

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

// Sum-lane k of a tensor's combination: partials (the tensor's first tile's, `count` tiles) of
// tiles k, k + kNormLanes, ... added in order from 0.0 into sums[0..kNormComponents).
// Loads come in batches of kSumLaneBatch tiles before their additions (a device thread then has
// several loads in flight instead of one); the additions are the same, in the same order.
RN_HD void tensor_sum_lane(const double* partials, int64_t count, int k, double* sums) {
  constexpr int kSumLaneBatch = 8;
  for (int c = 0; c < kNormComponents; ++c) sums[c] = 0.0;
  int64_t t = k;
  for (; t + (kSumLaneBatch - 1) * static_cast<int64_t>(kNormLanes) < count; t += kSumLaneBatch * kNormLanes) {
    double p[kSumLaneBatch][kNormComponents];
    for (int b = 0; b < kSumLaneBatch; ++b) {
      for (int c = 0; c < kNormComponents; ++c) p[b][c] = partials[kNormComponents * (t + b * kNormLanes) + c];
    }
    for (int b = 0; b < kSumLaneBatch; ++b) {
      for (int c = 0; c < kNormComponents; ++c) sums[c] = sums[c] + p[b][c];
    }
  }
  for (; t < count; t += kNormLanes) {
    for (int c = 0; c < kNormComponents; ++c) sums[c] = sums[c] + partials[kNormComponents * t + c];
  }
}

// The canonical combination of a tensor's `count` tile partials into sums[0..kNormComponents)
// (host code; a device runs tensor_sum_lane in kNormLanes threads and the same tree).
inline void combine_tile_partials(const double* partials, int64_t count, double* sums) {
  double lanes[kNormComponents][kNormLanes];
  for (int k = 0; k < kNormLanes; ++k) {
    double s[kNormComponents];
    tensor_sum_lane(partials, count, k, s);
    for (int c = 0; c < kNormComponents; ++c) lanes[c][k] = s[c];
  }
  for (int c = 0; c < kNormComponents; ++c) {
    norm_lane_tree(lanes[c]);
    sums[c] = lanes[c][0];
  }
}

// Σ x² over a tensor's `count` elements in the canonical order above (tiles of kNormTile, lanes of
// quads, the halving trees, then combine_tile_partials): the double a norm pass computes for a
// tensor of these elements (host code).
inline double tensor_sum_of_squares(const float* x, int64_t count) {
  const int64_t tiles = (count + kNormTile - 1) / kNormTile;
  std::vector<double> partials(static_cast<size_t>(kNormComponents * tiles), 0.0);
  double lanes[kNormLanes];
  for (int64_t t = 0; t < tiles; ++t) {
    for (double& l : lanes) l = 0.0;
    const int64_t begin = t * kNormTile;
    const int length = static_cast<int>(count - begin < kNormTile ? count - begin : kNormTile);
    for (int e = 0; e < length; ++e) lanes[norm_lane_of(e)] = lanes[norm_lane_of(e)] + square_in_double(x[begin + e]);
    norm_lane_tree(lanes);
    partials[static_cast<size_t>(kNormComponents * t)] = lanes[0];
  }
  double sums[kNormComponents];
  combine_tile_partials(partials.data(), tiles, sums);
  return sums[0];
}

// ---- Global gradient norm (clipping, docs/math.md "Gradient-norm clipping") ----
// The total ‖ĝ‖ of a step, ĝ = g*(1/scale) rounded to float, is reduced over the whole G family
// as one contiguous span in arena order (bias-like roles first, then the weight roles, every
// region's zero padding included: padding adds +0.0). The span is cut into grad-norm tiles of
// kGradNormTile elements, tile t = elements [t*kGradNormTile, min((t+1)*kGradNormTile, count));
// within a tile lane j (0 <= j < kNormLanes) accumulates in double, in order, the squares of
// elements j, j + kNormLanes, j + 2*kNormLanes, ... (one float per lane and row of 256: this
// pass is fused with the non-finite check, which reads G with 4-byte loads, and keeps the order
// it had before the tensor norms moved to quads), then norm_lane_tree; lane 0 is the partial.
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
