// CUDA ops of LARS: the per-tile squared norms in the canonical order of
// renaissance/math/lars_reduction.h, the per-tensor trust ratios, and the tile-wise update of
// the weight group (plain and Nesterov). The bias-like group uses the SGD kernels. Each op is
// one launch whatever the number of tensors: tiles and tensors come from tables in the arena.
#include <cuda_runtime.h>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/elementwise.cuh"
#include "renaissance/math/lars_reduction.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {
namespace {

using math::kLarsLanes;
using math::kLarsPerLane;
using math::kLarsTile;

// One block of kLarsLanes threads per tile (grid-stride over tiles): thread j is lane j. It
// accumulates in double, in order, the squares of elements j, j + 256, ... of the tile, then the
// block runs the fixed halving tree in shared memory: exactly math::lars_lane_tree's additions.
__global__ void __launch_bounds__(kLarsLanes)
    lars_tile_norms_kernel(const float* __restrict__ w, const float* __restrict__ g,
                           const LarsTile* __restrict__ tiles, int64_t num_tiles, const float* __restrict__ s,
                           const int32_t* __restrict__ flags, double* __restrict__ partials) {
  if (flags[kHasNonFinite] != 0) return;
  __shared__ double w_lanes[kLarsLanes];
  __shared__ double g_lanes[kLarsLanes];
  const float inv_scale = s[kInvLossScale];
  const int j = threadIdx.x;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const LarsTile tile = tiles[t];
    const float* tw = w + tile.start;
    const float* tg = g + tile.start;
    double aw = 0.0, ag = 0.0;
    if (tile.length == kLarsTile) {
      // Full tile: all 2*16 loads issued before the first use, then the in-order sums.
      float wr[kLarsPerLane], gr[kLarsPerLane];
#pragma unroll
      for (int k = 0; k < kLarsPerLane; ++k) {
        wr[k] = tw[j + k * kLarsLanes];
        gr[k] = tg[j + k * kLarsLanes];
      }
#pragma unroll
      for (int k = 0; k < kLarsPerLane; ++k) {
        aw = aw + math::square_in_double(wr[k]);
        ag = ag + math::square_in_double(ScalarPolicy::mul(gr[k], inv_scale));
      }
    } else {
      for (int idx = j; idx < tile.length; idx += kLarsLanes) {
        aw = aw + math::square_in_double(tw[idx]);
        ag = ag + math::square_in_double(ScalarPolicy::mul(tg[idx], inv_scale));
      }
    }
    w_lanes[j] = aw;
    g_lanes[j] = ag;
    __syncthreads();
    for (int stride = kLarsLanes / 2; stride > 0; stride >>= 1) {
      if (j < stride) {
        w_lanes[j] = w_lanes[j] + w_lanes[j + stride];
        g_lanes[j] = g_lanes[j] + g_lanes[j + stride];
      }
      __syncthreads();
    }
    if (j == 0) {
      partials[2 * t] = w_lanes[0];
      partials[2 * t + 1] = g_lanes[0];
    }
    __syncthreads();  // lane 0 has read the tree's root before the next tile overwrites it
  }
}

// One block per tensor (grid-stride over tensors). The tile partials are summed in tile order
// from 0 in double by one thread, which is the canonical combination; the block's other threads
// only stage the partials into shared memory so that the serial sum reads fast memory.
constexpr int kRatioBlock = 128;

__global__ void __launch_bounds__(kRatioBlock)
    lars_trust_ratio_kernel(const LarsTensor* __restrict__ tensors, int64_t num_tensors,
                            const double2* __restrict__ partials, const double* __restrict__ f64,
                            const int32_t* __restrict__ flags, float* __restrict__ eta) {
  if (flags[kHasNonFinite] != 0) return;
  __shared__ double2 staged[kRatioBlock];
  for (int64_t k = blockIdx.x; k < num_tensors; k += gridDim.x) {
    const LarsTensor tensor = tensors[k];
    double w_sq = 0.0, g_sq = 0.0;
    for (int64_t base = 0; base < tensor.tile_count; base += kRatioBlock) {
      const int64_t left = tensor.tile_count - base;
      const int count = left < kRatioBlock ? static_cast<int>(left) : kRatioBlock;
      if (threadIdx.x < count) staged[threadIdx.x] = partials[tensor.first_tile + base + threadIdx.x];
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int i = 0; i < count; ++i) {
          w_sq = w_sq + staged[i].x;
          g_sq = g_sq + staged[i].y;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      eta[k] = math::lars_trust_ratio(w_sq, g_sq, f64[kTrustCoefficientD], f64[kWeightDecayD], f64[kEpsD]);
    }
  }
}

// Elements per batch of one thread in the tile update: four float4 of w, g and m in flight.
constexpr int kUpdateBatch = 4;

// One block per tile (grid-stride over tiles). A tile starts wherever its tensor does, so its
// first and last few elements may share a float4 with the neighbouring tensor: those are done
// one by one (never writing a neighbour's element), the aligned interior with float4 vectors.
template <bool kNesterov>
__global__ void lars_update_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                                   const LarsTile* __restrict__ tiles, int64_t num_tiles,
                                   const float* __restrict__ eta, const float* __restrict__ s,
                                   const int32_t* __restrict__ flags) {
  if (flags[kHasNonFinite] != 0) return;
  const Coeffs<float> c = load_coeffs(s, true);
  const int tid = threadIdx.x;
  const int threads = blockDim.x;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const LarsTile tile = tiles[t];
    const float lr_eta = math::lars_lr_eta(s[kLr], eta[tile.tensor]);
    const int64_t begin = tile.start;
    const int64_t end = begin + tile.length;
    int64_t head_end = (begin + 3) & ~int64_t{3};  // first aligned element
    int64_t tail_begin = end & ~int64_t{3};         // end of the aligned interior
    if (head_end >= tail_begin) head_end = tail_begin = end;  // no whole float4: all scalar
    for (int64_t i = begin + tid; i < head_end; i += threads) {
      math::lars<ScalarPolicy, kNesterov>(w[i], g[i], m[i], lr_eta, c);
    }
    for (int64_t i = tail_begin + tid; i < end; i += threads) {
      math::lars<ScalarPolicy, kNesterov>(w[i], g[i], m[i], lr_eta, c);
    }
    float4* w4 = reinterpret_cast<float4*>(w);
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float4* m4 = reinterpret_cast<float4*>(m);
    const int64_t q_end = tail_begin / 4;
    for (int64_t q0 = head_end / 4 + tid; q0 < q_end; q0 += static_cast<int64_t>(kUpdateBatch) * threads) {
      float4 wr[kUpdateBatch], gr[kUpdateBatch], mr[kUpdateBatch];
#pragma unroll
      for (int k = 0; k < kUpdateBatch; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * threads;
        if (q < q_end) {
          wr[k] = w4[q];
          gr[k] = g4[q];
          mr[k] = m4[q];
        }
      }
#pragma unroll
      for (int k = 0; k < kUpdateBatch; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * threads;
        if (q < q_end) {
          math::lars<ScalarPolicy, kNesterov>(wr[k].x, gr[k].x, mr[k].x, lr_eta, c);
          math::lars<ScalarPolicy, kNesterov>(wr[k].y, gr[k].y, mr[k].y, lr_eta, c);
          math::lars<ScalarPolicy, kNesterov>(wr[k].z, gr[k].z, mr[k].z, lr_eta, c);
          math::lars<ScalarPolicy, kNesterov>(wr[k].w, gr[k].w, mr[k].w, lr_eta, c);
          w4[q] = wr[k];
          m4[q] = mr[k];
        }
      }
    }
  }
}

// One block per tile (or tensor): grid_for with one item per block.
unsigned tile_grid(int64_t items, const LaunchConfig& launch) {
  return grid_for(static_cast<uint64_t>(items), 1, launch);
}

template <bool kNesterov>
void launch_lars_update(const CudaContext& ctx, const GraphNode& node, const char* name) {
  const CompiledStep& step = *ctx.step;
  const int64_t num_tiles = static_cast<int64_t>(step.lars_tiles.count);
  if (num_tiles == 0) return;
  const int block = fit_block<&lars_update_kernel<kNesterov>>(ctx.launch.block);
  lars_update_kernel<kNesterov><<<tile_grid(num_tiles, ctx.launch), block, 0, ctx.stream>>>(
      ctx.at<float>(node.w), ctx.at<const float>(node.g), ctx.at<float>(node.m), ctx.at<const LarsTile>(step.lars_tiles),
      num_tiles, ctx.at<const float>(node.n), ctx.scalars.f32, ctx.scalars.i32);
  check_cuda(cudaGetLastError(), name, __FILE__, __LINE__);
}

}  // namespace

void launch_LARS_TILE_NORMS(const CudaContext& ctx, const GraphNode& node) {
  const CompiledStep& step = *ctx.step;
  const int64_t num_tiles = static_cast<int64_t>(step.lars_tiles.count);
  if (num_tiles == 0) return;
  lars_tile_norms_kernel<<<tile_grid(num_tiles, ctx.launch), kLarsLanes, 0, ctx.stream>>>(
      ctx.at<const float>(node.w), ctx.at<const float>(node.g), ctx.at<const LarsTile>(step.lars_tiles), num_tiles,
      ctx.scalars.f32, ctx.scalars.i32, ctx.at<double>(step.lars_partials));
  RN_CUDA_CHECK_LAUNCH("lars_tile_norms_kernel");
}

void launch_LARS_TRUST_RATIO(const CudaContext& ctx, const GraphNode& node) {
  const CompiledStep& step = *ctx.step;
  const int64_t num_tensors = static_cast<int64_t>(step.lars_tensors.count);
  if (num_tensors == 0) return;
  lars_trust_ratio_kernel<<<tile_grid(num_tensors, ctx.launch), kRatioBlock, 0, ctx.stream>>>(
      ctx.at<const LarsTensor>(step.lars_tensors), num_tensors, ctx.at<const double2>(step.lars_partials),
      ctx.scalars.f64, ctx.scalars.i32, ctx.at<float>(node.n));
  RN_CUDA_CHECK_LAUNCH("lars_trust_ratio_kernel");
}

void launch_UPDATE_LARS(const CudaContext& ctx, const GraphNode& node) {
  launch_lars_update<false>(ctx, node, "lars update kernel");
}
void launch_UPDATE_LARS_NESTEROV(const CudaContext& ctx, const GraphNode& node) {
  launch_lars_update<true>(ctx, node, "lars_nesterov update kernel");
}

}  // namespace cuda
}  // namespace renaissance
