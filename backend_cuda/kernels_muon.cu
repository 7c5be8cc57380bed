// CUDA ops of Muon (docs/math.md, "Muon"), the bits of the CPU ops:
// - MUON_MOMENTUM: per element of the weight group, ĝ = (g*(1/scale))*clip, m = lerp(m, ĝ, 1-μ),
//   U = Nesterov ? lerp(ĝ, m, μ) : m (math::muon_momentum), one float4 per thread and trip; with
//   H > 1 one block per HyperItem with its block's scalars (a masked item is skipped).
// - MUON_ORTHOGONALIZE: each matrix's adjusted lr into N (math::muon_adjusted_lr, one launch), then
//   per shape class and scalar block (MuonClass, planned from the host copy of the table,
//   CudaContext::muon) the Newton–Schulz batch of newton_schulz.cu over its matrices of U, in
//   place, with the block's coefficients, eps and step count, in the node's mode (exact or fast).
//   A skipped step or a masked tensor cancels the kernels.
// - UPDATE_MUON: the tile walker (tile_walker.cuh) over the weight group's tiles, factor = N of the
//   tile's tensor, w = (w*decay) - (lr_adj*U) (math::muon_update), the model copy from registers.
//   Where every class is batched (MuonHost::update_fused) MUON_ORTHOGONALIZE applies this update
//   itself as it takes each class's X out of the scratch (slab_tiles.cuh), element by element with
//   the same operands, so U is neither written nor read again, and UPDATE_MUON launches nothing.
#include <cuda_runtime.h>

#include <string>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/elementwise.cuh"
#include "backend_cuda/newton_schulz.h"
#include "backend_cuda/slab_tiles.cuh"
#include "backend_cuda/tile_walker.cuh"
#include "renaissance/error.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {
namespace {

using math::MuonCoeffs;

template <class GQ>
__device__ __forceinline__ void momentum_quad(const GQ g, float4* __restrict__ m, float4* __restrict__ u, uint64_t q,
                                              const Coeffs<float>& c, const MuonCoeffs<float>& mc) {
  float4 mv = m[q];
  const float4 gv = g[q];  // G last (see update_float4)
  float4 uv;
  math::muon_momentum<ScalarPolicy>(gv.x, mv.x, uv.x, c, mc);
  math::muon_momentum<ScalarPolicy>(gv.y, mv.y, uv.y, c, mc);
  math::muon_momentum<ScalarPolicy>(gv.z, mv.z, uv.z, c, mc);
  math::muon_momentum<ScalarPolicy>(gv.w, mv.w, uv.w, c, mc);
  m[q] = mv;
  u[q] = uv;
}

template <class G>
__global__ void __launch_bounds__(kUpdateMaxBlock)
    muon_momentum_kernel(const G g_elements, float4* __restrict__ m, float4* __restrict__ u, uint64_t n4,
                         const float* __restrict__ s, const int32_t* __restrict__ flags) {
  if (flags[kHasNonFinite] != 0) return;
  const Coeffs<float> c = load_coeffs(s, CoeffSet::kWeight);
  const MuonCoeffs<float> mc = math::make_muon_coeffs<float>(s, Identity{});
  const auto g = g_elements.quads();
  const uint64_t threads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t q = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < n4; q += threads) {
    momentum_quad(g, m, u, q, c, mc);
  }
}

// H > 1 hyperparameter groups: one block per HyperItem (grid-stride), its block's scalars.
template <class G>
__global__ void __launch_bounds__(kUpdateMaxBlock)
    muon_momentum_items_kernel(const G g_elements, float4* __restrict__ m, float4* __restrict__ u,
                               const HyperItem* __restrict__ items, int64_t num_items, const float* __restrict__ s,
                               const int32_t* __restrict__ flags, const int32_t* __restrict__ mask) {
  if (flags[kHasNonFinite] != 0) return;
  const auto g = g_elements.quads();
  for (int64_t k = blockIdx.x; k < num_items; k += gridDim.x) {
    const HyperItem item = items[k];
    if (block_masked(mask, item.block)) continue;
    const float* bs = s + item.block * kNumScalarF32;
    const Coeffs<float> c = load_coeffs(bs, CoeffSet::kWeight);
    const MuonCoeffs<float> mc = math::make_muon_coeffs<float>(bs, Identity{});
    const uint64_t first = static_cast<uint64_t>(item.start) / 4;
    const uint64_t end = first + static_cast<uint64_t>(item.count) / 4;
    for (uint64_t q = first + threadIdx.x; q < end; q += blockDim.x) momentum_quad(g, m, u, q, c, mc);
  }
}

// N[t] = float(double(lr of t's block) * adjust_t) for every unmasked matrix of an applied step.
__global__ void muon_adjusted_lr_kernel(const MuonMatrix* __restrict__ matrices, int64_t count,
                                        const float* __restrict__ s, const int32_t* __restrict__ blocks,
                                        const int32_t* __restrict__ flags, const int32_t* __restrict__ mask,
                                        float* __restrict__ n) {
  if (flags[kHasNonFinite] != 0) return;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < count;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (block_masked(mask, blocks != nullptr ? blocks[t] : 0)) continue;  // as the CPU op: block 0 without a table
    n[t] = math::muon_adjusted_lr(tensor_scalars(s, blocks, static_cast<int32_t>(t))[kLr], matrices[t].adjust);
  }
}

// UPDATE_MUON's rule for the tile walker: no G, one state (U, read only), factor = N[t] itself.
struct MuonUpdateRule {
  static constexpr bool kReadsG = false;
  static constexpr int kStates = 1;
  __host__ __device__ static constexpr bool writes(int) { return false; }
  __device__ static float factor(float, float adjusted_lr) { return adjusted_lr; }
  __device__ static void apply(float& w, float& u, float adjusted_lr, const Coeffs<float>& c) {
    math::muon_update<ScalarPolicy>(w, u, adjusted_lr, c);
  }
};

// slab_out_kernel's sink of the fused update: element e of W (its index in U) with X's value x as
// U: MuonUpdateRule's operations, N and the scalar block of the entry's tensor, then the copy.
// A thread's quads of a tile: all its W loads first, then the updates and stores (as the tile
// walker batches them).
template <class Copy>
struct MuonUpdateFromSlab {
  float* w;
  const float* n;
  const float* s;
  const int32_t* blocks;
  const NewtonSchulzEntry* entries;
  Copy copy;
  struct State {
    float adjusted_lr;
    Coeffs<float> c;
  };
  __device__ State entry(size_t b) const {
    const int32_t t = entries[b].tensor;
    return {n[t], load_coeffs(tensor_scalars(s, blocks, t), CoeffSet::kWeight)};
  }
  __device__ bool quad_aligned(int64_t e) const { return e % 4 == 0 && aligned16(w + e); }
  __device__ static void update(float& w, float x, const State& st) {
    MuonUpdateRule::apply(w, x, MuonUpdateRule::factor(0.0f, st.adjusted_lr), st.c);
  }
  __device__ void put(const State& st, int64_t e, float x) const {
    float v = w[e];
    update(v, x, st);
    w[e] = v;
    copy.one(static_cast<uint64_t>(e), v);
  }
  __device__ void put_quads(const State& st, const SlabQuads& q) const {
    float4 v[kSlabPasses];
#pragma unroll
    for (int k = 0; k < kSlabPasses; ++k) {
      if (q.valid[k]) v[k] = *reinterpret_cast<const float4*>(w + q.e[k]);
    }
#pragma unroll
    for (int k = 0; k < kSlabPasses; ++k) {
      if (!q.valid[k]) continue;
      update(v[k].x, q.x[k].x, st);
      update(v[k].y, q.x[k].y, st);
      update(v[k].z, q.x[k].z, st);
      update(v[k].w, q.x[k].w, st);
      *reinterpret_cast<float4*>(w + q.e[k]) = v[k];
      copy.quad(static_cast<uint64_t>(q.e[k]), v[k]);
    }
  }
};

}  // namespace

void launch_MUON_MOMENTUM(const CudaContext& ctx, const GraphNode& node) {
  const uint64_t n4 = node.span(Family::kW).count / 4;
  if (n4 == 0) return;
  float4* m = ctx.at<float4>(node.span(Family::kM));
  float4* u = ctx.at<float4>(node.muon.update);
  with_grad(ctx, node, [&](auto g) {
    using G = decltype(g);
    if (node.work.hyper_items.count != 0) {
      constexpr auto kernel = &muon_momentum_items_kernel<G>;
      const int block = fit_block<kernel>(std::min(ctx.launch.block, kUpdateMaxBlock));
      const int64_t items = static_cast<int64_t>(node.work.hyper_items.count);
      kernel<<<tile_grid(items, ctx.launch), block, 0, ctx.stream>>>(g, m, u, ctx.at<const HyperItem>(node.work.hyper_items),
                                                                     items, ctx.scalars.f32, ctx.scalars.i32,
                                                                     node_mask(ctx, node));
      RN_CUDA_CHECK_LAUNCH("muon momentum items kernel");
      return;
    }
    constexpr auto kernel = &muon_momentum_kernel<G>;
    const int block = fit_block<kernel>(std::min(ctx.launch.block, kUpdateMaxBlock));
    kernel<<<grid_for(n4, block, ctx.launch), block, 0, ctx.stream>>>(g, m, u, n4, ctx.scalars.f32, ctx.scalars.i32);
    RN_CUDA_CHECK_LAUNCH("muon momentum kernel");
  });
}

void launch_MUON_ORTHOGONALIZE(const CudaContext& ctx, const GraphNode& node) {
  const MuonHost* host = ctx.muon;
  if (host == nullptr || host->matrices_offset != node.muon.matrices.offset ||
      host->matrices.size() != node.muon.matrices.count) {
    throw Error(ErrorKind::kBackend, "cuda backend: MUON_ORTHOGONALIZE without the host copy of its matrix table");
  }
  const int64_t count = static_cast<int64_t>(host->matrices.size());
  if (count == 0) return;
  const int32_t* blocks = node.work.tensor_blocks.count ? ctx.at<const int32_t>(node.work.tensor_blocks) : nullptr;
  const int32_t* mask = node_mask(ctx, node);
  const int32_t* flag = ctx.scalars.i32 + kHasNonFinite;
  muon_adjusted_lr_kernel<<<grid_for(static_cast<uint64_t>(count), 128, ctx.launch), 128, 0, ctx.stream>>>(
      ctx.at<const MuonMatrix>(node.muon.matrices), count, ctx.scalars.f32, blocks, ctx.scalars.i32, mask,
      ctx.at<float>(node.span(Family::kN)));
  RN_CUDA_CHECK_LAUNCH("muon adjusted lr kernel");
  float* u = ctx.at<float>(node.muon.update);
  const uint64_t arena_scratch_bytes = node.muon.scratch.count * sizeof(float);
  auto each_class = [&](auto&& run) {
    for (const MuonClass& cls : host->classes) {
      const float* bs = ctx.scalars.f32 + static_cast<int64_t>(cls.block) * kNumScalarF32;
      const size_t need = cls.batch->scratch_bytes();
      void* scratch = need <= arena_scratch_bytes ? static_cast<void*>(ctx.at<char>(node.muon.scratch)) : host->scratch;
      if (need > arena_scratch_bytes && need > host->scratch_bytes) {
        throw Error(ErrorKind::kBackend, "cuda backend: no Newton-Schulz scratch of " + std::to_string(need) +
                                             " bytes for a class of " + std::to_string(cls.batch->size()) + " matrices");
      }
      const SkipFlags skip{flag, mask != nullptr ? mask + cls.block : nullptr};
      run(cls, NewtonSchulzScalars{bs + kNsA, bs + kNsB, bs + kNsC, bs + kNsEps}, scratch, skip);
    }
  };
  if (!host->update_fused) {
    each_class([&](const MuonClass& cls, const NewtonSchulzScalars& scalars, void* scratch, SkipFlags skip) {
      cls.batch->enqueue(u, scalars, cls.steps, scratch, ctx.stream, skip, ctx.phases);
    });
    return;
  }
  // UPDATE_MUON's work, class by class, straight from the slab: W and N as this node has them (an
  // entry's tensor indexes this node's N and blocks, cut to the owned matrices on a shard), the
  // copy writer of the UPDATE_MUON node.
  with_copy(ctx, host->update, [&](auto copy) {
    using Sink = MuonUpdateFromSlab<decltype(copy)>;
    each_class([&](const MuonClass& cls, const NewtonSchulzScalars& scalars, void* scratch, SkipFlags skip) {
      const NewtonSchulzSlab slab = cls.batch->enqueue_to_slab(u, scalars, cls.steps, scratch, ctx.stream, skip,
                                                               ctx.phases);
      cls.batch->mark(ctx.phases, "store + update");
      const Sink sink{ctx.at<float>(node.span(Family::kW)), ctx.at<const float>(node.span(Family::kN)), ctx.scalars.f32,
                      blocks, slab.entries, copy};
      launch_slab_out(slab, sink, ctx.stream, skip);
    });
  });
}

void launch_UPDATE_MUON(const CudaContext& ctx, const GraphNode& node) {
  if (ctx.muon != nullptr && ctx.muon->update_fused) return;  // done by MUON_ORTHOGONALIZE
  launch_tile_update<MuonUpdateRule>(ctx, node, "muon update kernel", node.muon.update);
}

}  // namespace cuda
}  // namespace renaissance
