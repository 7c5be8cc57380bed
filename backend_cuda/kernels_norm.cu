// CUDA ops of the norm passes: NORM_TILE_PARTIALS (the per-tile squared norms in the canonical
// order of renaissance/math/norm_reduction.h; node.norm_inputs says what: w and ĝ for LARS, or
// LAMB's phase 1, which updates m and v and squares w and u) and NORM_TRUST_RATIO (each tensor's partials
// combined by math::add_tile_partials, then the ratio formula of the math file). Each op is one
// launch whatever the number of tensors: tiles and tensors come from tables the node carries.
#include <cuda_runtime.h>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/elementwise.cuh"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {
namespace {

using math::kNormLanes;
using math::kNormPerLane;
using math::kNormTile;

// One block of kNormLanes threads per tile (grid-stride over tiles): thread j is lane j. It
// accumulates in double, in order, the squares of elements j, j + 256, ... of the tile, then the
// block runs the fixed halving tree in shared memory: exactly math::norm_lane_tree's additions.
__global__ void __launch_bounds__(kNormLanes)
    weight_and_gradient_partials_kernel(const float* __restrict__ w, const float* __restrict__ g,
                           const NormTile* __restrict__ tiles, int64_t num_tiles, const float* __restrict__ s,
                           const int32_t* __restrict__ flags, double* __restrict__ partials) {
  if (flags[kHasNonFinite] != 0) return;
  __shared__ double w_lanes[kNormLanes];
  __shared__ double g_lanes[kNormLanes];
  const Coeffs<float> c = load_coeffs(s, true);
  const int j = threadIdx.x;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const NormTile tile = tiles[t];
    const float* tw = w + tile.start;
    const float* tg = g + tile.start;
    double aw = 0.0, ag = 0.0;
    if (tile.length == kNormTile) {
      // Full tile: all 2*16 loads issued before the first use, then the in-order sums.
      float wr[kNormPerLane], gr[kNormPerLane];
#pragma unroll
      for (int k = 0; k < kNormPerLane; ++k) {
        wr[k] = tw[j + k * kNormLanes];
        gr[k] = tg[j + k * kNormLanes];
      }
#pragma unroll
      for (int k = 0; k < kNormPerLane; ++k) {
        aw = aw + math::square_in_double(wr[k]);
        ag = ag + math::square_in_double(math::unscale<ScalarPolicy>(gr[k], c));
      }
    } else {
      for (int idx = j; idx < tile.length; idx += kNormLanes) {
        aw = aw + math::square_in_double(tw[idx]);
        ag = ag + math::square_in_double(math::unscale<ScalarPolicy>(tg[idx], c));
      }
    }
    w_lanes[j] = aw;
    g_lanes[j] = ag;
    __syncthreads();
    for (int stride = kNormLanes / 2; stride > 0; stride >>= 1) {
      if (j < stride) {
        w_lanes[j] = w_lanes[j] + w_lanes[j + stride];
        g_lanes[j] = g_lanes[j] + g_lanes[j + stride];
      }
      __syncthreads();
    }
    if (j == 0) {
      partials[math::kNormComponents * t] = w_lanes[0];
      partials[math::kNormComponents * t + 1] = g_lanes[0];
    }
    __syncthreads();  // lane 0 has read the tree's root before the next tile overwrites it
  }
}

constexpr int kLambBatch = 4;

// LAMB phase 1, one block of kNormLanes threads per tile: thread j updates m and v of elements
// j, j + 256, ... (math::lamb_moments) and accumulates the squares of w and of the returned u in
// that order; then the fixed tree, as above.
__global__ void __launch_bounds__(kNormLanes)
    lamb_moment_partials_kernel(const float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                                float* __restrict__ v, const NormTile* __restrict__ tiles, int64_t num_tiles,
                                const float* __restrict__ s, const int32_t* __restrict__ flags,
                                double* __restrict__ partials) {
  if (flags[kHasNonFinite] != 0) return;
  __shared__ double w_lanes[kNormLanes];
  __shared__ double u_lanes[kNormLanes];
  const Coeffs<float> c = load_coeffs(s, true);
  const int j = threadIdx.x;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const NormTile tile = tiles[t];
    const float* tw = w + tile.start;
    const float* tg = g + tile.start;
    float* tm = m + tile.start;
    float* tv = v + tile.start;
    double aw = 0.0, au = 0.0;
    // kLambBatch elements of the lane per trip, all loads issued first; used in element order.
    for (int base = j; base < tile.length; base += kLambBatch * kNormLanes) {
      float wr[kLambBatch], gr[kLambBatch], mr[kLambBatch], vr[kLambBatch];
#pragma unroll
      for (int k = 0; k < kLambBatch; ++k) {
        const int idx = base + k * kNormLanes;
        if (idx < tile.length) {
          wr[k] = tw[idx];
          gr[k] = tg[idx];
          mr[k] = tm[idx];
          vr[k] = tv[idx];
        }
      }
#pragma unroll
      for (int k = 0; k < kLambBatch; ++k) {
        const int idx = base + k * kNormLanes;
        if (idx < tile.length) {
          const float u = math::lamb_moments<ScalarPolicy>(wr[k], gr[k], mr[k], vr[k], c);
          tm[idx] = mr[k];
          tv[idx] = vr[k];
          aw = aw + math::square_in_double(wr[k]);
          au = au + math::square_in_double(u);
        }
      }
    }
    w_lanes[j] = aw;
    u_lanes[j] = au;
    __syncthreads();
    for (int stride = kNormLanes / 2; stride > 0; stride >>= 1) {
      if (j < stride) {
        w_lanes[j] = w_lanes[j] + w_lanes[j + stride];
        u_lanes[j] = u_lanes[j] + u_lanes[j + stride];
      }
      __syncthreads();
    }
    if (j == 0) {
      partials[math::kNormComponents * t] = w_lanes[0];
      partials[math::kNormComponents * t + 1] = u_lanes[0];
    }
    __syncthreads();
  }
}

// One block per tensor (grid-stride over tensors). Thread 0 combines the tile partials with
// math::add_tile_partials (the canonical combination, the same call as the CPU's); the block's
// other threads only stage the partials into shared memory chunk by chunk so that the serial
// sum reads fast memory. Summing chunk after chunk performs the same additions in the same order.
constexpr int kRatioBlock = 128;

__global__ void __launch_bounds__(kRatioBlock)
    trust_ratio_kernel(const NormTensor* __restrict__ tensors, int64_t num_tensors,
                       const double* __restrict__ partials, const double* __restrict__ f64,
                       const int32_t* __restrict__ flags, NormRatio formula, float* __restrict__ eta) {
  if (flags[kHasNonFinite] != 0) return;
  constexpr int kC = math::kNormComponents;
  __shared__ double staged[kRatioBlock * kC];
  for (int64_t k = blockIdx.x; k < num_tensors; k += gridDim.x) {
    const NormTensor tensor = tensors[k];
    double sums[kC] = {0.0, 0.0};
    for (int64_t base = 0; base < tensor.tile_count; base += kRatioBlock) {
      const int64_t left = tensor.tile_count - base;
      const int count = left < kRatioBlock ? static_cast<int>(left) : kRatioBlock;
      for (int i = threadIdx.x; i < count * kC; i += blockDim.x) {
        staged[i] = partials[(tensor.first_tile + base) * kC + i];
      }
      __syncthreads();
      if (threadIdx.x == 0) math::add_tile_partials(sums, staged, count);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      eta[k] = math::trust_ratio(formula == NormRatio::kLamb, sums[0], sums[1], f64);
    }
  }
}

}  // namespace

void launch_NORM_TILE_PARTIALS(const CudaContext& ctx, const GraphNode& node) {
  const int64_t num_tiles = static_cast<int64_t>(node.norm.tiles.count);
  if (num_tiles == 0) return;
  if (node.norm_inputs == NormInputs::kLambMoments) {
    lamb_moment_partials_kernel<<<tile_grid(num_tiles, ctx.launch), kNormLanes, 0, ctx.stream>>>(
        ctx.at<const float>(node.w), ctx.at<const float>(node.g), ctx.at<float>(node.m), ctx.at<float>(node.v),
        ctx.at<const NormTile>(node.norm.tiles), num_tiles, ctx.scalars.f32, ctx.scalars.i32,
        ctx.at<double>(node.norm.partials));
    RN_CUDA_CHECK_LAUNCH("lamb_moment_partials_kernel");
    return;
  }
  weight_and_gradient_partials_kernel<<<tile_grid(num_tiles, ctx.launch), kNormLanes, 0, ctx.stream>>>(
      ctx.at<const float>(node.w), ctx.at<const float>(node.g), ctx.at<const NormTile>(node.norm.tiles), num_tiles,
      ctx.scalars.f32, ctx.scalars.i32, ctx.at<double>(node.norm.partials));
  RN_CUDA_CHECK_LAUNCH("weight_and_gradient_partials_kernel");
}

void launch_NORM_TRUST_RATIO(const CudaContext& ctx, const GraphNode& node) {
  const int64_t num_tensors = static_cast<int64_t>(node.norm.tensors.count);
  if (num_tensors == 0) return;
  trust_ratio_kernel<<<tile_grid(num_tensors, ctx.launch), kRatioBlock, 0, ctx.stream>>>(
      ctx.at<const NormTensor>(node.norm.tensors), num_tensors, ctx.at<const double>(node.norm.partials),
      ctx.scalars.f64, ctx.scalars.i32, node.ratio, ctx.at<float>(node.n));
  RN_CUDA_CHECK_LAUNCH("trust_ratio_kernel");
}

}  // namespace cuda
}  // namespace renaissance
