// The bf16/fp16 model copy written by the update kernels themselves: each update
// kernel hands its freshly computed masters, still in registers, to a copy writer, so W is not
// read a second time (a separate copy pass cost 4 B per element more). The tensor lookup, the
// stochastic-rounding key and the rounding are renaissance/model_copy_key.h (host and device
// code, tested on the CPU against math/precision.h's scalar definitions); this file only stores
// the bits: an 8-byte store for a quad inside one tensor, element by element where a quad meets
// a tensor boundary (H = 1 packs tensors back to back, plan.cc) or padding (never written).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/grad_load.cuh"
#include "renaissance/model_copy_key.h"

namespace renaissance {
namespace cuda {

// A kernel without a model copy: every call compiles to nothing.
struct NoCopy {
  static constexpr bool kWarpPairs = false;
  __device__ __forceinline__ void one(uint64_t, float) const {}
  __device__ __forceinline__ void quad(uint64_t, float4) const {}
};

template <Precision kPrecision, Rounding kRounding>
struct CopyWriter {
  // Stochastic rounding: the kernels hand quads over in warp pairs (quad_pairs), one Philox call
  // per 8 elements; nearest rounding draws nothing and keeps one quad per thread.
  static constexpr bool kWarpPairs = kRounding == Rounding::kStochastic;

  using Bits = typename EncodingTypes<kPrecision>::Bits;  // one encoding (grad_load.cuh)
  using Quad = typename EncodingTypes<kPrecision>::Quad;
  Bits* c;                      // the node's copy span; element e pairs with element e of the node's W span
  CopyLookup lookup;            // the group's tensors and chunk index (the arena's tensor table)
  uint64_t base;                // element e of c is element base + e of the table (ModelCopy::base)
  uint64_t seed;
  const int32_t* flags;         // the step's int32 scalars (kStep: the applied step t)
  const int32_t* tensor_steps;  // tensor_mask: each tensor's own count; null: the task's t

  __device__ __forceinline__ uint32_t task_t() const { return static_cast<uint32_t>(flags[kStep]); }

  // Span element e whose new master is x (a tile's unaligned head or tail).
  __device__ __forceinline__ void one(uint64_t e, float x) const {
    uint16_t out;
    if (copy_one<kPrecision, kRounding>(lookup, seed, tensor_steps, task_t(), base + e, x, &out)) c[e] = static_cast<Bits>(out);
  }

  // The copy bits of span elements e0 .. e0+3, one 4-encoding store where aligned.
  __device__ __forceinline__ void store_quad(uint64_t e0, const uint16_t out[4]) const {
    if ((reinterpret_cast<uintptr_t>(c + e0) & (sizeof(Quad) - 1)) == 0) {
      *reinterpret_cast<Quad*>(c + e0) = Quad{static_cast<Bits>(out[0]), static_cast<Bits>(out[1]),
                                              static_cast<Bits>(out[2]), static_cast<Bits>(out[3])};
    } else {
      for (int j = 0; j < 4; ++j) c[e0 + j] = static_cast<Bits>(out[j]);
    }
  }

  // Span elements e0 .. e0+3 (e0 a multiple of 4) whose new masters are x.
  __device__ __forceinline__ void quad(uint64_t e0, float4 x) const {
    uint16_t out[4];
    if (copy_quad<kPrecision, kRounding>(lookup, seed, tensor_steps, task_t(), base + e0, x.x, x.y, x.z, x.w, out)) {
      store_quad(e0, out);
      return;
    }
    one(e0, x.x);
    one(e0 + 1, x.y);
    one(e0 + 2, x.z);
    one(e0 + 3, x.w);
  }

  // This lane's two quads of a warp pass (model_copy_key.h, "Warp pairs"): span elements ea and
  // eb (quads 2k + odd and 32 + 2k + odd of the pass; in_a / in_b: inside the span) with new
  // masters xa and xb. Every lane of a full warp calls it at once (two shuffles). The even lane
  // draws the block of the a-pair, the odd lane that of the b-pair, and each sends its partner
  // the two words of the partner's quad. (Drawing the words before the updates instead, to keep
  // fewer registers live across them, made ptxas spill more in the grid kernel.)
  __device__ __forceinline__ void quad_pairs(uint64_t ea, float4 xa, bool in_a, uint64_t eb, float4 xb, bool in_b,
                                             bool odd) const {
    const CopyPairKey ka = in_a ? copy_pair_key(lookup, tensor_steps, task_t(), base + ea, odd) : CopyPairKey{};
    const CopyPairKey kb = in_b ? copy_pair_key(lookup, tensor_steps, task_t(), base + eb, odd) : CopyPairKey{};
    const math::Philox4x32 p = pair_lane_block(odd, seed, ka, kb);
    const PairSent sent = pair_sent_words(odd, p);
    const PairSent got{__shfl_xor_sync(0xffffffffu, sent.w0, 1), __shfl_xor_sync(0xffffffffu, sent.w1, 1)};
    const PairLaneWords r = pair_lane_words(odd, p, got);
    if (in_a) paired_quad(ea, xa, ka.whole, r.a0, r.a1);
    if (in_b) paired_quad(eb, xb, kb.whole, r.b0, r.b1);
  }
  // Span elements e0 .. e0+3 with new masters x and, when `whole`, their pair's words w0, w1.
  __device__ __forceinline__ void paired_quad(uint64_t e0, float4 x, bool whole, uint32_t w0, uint32_t w1) const {
    if (!whole) return quad(e0, x);
    uint16_t out[4];
    copy_pair_quad<kPrecision>(w0, w1, x.x, x.y, x.z, x.w, out);
    store_quad(e0, out);
  }
};

}  // namespace cuda
}  // namespace renaissance
