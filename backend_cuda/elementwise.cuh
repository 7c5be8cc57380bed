// The element-wise update kernel shared by the SGD and Adam op files: one grid-stride loop over
// a group span in 16-byte float4 vectors, applying a rule of renaissance/math/update_rules.h to
// each of the four lanes. Group spans start on 256-byte boundaries and hold a multiple of 64
// elements (plan.h), and a sharded step's slice of one starts and ends on a multiple of 4
// (docs/distributed.md, rule A), so there is no scalar prologue or tail. With H > 1
// hyperparameter groups the node's HyperItems are walked instead, one block per item. Indices
// are 64-bit: a span may exceed 2^31 elements. With a model copy (Copy, model_copy.cuh) each
// thread rounds its four new masters into C straight from registers: one pass over W; with
// stochastic rounding the lanes of a warp pair up so that each Philox block is drawn once
// (update_quads).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/access.cuh"
#include "renaissance/error.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {

using math::Coeffs;
using math::ScalarPolicy;

struct Identity {
  __device__ float operator()(float x) const { return x; }
};

// The Coeffs of coefficient set `set` (scalars.h; coeff_set(node) picks it, as on the CPU) from
// the scalar block s.
__device__ __forceinline__ Coeffs<float> load_coeffs(const float* s, CoeffSet set) {
  return math::make_coeffs<float>(s, set, Identity{});
}

// The scalars of hyperparameter block h (scalars.h); blocks == nullptr (H = 1): block 0.
__device__ __forceinline__ const float* tensor_scalars(const float* s, const int32_t* blocks, int32_t tensor) {
  return blocks == nullptr ? s : s + blocks[tensor] * kNumScalarF32;
}

// TaskOptions::tensor_mask (graph.h): is scalar block b (tensor b) masked? mask == nullptr: no mask.
__device__ __forceinline__ bool block_masked(const int32_t* mask, int32_t b) { return mask != nullptr && mask[b] != 0; }
// The node's mask array on the device, or nullptr without the flag.
inline const int32_t* node_mask(const CudaContext& ctx, const GraphNode& node) {
  return node.work.tensor_state.count ? ctx.at<const int32_t>(node.work.tensor_state) : nullptr;
}

// Whether a rule has `apply_x(w, g, m, v, x, c)`, its form with the VMAX family (amsgrad; the rule
// says so with `static constexpr bool kHasX = true`): only such rules read the kernels' x
// pointer, and only where it is non-null (a run-time branch, no kernel of its own).
template <class Rule, class = void>
struct RuleHasX : std::false_type {};
template <class Rule>
struct RuleHasX<Rule, std::void_t<decltype(Rule::kHasX)>> : std::bool_constant<Rule::kHasX> {};

// Rule on the four lanes of float4 q of w, g (and m, v when the rule has them; x too where it is
// non-null and the rule has apply_x); G is read through the reader of its encoding
// (grad_load.cuh). Returns the new masters (for the copy).
template <class Rule, bool kHasM, bool kHasV, class GQ>
__device__ __forceinline__ float4 update_float4(float4* __restrict__ w, const GQ g,
                                                float4* __restrict__ m, float4* __restrict__ v,
                                                float4* __restrict__ x, uint64_t q, const Coeffs<float>& c) {
  if constexpr (RuleHasX<Rule>::value) {
    if (x != nullptr) {
      float4 wv = w[q];
      float4 mv = m[q];
      float4 vv = v[q];
      float4 xv = x[q];
      const float4 gv = g[q];
      Rule::apply_x(wv.x, gv.x, mv.x, vv.x, xv.x, c);
      Rule::apply_x(wv.y, gv.y, mv.y, vv.y, xv.y, c);
      Rule::apply_x(wv.z, gv.z, mv.z, vv.z, xv.z, c);
      Rule::apply_x(wv.w, gv.w, mv.w, vv.w, xv.w, c);
      w[q] = wv;
      m[q] = mv;
      v[q] = vv;
      x[q] = xv;
      return wv;
    }
  }
  // All loads first: four (or fewer) independent 16-byte loads in flight per thread. G last:
  // through a gradient table its address comes from a load (the chunk's address) and its reader
  // branches, and nvcc issues no load written after a branch before it, so W, M and V written
  // after G would wait for that lookup too (measured on the H200: the table step 5 % slower).
  float4 wv = w[q];
  float4 mv = kHasM ? m[q] : make_float4(0.f, 0.f, 0.f, 0.f);
  float4 vv = kHasV ? v[q] : make_float4(0.f, 0.f, 0.f, 0.f);
  const float4 gv = g[q];
  Rule::apply(wv.x, gv.x, mv.x, vv.x, c);
  Rule::apply(wv.y, gv.y, mv.y, vv.y, c);
  Rule::apply(wv.z, gv.z, mv.z, vv.z, c);
  Rule::apply(wv.w, gv.w, mv.w, vv.w, c);
  w[q] = wv;
  if (kHasM) m[q] = mv;
  if (kHasV) v[q] = vv;
  return wv;
}

// Quads [first, end) of a span, a block's (or the grid's) threads `thread` of `threads` over
// them. Without warp pairs: one quad per thread and trip, its copy written at once. With them
// (stochastic rounding, model_copy.cuh): each warp takes 64 quads a trip, lane j quads j and
// 32 + j (still coalesced), then the warp writes their copy together, one Philox call per lane.
// Needs whole warps (blockDim a multiple of 32; thread ids run block by block, so lane = thread
// % 32 and `threads` is a multiple of 32 too) and an even `first` (spans and items hold
// multiples of 16 quads), so that quads 2k and 2k+1 meet in a lane pair;
// otherwise the quad path runs. Every lane of a warp runs the same trips (the bound is per
// warp), so the shuffles see the whole warp. Both paths give the same bits.
template <class Rule, bool kHasM, bool kHasV, class GQ, class Copy>
__device__ __forceinline__ void update_quads(float4* __restrict__ w, const GQ g, float4* __restrict__ m,
                                             float4* __restrict__ v, float4* __restrict__ x, uint64_t first,
                                             uint64_t end,
                                             uint64_t thread, uint64_t threads, const Coeffs<float>& c,
                                             const Copy& copy) {
  if constexpr (Copy::kWarpPairs) {
    if (blockDim.x % 32 == 0 && first % 2 == 0) {
      const uint64_t lane = thread % 32;
      const bool odd = (lane & 1u) != 0;
      for (uint64_t base = first + (thread - lane) * 2; base < end; base += threads * 2) {
        const uint64_t qa = base + lane, qb = qa + 32;
        const bool in_a = qa < end, in_b = qb < end;
        float4 xa = make_float4(0.f, 0.f, 0.f, 0.f), xb = xa;
        if (in_a) xa = update_float4<Rule, kHasM, kHasV>(w, g, m, v, x, qa, c);
        if (in_b) xb = update_float4<Rule, kHasM, kHasV>(w, g, m, v, x, qb, c);
        copy.quad_pairs(4 * qa, xa, in_a, 4 * qb, xb, in_b, odd);
      }
      return;
    }
  }
  for (uint64_t q = first + thread; q < end; q += threads) {
    copy.quad(4 * q, update_float4<Rule, kHasM, kHasV>(w, g, m, v, x, q, c));
  }
}

// Register budget of the update kernels: at most 48 per thread, so that 5 blocks of 256 threads
// stay resident per multiprocessor (65536 registers). The stochastic-rounding copy (Philox) asks
// for 52-54, which leaves 4 blocks; capped it spills a few words to L1 and, on the H200 (bench_step
// bf16 copy A/B), runs 2-3 % faster; the other instantiations already fit.
// A block above 256 threads is clamped by fit_block(), which changes no bit.
constexpr int kUpdateMaxBlock = 256;
constexpr int kUpdateMinBlocksPerSm = 5;

// Rule::apply(w, g, m, v, c) updates one element; m and v are dummies when unused.
template <class Rule, bool kHasM, bool kHasV, class G, class Copy>
__global__ void __launch_bounds__(kUpdateMaxBlock, kUpdateMinBlocksPerSm)
    elementwise_update_kernel(float4* __restrict__ w, const G g_elements, float4* __restrict__ m,
                              float4* __restrict__ v, float4* __restrict__ x, uint64_t n4, const float* __restrict__ s,
                              const int32_t* __restrict__ flags, CoeffSet set, const Copy copy) {
  // A step with a non-finite gradient changes nothing (docs/math.md); CHECK_FINITE ran before.
  if (flags[kHasNonFinite] != 0) return;
  const Coeffs<float> c = load_coeffs(s, set);
  const auto g = g_elements.quads();
  const uint64_t threads = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t thread = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  update_quads<Rule, kHasM, kHasV>(w, g, m, v, x, 0, n4, thread, threads, c, copy);
}

// H > 1 hyperparameter groups (multi-tensor-apply style): one block per HyperItem (grid-stride
// over items), each item with its group's scalar block. Items start on 64-element boundaries and
// hold a multiple of 64 elements (plan.h): float4 only. One launch whatever H is.
// A masked item is skipped whole: neither its masters nor its copy are written.
template <class Rule, bool kHasM, bool kHasV, class G, class Copy>
__global__ void __launch_bounds__(kUpdateMaxBlock, kUpdateMinBlocksPerSm)
    elementwise_items_kernel(float4* __restrict__ w, const G g_elements, float4* __restrict__ m,
                             float4* __restrict__ v, float4* __restrict__ x, const HyperItem* __restrict__ items, int64_t num_items,
                             const float* __restrict__ s, const int32_t* __restrict__ flags, CoeffSet set,
                             const int32_t* __restrict__ mask, const Copy copy) {
  if (flags[kHasNonFinite] != 0) return;
  const auto g = g_elements.quads();
  for (int64_t k = blockIdx.x; k < num_items; k += gridDim.x) {
    const HyperItem item = items[k];
    if (block_masked(mask, item.block)) continue;
    const Coeffs<float> c = load_coeffs(s + item.block * kNumScalarF32, set);
    const uint64_t first = static_cast<uint64_t>(item.start) / 4;
    const uint64_t end = first + static_cast<uint64_t>(item.count) / 4;
    update_quads<Rule, kHasM, kHasV>(w, g, m, v, x, first, end, threadIdx.x, blockDim.x, c, copy);
  }
}

// Launches Rule over the node's group span (w, g and, when the rule has them, m and v).
template <class Rule, bool kHasM, bool kHasV>
void launch_elementwise(const CudaContext& ctx, const GraphNode& node, const char* name) {
  const uint64_t n4 = node.span(Family::kW).count / 4;
  if (n4 == 0) return;
  float4* m = kHasM ? ctx.at<float4>(node.span(Family::kM)) : nullptr;
  float4* v = kHasV ? ctx.at<float4>(node.span(Family::kV)) : nullptr;
  // VMAX (amsgrad): only a rule with apply_x reads it.
  if (node.span(Family::kVmax).count != 0 && !RuleHasX<Rule>::value) throw_invalid(std::string(name) + " reads no VMAX family");
  float4* x = RuleHasX<Rule>::value && node.span(Family::kVmax).count != 0 ? ctx.at<float4>(node.span(Family::kVmax)) : nullptr;
  with_access(ctx, node, [&](auto g, auto copy) {
    using G = decltype(g);
    using Copy = decltype(copy);
    if (node.work.hyper_items.count != 0) {
      constexpr auto kernel = &elementwise_items_kernel<Rule, kHasM, kHasV, G, Copy>;
      const int block = fit_block<kernel>(ctx.launch.block);
      const int64_t items = static_cast<int64_t>(node.work.hyper_items.count);
      kernel<<<tile_grid(items, ctx.launch), block, 0, ctx.stream>>>(
          ctx.at<float4>(node.span(Family::kW)), g, m, v, x, ctx.at<const HyperItem>(node.work.hyper_items), items, ctx.scalars.f32,
          ctx.scalars.i32, coeff_set(node), node_mask(ctx, node), copy);
      RN_CUDA_CHECK_LAUNCH(name);
      return;
    }
    constexpr auto kernel = &elementwise_update_kernel<Rule, kHasM, kHasV, G, Copy>;
    const int block = fit_block<kernel>(ctx.launch.block);
    // A warp-pair writer takes two quads per thread and trip: half the threads cover the span.
    const unsigned grid = grid_for(Copy::kWarpPairs ? (n4 + 1) / 2 : n4, block, ctx.launch);
    kernel<<<grid, block, 0, ctx.stream>>>(ctx.at<float4>(node.span(Family::kW)), g, m, v, x, n4, ctx.scalars.f32, ctx.scalars.i32,
                                           coeff_set(node), copy);
    RN_CUDA_CHECK_LAUNCH(name);
  });
}

}  // namespace cuda
}  // namespace renaissance
