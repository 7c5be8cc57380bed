// The tile walker of the norm kinds (LARS, LAMB and any later trust-ratio kind): the two kernels
// that walk the weight group's norm tiles, one block per tile (grid-stride over tiles, one launch
// whatever the number of tensors), instantiated by each kind with its per-element rule.
//
// - tile_partials_kernel (NORM_TILE_PARTIALS, kernels_norm.cu): per element x = Rule::apply(w, g,
//   state..., c) (the rule may update its state), and the tile's partials of ‖w‖² and ‖x‖² in
//   the canonical order of renaissance/math/norm_reduction.h.
// - tile_update_kernel (the tile-wise updates, kernels_lars.cu, kernels_lamb.cu): per tile the
//   factor Rule::factor(lr, ratio of the tile's tensor in N), per element Rule::apply(w, [g,]
//   state..., factor, c), and the model copy from the new masters in registers (model_copy.cuh).
//
// A rule is a struct: kReadsG (update rules; a norm rule always reads G), kStates (how many state
// arrays it reads or writes, in the order the launch lists their spans) and, with states, writes(j)
// (whether it writes state j; one it only reads is loaded through the read-only cache), plus its static
// __device__ apply (and factor). The number of state arrays is the rule's: TileState<N> carries
// any count. Masked tensors (tensor_mask) are skipped whole: their tiles keep W, the states, the
// copy and their partials as they were.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend_cuda/access.cuh"
#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/elementwise.cuh"
#include "backend_cuda/lane_tree.cuh"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {

// The state arrays of a rule, at their group spans' first elements (a kernel argument).
template <int N>
struct TileState {
  float* p[N > 0 ? N : 1];
};

// G of a rule that reads none (a kernel argument of no use).
struct NoGrad {};

static_assert(math::kNormQuad == 4, "a lane's quad is one float4");

// A whole tile whose first element is 16-byte aligned: lane j's quads are the float4s
// j, j + 256, j + 512, j + 768 of the tile (every warp reads 512 consecutive bytes per load).
__device__ __forceinline__ bool quad_tile(const NormTile& tile) {
  return tile.length == math::kNormTile && (tile.start & (math::kNormQuad - 1)) == 0;
}

// One element of the norm pass: the rule's x, then the squares of w and x added to the lane's
// sums (two independent sums: their order is the element order either way).
template <class Rule, class... S>
__device__ __forceinline__ void partial_element(float w, float g, const Coeffs<float>& c, double& aw, double& ax,
                                                S&... state) {
  const float x = Rule::apply(w, g, state..., c);
  aw = aw + math::square_in_double(w);
  ax = ax + math::square_in_double(x);
}

// One block of kNormLanes threads per tile: thread j is lane j. It accumulates in double, in
// increasing element order (round by round, within a quad x, y, z, w), the squares of w and of
// the rule's x, then block_lane_tree; thread 0 stores the tile's two partials. Whole aligned tiles
// load float4s, W and the states of all rounds before G (a table reader's G waits on an address
// load, grad_load.cuh, and nvcc would not issue loads written after it any earlier) and store the
// written states as float4s; other tiles (a tensor's short last tile, or a tensor that starts off
// a 16-byte boundary) take the same elements one by one, in the same order.
template <class Rule, class G, int... I>
__global__ void __launch_bounds__(math::kNormLanes)
    tile_partials_kernel(const float* __restrict__ w, const G g, const TileState<Rule::kStates> st,
                         const NormTile* __restrict__ tiles, int64_t num_tiles, const float* __restrict__ s,
                         const int32_t* __restrict__ flags, const int32_t* __restrict__ blocks,
                         const int32_t* __restrict__ mask, double* __restrict__ partials) {
  constexpr int kRounds = math::kNormRounds;
  constexpr int kLanes = math::kNormLanes;
  if (flags[kHasNonFinite] != 0) return;
  __shared__ LaneScratch sh;
  Coeffs<float> c = load_coeffs(s, CoeffSet::kWeight);
  const int j = threadIdx.x;
  int buf = 0;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x, buf ^= 1) {
    const NormTile tile = tiles[t];
    if (blocks != nullptr && block_masked(mask, blocks[tile.tensor])) continue;  // the whole block
    // H > 1: the tile's tensor's scalar block (blocks == nullptr: block 0, loaded above).
    if (blocks != nullptr) c = load_coeffs(tensor_scalars(s, blocks, tile.tensor), CoeffSet::kWeight);
    const float* tw = w + tile.start;
    const G tg = g + tile.start;
    double aw = 0.0, ax = 0.0;
    if (quad_tile(tile)) {
      const float4* w4 = reinterpret_cast<const float4*>(tw);
      const auto g4 = tg.quads();
      float4 wr[kRounds], gr[kRounds], sr[Rule::kStates > 0 ? Rule::kStates : 1][kRounds];
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
        const int q = r * kLanes + j;
        wr[r] = w4[q];
        ((sr[I][r] = Rule::writes(I) ? reinterpret_cast<const float4*>(st.p[I] + tile.start)[q]
                                     : __ldg(reinterpret_cast<const float4*>(st.p[I] + tile.start) + q)),
         ...);
      }
#pragma unroll
      for (int r = 0; r < kRounds; ++r) gr[r] = g4[r * kLanes + j];
#pragma unroll
      for (int r = 0; r < kRounds; ++r) {
        partial_element<Rule>(wr[r].x, gr[r].x, c, aw, ax, sr[I][r].x...);
        partial_element<Rule>(wr[r].y, gr[r].y, c, aw, ax, sr[I][r].y...);
        partial_element<Rule>(wr[r].z, gr[r].z, c, aw, ax, sr[I][r].z...);
        partial_element<Rule>(wr[r].w, gr[r].w, c, aw, ax, sr[I][r].w...);
        const int q = r * kLanes + j;
        ((Rule::writes(I) ? (void)(reinterpret_cast<float4*>(st.p[I] + tile.start)[q] = sr[I][r]) : (void)0), ...);
      }
    } else {
      for (int r = 0; r < kRounds; ++r) {
#pragma unroll
        for (int q = 0; q < math::kNormQuad; ++q) {
          const int e = r * math::kNormRound + math::kNormQuad * j + q;
          if (e < tile.length) partial_element<Rule>(tw[e], tg[e], c, aw, ax, st.p[I][tile.start + e]...);
        }
      }
    }
    block_lane_tree(sh, buf, aw, ax);
    if (j == 0) {
      partials[math::kNormComponents * t] = aw;
      partials[math::kNormComponents * t + 1] = ax;
    }
  }
}

// Elements per batch of one thread in the tile update: four float4 of each operand in flight.
constexpr int kTileUpdateBatch = 4;

// One element of a tile-wise update (g is not read when the rule reads no G).
template <class Rule, class... S>
__device__ __forceinline__ void update_element(float& w, float g, float factor, const Coeffs<float>& c, S&... state) {
  if constexpr (Rule::kReadsG) {
    Rule::apply(w, g, state..., factor, c);
  } else {
    Rule::apply(w, state..., factor, c);
  }
}

template <class Rule, class G>
__device__ __forceinline__ float grad_element(const G& g, int64_t i) {
  if constexpr (Rule::kReadsG) {
    return g[i];
  } else {
    return 0.0f;
  }
}

// One block per tile (grid-stride over tiles). A tile starts wherever its tensor does, so its
// first and last few elements may share a float4 with the neighbouring tensor: those are done
// one by one (never writing a neighbour's element), the aligned interior with float4 vectors,
// kTileUpdateBatch per thread and trip, W and the states of the batch loaded before G (as above).
template <class Rule, class G, class Copy, int... I>
__global__ void tile_update_kernel(float* __restrict__ w, const G g, const TileState<Rule::kStates> st,
                                   const NormTile* __restrict__ tiles, int64_t num_tiles,
                                   const float* __restrict__ ratio, const float* __restrict__ s,
                                   const int32_t* __restrict__ flags, const int32_t* __restrict__ blocks,
                                   const int32_t* __restrict__ mask, const Copy copy) {
  constexpr int kBatch = kTileUpdateBatch;
  if (flags[kHasNonFinite] != 0) return;
  Coeffs<float> c = load_coeffs(s, CoeffSet::kWeight);
  const int tid = threadIdx.x;
  const int threads = blockDim.x;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const NormTile tile = tiles[t];
    if (blocks != nullptr && block_masked(mask, blocks[tile.tensor])) continue;  // tensor_mask
    // H > 1: the tile's tensor's scalar block (blocks == nullptr: block 0, loaded above).
    const float* ts = tensor_scalars(s, blocks, tile.tensor);
    if (blocks != nullptr) c = load_coeffs(ts, CoeffSet::kWeight);
    const float factor = Rule::factor(ts[kLr], ratio[tile.tensor]);
    const int64_t begin = tile.start;
    const int64_t end = begin + tile.length;
    int64_t head_end = (begin + 3) & ~int64_t{3};  // first aligned element
    int64_t tail_begin = end & ~int64_t{3};         // end of the aligned interior
    if (head_end >= tail_begin) head_end = tail_begin = end;  // no whole float4: all scalar
    for (int64_t i = begin + tid; i < head_end; i += threads) {
      update_element<Rule>(w[i], grad_element<Rule>(g, i), factor, c, st.p[I][i]...);
      copy.one(static_cast<uint64_t>(i), w[i]);
    }
    for (int64_t i = tail_begin + tid; i < end; i += threads) {
      update_element<Rule>(w[i], grad_element<Rule>(g, i), factor, c, st.p[I][i]...);
      copy.one(static_cast<uint64_t>(i), w[i]);
    }
    float4* w4 = reinterpret_cast<float4*>(w);
    const int64_t q_end = tail_begin / 4;
    for (int64_t q0 = head_end / 4 + tid; q0 < q_end; q0 += static_cast<int64_t>(kBatch) * threads) {
      float4 wr[kBatch], gr[kBatch], sr[Rule::kStates > 0 ? Rule::kStates : 1][kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * threads;
        if (q < q_end) {
          wr[k] = w4[q];
          ((sr[I][k] = Rule::writes(I) ? reinterpret_cast<const float4*>(st.p[I])[q]
                                       : __ldg(reinterpret_cast<const float4*>(st.p[I]) + q)),
           ...);
        }
      }
      if constexpr (Rule::kReadsG) {
        const auto g4 = g.quads();
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          const int64_t q = q0 + static_cast<int64_t>(k) * threads;
          if (q < q_end) gr[k] = g4[q];
        }
      } else {
#pragma unroll
        for (int k = 0; k < kBatch; ++k) gr[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // never read
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * threads;
        if (q < q_end) {
          update_element<Rule>(wr[k].x, gr[k].x, factor, c, sr[I][k].x...);
          update_element<Rule>(wr[k].y, gr[k].y, factor, c, sr[I][k].y...);
          update_element<Rule>(wr[k].z, gr[k].z, factor, c, sr[I][k].z...);
          update_element<Rule>(wr[k].w, gr[k].w, factor, c, sr[I][k].w...);
          w4[q] = wr[k];
          ((Rule::writes(I) ? (void)(reinterpret_cast<float4*>(st.p[I])[q] = sr[I][k]) : (void)0), ...);
          copy.quad(4 * static_cast<uint64_t>(q), wr[k]);
        }
      }
    }
  }
}

// The kernels for the rule's state count: I = 0 .. kStates - 1 index TileState.
template <class Rule, class G, int... I>
constexpr auto partials_kernel_of(std::integer_sequence<int, I...>) {
  return &tile_partials_kernel<Rule, G, I...>;
}
template <class Rule, class G, class Copy, int... I>
constexpr auto update_kernel_of(std::integer_sequence<int, I...>) {
  return &tile_update_kernel<Rule, G, Copy, I...>;
}

template <class Rule, class... State>
TileState<Rule::kStates> tile_state(const CudaContext& ctx, const State&... state) {
  static_assert(sizeof...(State) == Rule::kStates, "one span per state array of the rule");
  return TileState<Rule::kStates>{{ctx.at<float>(state)...}};
}

inline const int32_t* node_blocks(const CudaContext& ctx, const GraphNode& node) {
  return node.work.tensor_blocks.count ? ctx.at<const int32_t>(node.work.tensor_blocks) : nullptr;
}

// NORM_TILE_PARTIALS with Rule over the node's norm tiles; `state`: the node's spans of the
// rule's state arrays, in its order.
template <class Rule, class... State>
void launch_tile_partials(const CudaContext& ctx, const GraphNode& node, const char* name, const State&... state) {
  const int64_t num_tiles = static_cast<int64_t>(node.norm.tiles.count);
  if (num_tiles == 0) return;
  const TileState<Rule::kStates> st = tile_state<Rule>(ctx, state...);
  with_grad(ctx, node, [&](auto g) {
    constexpr auto kernel = partials_kernel_of<Rule, decltype(g)>(std::make_integer_sequence<int, Rule::kStates>{});
    kernel<<<tile_grid(num_tiles, ctx.launch), math::kNormLanes, 0, ctx.stream>>>(
        ctx.at<const float>(node.span(Family::kW)), g, st, ctx.at<const NormTile>(node.norm.tiles), num_tiles, ctx.scalars.f32,
        ctx.scalars.i32, node_blocks(ctx, node), node_mask(ctx, node), ctx.at<double>(node.norm.partials));
    RN_CUDA_CHECK_LAUNCH(name);
  });
}

// A tile-wise update with Rule over the node's norm tiles, each tile with its tensor's ratio from
// N; `state` as above. One instantiation per (G reader, copy writer) of the access table, or per
// copy writer only when the rule reads no G.
template <class Rule, class... State>
void launch_tile_update(const CudaContext& ctx, const GraphNode& node, const char* name, const State&... state) {
  const int64_t num_tiles = static_cast<int64_t>(node.norm.tiles.count);
  if (num_tiles == 0) return;
  const TileState<Rule::kStates> st = tile_state<Rule>(ctx, state...);
  auto launch = [&](auto g, auto copy) {
    constexpr auto kernel = update_kernel_of<Rule, decltype(g), decltype(copy)>(
        std::make_integer_sequence<int, Rule::kStates>{});
    const int block = fit_block<kernel>(ctx.launch.block);
    kernel<<<tile_grid(num_tiles, ctx.launch), block, 0, ctx.stream>>>(
        ctx.at<float>(node.span(Family::kW)), g, st, ctx.at<const NormTile>(node.norm.tiles), num_tiles, ctx.at<const float>(node.span(Family::kN)),
        ctx.scalars.f32, ctx.scalars.i32, node_blocks(ctx, node), node_mask(ctx, node), copy);
    RN_CUDA_CHECK_LAUNCH(name);
  };
  if constexpr (Rule::kReadsG) {
    with_access(ctx, node, launch);
  } else {
    with_copy(ctx, node, [&](auto copy) { launch(NoGrad{}, copy); });
  }
}

}  // namespace cuda
}  // namespace renaissance
