// CUDA ops of LAMB's updates. UPDATE_LAMB is phase 2 of the weight group (phase 1, the moments
// and the ‖w‖², ‖u‖² partials, is NORM_TILE_PARTIALS in kernels_norm.cu): one block per tile,
// u recomputed from the new m, v by math::lamb_direction (the function phase 1 used, so the same
// bits) and w = w - (lr*r)*u with the tensor's r from N. UPDATE_LAMB_BIAS is the bias-like group
// in one element-wise pass with r = 1. One launch each whatever the number of tensors.
#include <cuda_runtime.h>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/elementwise.cuh"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {
namespace {

constexpr int kUpdateBatch = 4;

// As lars_update_kernel: a tile's unaligned head and tail element by element (never touching a
// neighbouring tensor's element), the aligned interior in float4 batches; the model copy from
// the new masters in registers (model_copy.cuh).
template <class Copy>
__global__ void lamb_update_kernel(float* __restrict__ w, const float* __restrict__ m, const float* __restrict__ v,
                                   const NormTile* __restrict__ tiles, int64_t num_tiles,
                                   const float* __restrict__ ratio, const float* __restrict__ s,
                                   const int32_t* __restrict__ flags, const int32_t* __restrict__ blocks,
                                   const int32_t* __restrict__ mask, const Copy copy) {
  if (flags[kHasNonFinite] != 0) return;
  Coeffs<float> c = load_coeffs(s, true);
  const int tid = threadIdx.x;
  const int threads = blockDim.x;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const NormTile tile = tiles[t];
    if (blocks != nullptr && block_masked(mask, blocks[tile.tensor])) continue;  // tensor_mask
    // H > 1: the tile's tensor's scalar block (blocks == nullptr: block 0, loaded above).
    const float* ts = tensor_scalars(s, blocks, tile.tensor);
    if (blocks != nullptr) c = load_coeffs(ts, true);
    const float lr_r = math::lamb_lr_ratio(ts[kLr], ratio[tile.tensor]);
    const int64_t begin = tile.start;
    const int64_t end = begin + tile.length;
    int64_t head_end = (begin + 3) & ~int64_t{3};
    int64_t tail_begin = end & ~int64_t{3};
    if (head_end >= tail_begin) head_end = tail_begin = end;
    for (int64_t i = begin + tid; i < head_end; i += threads) {
      math::lamb_apply<ScalarPolicy>(w[i], m[i], v[i], lr_r, c);
      copy.one(static_cast<uint64_t>(i), w[i]);
    }
    for (int64_t i = tail_begin + tid; i < end; i += threads) {
      math::lamb_apply<ScalarPolicy>(w[i], m[i], v[i], lr_r, c);
      copy.one(static_cast<uint64_t>(i), w[i]);
    }
    float4* w4 = reinterpret_cast<float4*>(w);
    const float4* m4 = reinterpret_cast<const float4*>(m);
    const float4* v4 = reinterpret_cast<const float4*>(v);
    const int64_t q_end = tail_begin / 4;
    for (int64_t q0 = head_end / 4 + tid; q0 < q_end; q0 += static_cast<int64_t>(kUpdateBatch) * threads) {
      float4 wr[kUpdateBatch], mr[kUpdateBatch], vr[kUpdateBatch];
#pragma unroll
      for (int k = 0; k < kUpdateBatch; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * threads;
        if (q < q_end) {
          wr[k] = w4[q];
          mr[k] = m4[q];
          vr[k] = v4[q];
        }
      }
#pragma unroll
      for (int k = 0; k < kUpdateBatch; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * threads;
        if (q < q_end) {
          math::lamb_apply<ScalarPolicy>(wr[k].x, mr[k].x, vr[k].x, lr_r, c);
          math::lamb_apply<ScalarPolicy>(wr[k].y, mr[k].y, vr[k].y, lr_r, c);
          math::lamb_apply<ScalarPolicy>(wr[k].z, mr[k].z, vr[k].z, lr_r, c);
          math::lamb_apply<ScalarPolicy>(wr[k].w, mr[k].w, vr[k].w, lr_r, c);
          w4[q] = wr[k];
          copy.quad(4 * static_cast<uint64_t>(q), wr[k]);
        }
      }
    }
  }
}

struct LambBiasRule {
  static __device__ __forceinline__ void apply(float& w, float g, float& m, float& v, const Coeffs<float>& c) {
    math::lamb_unit_ratio<ScalarPolicy>(w, g, m, v, c);
  }
};

}  // namespace

void launch_UPDATE_LAMB(const CudaContext& ctx, const GraphNode& node) {
  const int64_t num_tiles = static_cast<int64_t>(node.norm.tiles.count);
  if (num_tiles == 0) return;
  with_copy(ctx, node, [&](auto copy) {
    constexpr auto kernel = &lamb_update_kernel<decltype(copy)>;
    const int block = fit_block<kernel>(ctx.launch.block);
    kernel<<<tile_grid(num_tiles, ctx.launch), block, 0, ctx.stream>>>(
        ctx.at<float>(node.w), ctx.at<const float>(node.m), ctx.at<const float>(node.v),
        ctx.at<const NormTile>(node.norm.tiles), num_tiles, ctx.at<const float>(node.n), ctx.scalars.f32,
        ctx.scalars.i32, node.tensor_blocks.count ? ctx.at<const int32_t>(node.tensor_blocks) : nullptr,
        node_mask(ctx, node), copy);
    RN_CUDA_CHECK_LAUNCH("lamb update kernel");
  });
}

void launch_UPDATE_LAMB_BIAS(const CudaContext& ctx, const GraphNode& node) {
  launch_elementwise<LambBiasRule, true, true>(ctx, node, "lamb bias-like update kernel");
}

}  // namespace cuda
}  // namespace renaissance
