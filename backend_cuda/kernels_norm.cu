// CUDA ops of the norm passes: NORM_TILE_PARTIALS (the per-tile squared norms in the canonical
// order of renaissance/math/norm_reduction.h; node.norm_inputs says what: w and ĝ for LARS, or
// LAMB's phase 1, which updates m and v and squares w and u) and NORM_TRUST_RATIO (each tensor's
// partials combined by math::tensor_sum_lane and the lane tree, then the ratio formula of the
// math file). Each op is one launch whatever the number of tensors: tiles and tensors come from
// tables the node carries.
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
using math::kNormQuad;
using math::kNormRound;
using math::kNormRounds;
using math::kNormTile;

static_assert(kNormQuad == 4, "a lane's quad is one float4");

// Two lane sums per thread, double-buffered between consecutive tiles of a block (so that the
// next tile's stores never wait for the previous tree to be read).
struct LaneScratch {
  double lanes[2][math::kNormComponents][kNormLanes];
};

// math::norm_lane_tree over the block's kNormLanes threads for two sums at once: the levels
// s = 128, 64, 32 through shared memory, s = 16 ... 1 inside warp 0 by shuffles (lane j adds the
// value lane j + s holds: the same additions, in the same operand order). Thread 0 returns the
// roots. `buf` alternates between tiles.
__device__ __forceinline__ void block_lane_tree(LaneScratch& sh, int buf, double& a, double& b) {
  const int j = threadIdx.x;
  double* la = sh.lanes[buf][0];
  double* lb = sh.lanes[buf][1];
  la[j] = a;
  lb[j] = b;
  __syncthreads();
#pragma unroll
  for (int s = kNormLanes / 2; s >= 64; s >>= 1) {
    if (j < s) {
      la[j] = la[j] + la[j + s];
      lb[j] = lb[j] + lb[j + s];
    }
    __syncthreads();
  }
  if (j < 32) {
    a = la[j] + la[j + 32];
    b = lb[j] + lb[j + 32];
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      a = a + __shfl_down_sync(0xffffffffu, a, s);
      b = b + __shfl_down_sync(0xffffffffu, b, s);
    }
  }
}

// A whole tile whose first element is 16-byte aligned: lane j's quads are the float4s
// j, j + 256, j + 512, j + 768 of the tile (every warp reads 512 consecutive bytes per load).
__device__ __forceinline__ bool quad_tile(const NormTile& tile) {
  return tile.length == kNormTile && (tile.start & (kNormQuad - 1)) == 0;
}

// One block of kNormLanes threads per tile (grid-stride over tiles): thread j is lane j. It
// accumulates in double the squares of its elements in increasing order (round by round, within
// a quad x, y, z, w), then block_lane_tree. Whole aligned tiles load float4s, all 2*4 of them
// before the first use; other tiles (a tensor's short last tile, or a tensor that starts off a
// 16-byte boundary) load the same elements one by one, in the same order.
template <class G>
__global__ void __launch_bounds__(kNormLanes)
    weight_and_gradient_partials_kernel(const float* __restrict__ w, const G g,
                           const NormTile* __restrict__ tiles, int64_t num_tiles, const float* __restrict__ s,
                           const int32_t* __restrict__ flags, const int32_t* __restrict__ blocks,
                           double* __restrict__ partials) {
  if (flags[kHasNonFinite] != 0) return;
  __shared__ LaneScratch sh;
  Coeffs<float> c = load_coeffs(s, true);
  const int j = threadIdx.x;
  int buf = 0;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x, buf ^= 1) {
    const NormTile tile = tiles[t];
    // H > 1: the tile's tensor's scalar block (blocks == nullptr: block 0, loaded above).
    if (blocks != nullptr) c = load_coeffs(tensor_scalars(s, blocks, tile.tensor), true);
    const float* tw = w + tile.start;
    const G tg = g + tile.start;
    double aw = 0.0, ag = 0.0;
    if (quad_tile(tile)) {
      const float4* w4 = reinterpret_cast<const float4*>(tw);
      const auto g4 = tg.quads();
      float4 wr[kNormRounds], gr[kNormRounds];
#pragma unroll
      for (int r = 0; r < kNormRounds; ++r) wr[r] = w4[r * kNormLanes + j];
      // G after every W load: see kernels_lars.cu (a table reader's G waits on an address load).
#pragma unroll
      for (int r = 0; r < kNormRounds; ++r) gr[r] = g4[r * kNormLanes + j];
#pragma unroll
      for (int r = 0; r < kNormRounds; ++r) {
        const float wq[kNormQuad] = {wr[r].x, wr[r].y, wr[r].z, wr[r].w};
        const float gq[kNormQuad] = {gr[r].x, gr[r].y, gr[r].z, gr[r].w};
#pragma unroll
        for (int q = 0; q < kNormQuad; ++q) {
          aw = aw + math::square_in_double(wq[q]);
          ag = ag + math::square_in_double(math::unscale<ScalarPolicy>(gq[q], c));
        }
      }
    } else {
      for (int r = 0; r < kNormRounds; ++r) {
#pragma unroll
        for (int q = 0; q < kNormQuad; ++q) {
          const int e = r * kNormRound + kNormQuad * j + q;
          if (e < tile.length) {
            aw = aw + math::square_in_double(tw[e]);
            ag = ag + math::square_in_double(math::unscale<ScalarPolicy>(tg[e], c));
          }
        }
      }
    }
    block_lane_tree(sh, buf, aw, ag);
    if (j == 0) {
      partials[math::kNormComponents * t] = aw;
      partials[math::kNormComponents * t + 1] = ag;
    }
  }
}

// LAMB phase 1 for one element: m and v updated (math::lamb_moments returns u), the squares of
// w and u added to the lane's sums.
__device__ __forceinline__ void lamb_element(float w, float g, float& m, float& v, const Coeffs<float>& c,
                                             double& aw, double& au) {
  const float u = math::lamb_moments<ScalarPolicy>(w, g, m, v, c);
  aw = aw + math::square_in_double(w);
  au = au + math::square_in_double(u);
}

// LAMB phase 1, one block of kNormLanes threads per tile: thread j updates m and v of its
// elements (the lane's quads, as above) and accumulates the squares of w and of the returned u
// in increasing element order; then block_lane_tree. Whole aligned tiles: 4*4 float4 loads in
// flight, float4 stores of m and v.
template <class G>
__global__ void __launch_bounds__(kNormLanes)
    lamb_moment_partials_kernel(const float* __restrict__ w, const G g, float* __restrict__ m,
                                float* __restrict__ v, const NormTile* __restrict__ tiles, int64_t num_tiles,
                                const float* __restrict__ s, const int32_t* __restrict__ flags,
                                const int32_t* __restrict__ blocks, double* __restrict__ partials,
                                const int32_t* __restrict__ mask) {
  if (flags[kHasNonFinite] != 0) return;
  __shared__ LaneScratch sh;
  Coeffs<float> c = load_coeffs(s, true);
  const int j = threadIdx.x;
  int buf = 0;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x, buf ^= 1) {
    const NormTile tile = tiles[t];
    // tensor_mask: a masked tensor keeps m and v (the whole block skips the tile; its partials are
    // left as they were and its ratio is never read).
    if (blocks != nullptr && block_masked(mask, blocks[tile.tensor])) continue;
    // H > 1: the tile's tensor's scalar block (blocks == nullptr: block 0, loaded above).
    if (blocks != nullptr) c = load_coeffs(tensor_scalars(s, blocks, tile.tensor), true);
    const float* tw = w + tile.start;
    const G tg = g + tile.start;
    float* tm = m + tile.start;
    float* tv = v + tile.start;
    double aw = 0.0, au = 0.0;
    if (quad_tile(tile)) {
      const float4* w4 = reinterpret_cast<const float4*>(tw);
      const auto g4 = tg.quads();
      float4* m4 = reinterpret_cast<float4*>(tm);
      float4* v4 = reinterpret_cast<float4*>(tv);
      float4 wr[kNormRounds], gr[kNormRounds], mr[kNormRounds], vr[kNormRounds];
#pragma unroll
      for (int r = 0; r < kNormRounds; ++r) {
        const int q = r * kNormLanes + j;
        wr[r] = w4[q];
        mr[r] = m4[q];
        vr[r] = v4[q];
      }
#pragma unroll
      for (int r = 0; r < kNormRounds; ++r) gr[r] = g4[r * kNormLanes + j];  // G last, as above
#pragma unroll
      for (int r = 0; r < kNormRounds; ++r) {
        lamb_element(wr[r].x, gr[r].x, mr[r].x, vr[r].x, c, aw, au);
        lamb_element(wr[r].y, gr[r].y, mr[r].y, vr[r].y, c, aw, au);
        lamb_element(wr[r].z, gr[r].z, mr[r].z, vr[r].z, c, aw, au);
        lamb_element(wr[r].w, gr[r].w, mr[r].w, vr[r].w, c, aw, au);
        const int q = r * kNormLanes + j;
        m4[q] = mr[r];
        v4[q] = vr[r];
      }
    } else {
      for (int r = 0; r < kNormRounds; ++r) {
#pragma unroll
        for (int q = 0; q < kNormQuad; ++q) {
          const int e = r * kNormRound + kNormQuad * j + q;
          if (e < tile.length) lamb_element(tw[e], tg[e], tm[e], tv[e], c, aw, au);
        }
      }
    }
    block_lane_tree(sh, buf, aw, au);
    if (j == 0) {
      partials[math::kNormComponents * t] = aw;
      partials[math::kNormComponents * t + 1] = au;
    }
  }
}

// One block of kNormLanes threads per tensor (grid-stride over tensors): thread k is sum-lane k
// (math::tensor_sum_lane, loads batched), block_lane_tree combines the sum-lanes, thread 0 applies
// the ratio formula. No serial loop over a tensor's tiles.
__global__ void __launch_bounds__(kNormLanes)
    trust_ratio_kernel(const NormTensor* __restrict__ tensors, int64_t num_tensors,
                       const double* __restrict__ partials, const double* __restrict__ f64,
                       const int32_t* __restrict__ flags, NormRatio formula, const int32_t* __restrict__ blocks,
                       float* __restrict__ eta) {
  if (flags[kHasNonFinite] != 0) return;
  static_assert(math::kNormComponents == 2, "block_lane_tree combines two sums");
  __shared__ LaneScratch sh;
  int buf = 0;
  for (int64_t k = blockIdx.x; k < num_tensors; k += gridDim.x, buf ^= 1) {
    const NormTensor tensor = tensors[k];
    double sums[math::kNormComponents];
    math::tensor_sum_lane(partials + math::kNormComponents * tensor.first_tile, tensor.tile_count,
                          static_cast<int>(threadIdx.x), sums);
    block_lane_tree(sh, buf, sums[0], sums[1]);
    // H > 1: the tensor's own block of configured doubles (scalars.h).
    const double* d = blocks == nullptr ? f64 : f64 + blocks[k] * kNumScalarF64;
    if (threadIdx.x == 0) eta[k] = math::trust_ratio(formula == NormRatio::kLamb, sums[0], sums[1], d);
  }
}

}  // namespace

void launch_NORM_TILE_PARTIALS(const CudaContext& ctx, const GraphNode& node) {
  const int64_t num_tiles = static_cast<int64_t>(node.norm.tiles.count);
  if (num_tiles == 0) return;
  const int32_t* blocks = node.tensor_blocks.count ? ctx.at<const int32_t>(node.tensor_blocks) : nullptr;
  with_grad(ctx, node, [&](auto g) {
    if (node.norm_inputs == NormInputs::kLambMoments) {
      lamb_moment_partials_kernel<<<tile_grid(num_tiles, ctx.launch), kNormLanes, 0, ctx.stream>>>(
          ctx.at<const float>(node.w), g, ctx.at<float>(node.m), ctx.at<float>(node.v),
          ctx.at<const NormTile>(node.norm.tiles), num_tiles, ctx.scalars.f32, ctx.scalars.i32, blocks,
          ctx.at<double>(node.norm.partials), node_mask(ctx, node));
      RN_CUDA_CHECK_LAUNCH("lamb_moment_partials_kernel");
      return;
    }
    weight_and_gradient_partials_kernel<<<tile_grid(num_tiles, ctx.launch), kNormLanes, 0, ctx.stream>>>(
        ctx.at<const float>(node.w), g, ctx.at<const NormTile>(node.norm.tiles), num_tiles, ctx.scalars.f32,
        ctx.scalars.i32, blocks, ctx.at<double>(node.norm.partials));
    RN_CUDA_CHECK_LAUNCH("weight_and_gradient_partials_kernel");
  });
}

void launch_NORM_TRUST_RATIO(const CudaContext& ctx, const GraphNode& node) {
  const int64_t num_tensors = static_cast<int64_t>(node.norm.tensors.count);
  if (num_tensors == 0) return;
  trust_ratio_kernel<<<tile_grid(num_tensors, ctx.launch), kNormLanes, 0, ctx.stream>>>(
      ctx.at<const NormTensor>(node.norm.tensors), num_tensors, ctx.at<const double>(node.norm.partials),
      ctx.scalars.f64, ctx.scalars.i32, node.ratio,
      node.tensor_blocks.count ? ctx.at<const int32_t>(node.tensor_blocks) : nullptr, ctx.at<float>(node.n));
  RN_CUDA_CHECK_LAUNCH("trust_ratio_kernel");
}

}  // namespace cuda
}  // namespace renaissance
