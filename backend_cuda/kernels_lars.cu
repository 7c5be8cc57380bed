// CUDA ops of the LARS update: tile by tile over the weight group (plain and Nesterov), each
// tile with its tensor's trust ratio from N (written by the norm pass, kernels_norm.cu). The
// bias-like group uses the SGD kernels (kKindTable). One launch whatever the number of tensors.
#include <cuda_runtime.h>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/elementwise.cuh"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {
namespace {

// Elements per batch of one thread in the tile update: four float4 of w, g and m in flight.
constexpr int kUpdateBatch = 4;

// One block per tile (grid-stride over tiles). A tile starts wherever its tensor does, so its
// first and last few elements may share a float4 with the neighbouring tensor: those are done
// one by one (never writing a neighbour's element), the aligned interior with float4 vectors. The
// model copy is written from the new masters in registers (model_copy.cuh); a masked tile writes
// neither.
template <bool kNesterov, class G, class Copy>
__global__ void lars_update_kernel(float* __restrict__ w, const G g, float* __restrict__ m,
                                   const NormTile* __restrict__ tiles, int64_t num_tiles,
                                   const float* __restrict__ eta, const float* __restrict__ s,
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
    const float lr_eta = math::lars_lr_eta(ts[kLr], eta[tile.tensor]);
    const int64_t begin = tile.start;
    const int64_t end = begin + tile.length;
    int64_t head_end = (begin + 3) & ~int64_t{3};  // first aligned element
    int64_t tail_begin = end & ~int64_t{3};         // end of the aligned interior
    if (head_end >= tail_begin) head_end = tail_begin = end;  // no whole float4: all scalar
    for (int64_t i = begin + tid; i < head_end; i += threads) {
      math::lars<ScalarPolicy, kNesterov>(w[i], g[i], m[i], lr_eta, c);
      copy.one(static_cast<uint64_t>(i), w[i]);
    }
    for (int64_t i = tail_begin + tid; i < end; i += threads) {
      math::lars<ScalarPolicy, kNesterov>(w[i], g[i], m[i], lr_eta, c);
      copy.one(static_cast<uint64_t>(i), w[i]);
    }
    float4* w4 = reinterpret_cast<float4*>(w);
    const auto g4 = g.quads();
    float4* m4 = reinterpret_cast<float4*>(m);
    const int64_t q_end = tail_begin / 4;
    for (int64_t q0 = head_end / 4 + tid; q0 < q_end; q0 += static_cast<int64_t>(kUpdateBatch) * threads) {
      float4 wr[kUpdateBatch], gr[kUpdateBatch], mr[kUpdateBatch];
      // W and M of the whole batch before G: a table reader's G loads wait on an address load
      // (grad_load.cuh), and nvcc would not issue loads written after them any earlier.
#pragma unroll
      for (int k = 0; k < kUpdateBatch; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * threads;
        if (q < q_end) {
          wr[k] = w4[q];
          mr[k] = m4[q];
        }
      }
#pragma unroll
      for (int k = 0; k < kUpdateBatch; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * threads;
        if (q < q_end) gr[k] = g4[q];
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
          copy.quad(4 * static_cast<uint64_t>(q), wr[k]);
        }
      }
    }
  }
}

template <bool kNesterov>
void launch_lars_update(const CudaContext& ctx, const GraphNode& node, const char* name) {
  const int64_t num_tiles = static_cast<int64_t>(node.norm.tiles.count);
  if (num_tiles == 0) return;
  with_access(ctx, node, [&](auto g, auto copy) {
    constexpr auto kernel = &lars_update_kernel<kNesterov, decltype(g), decltype(copy)>;
    const int block = fit_block<kernel>(ctx.launch.block);
    kernel<<<tile_grid(num_tiles, ctx.launch), block, 0, ctx.stream>>>(
        ctx.at<float>(node.w), g, ctx.at<float>(node.m), ctx.at<const NormTile>(node.norm.tiles), num_tiles,
        ctx.at<const float>(node.n), ctx.scalars.f32, ctx.scalars.i32,
        node.tensor_blocks.count ? ctx.at<const int32_t>(node.tensor_blocks) : nullptr, node_mask(ctx, node), copy);
    RN_CUDA_CHECK_LAUNCH(name);
  });
}

}  // namespace

void launch_UPDATE_LARS(const CudaContext& ctx, const GraphNode& node) {
  launch_lars_update<false>(ctx, node, "lars update kernel");
}
void launch_UPDATE_LARS_NESTEROV(const CudaContext& ctx, const GraphNode& node) {
  launch_lars_update<true>(ctx, node, "lars_nesterov update kernel");
}

}  // namespace cuda
}  // namespace renaissance
