// The bf16/fp16 model copy written by the update kernels themselves (issue 14): each update
// kernel hands its freshly computed masters, still in registers, to a copy writer, so W is not
// read a second time (a separate copy pass cost 4 B per element more). The rounding is
// math/precision.h's, the code the CPU backend uses; the stochastic-rounding key is the element's
// (param, index in its tensor) as sr_random_word defines it, never its arena position.
//
// How a thread finds its element's tensor cheaply: the node's CopyTensor list (span order) and a
// chunk index (model_copy_chunks: per kCopyChunk elements of the span, the first tensor that ends
// after the chunk's start) live in device memory; a lookup reads one chunk entry and scans
// forward, which is one step inside a large tensor. An arena quad (4 elements starting at a
// multiple of 4 of the span) may straddle two tensors (H = 1 packs tensors back to back, plan.cc)
// or, where a tensor starts off a multiple of 4, two Philox blocks of one tensor: the fast path
// handles a quad inside one tensor with one or two Philox calls and an 8-byte store, the rest
// element by element. Elements outside every tensor (region padding) are never written.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/cuda_ops.h"
#include "renaissance/math/precision.h"

namespace renaissance {
namespace cuda {

// A kernel without a model copy: every call compiles to nothing.
struct NoCopy {
  __device__ __forceinline__ void one(uint64_t, float) const {}
  __device__ __forceinline__ void quad(uint64_t, float4) const {}
};

template <Precision kPrecision, Rounding kRounding>
struct CopyWriter {
  uint16_t* c;                  // the node's copy span; element e pairs with element e of node.w
  const CopyTensor* tensors;    // the node's tensors in span order
  const int32_t* chunks;        // chunk k: the first tensor ending after k * kCopyChunk
  uint32_t count;               // tensors
  uint64_t seed;
  const int32_t* flags;         // the step's int32 scalars (kStep: the applied step t)
  const int32_t* tensor_steps;  // tensor_mask: each tensor's own count; null: the task's t

  __device__ __forceinline__ static uint16_t round(float x, uint32_t r) {
    if (kRounding == Rounding::kNearest) {
      return kPrecision == Precision::kBf16 ? math::f32_to_bf16_rne(x) : math::f32_to_f16_rne(x);
    }
    return kPrecision == Precision::kBf16 ? math::f32_to_bf16_sr(x, r) : math::f32_to_f16_sr(x, r);
  }
  __device__ __forceinline__ uint64_t step_of(uint32_t param) const {
    return static_cast<uint32_t>(tensor_steps != nullptr ? tensor_steps[param] : flags[kStep]);
  }
  // The tensor holding span element e, or count when e is padding.
  __device__ __forceinline__ uint32_t find(uint64_t e) const {
    uint32_t i = static_cast<uint32_t>(chunks[e / kCopyChunk]);
    while (i < count && tensors[i].begin + tensors[i].numel <= e) ++i;
    return i < count && tensors[i].begin <= e ? i : count;
  }
  // Word p (0..7) of two consecutive Philox blocks, without indexing an array by a variable.
  __device__ __forceinline__ static uint32_t pick(const math::Philox4x32& a, const math::Philox4x32& b, uint32_t p) {
    const math::Philox4x32& x = p < 4 ? a : b;
    const uint32_t j = p & 3u;
    return j == 0 ? x.v[0] : j == 1 ? x.v[1] : j == 2 ? x.v[2] : x.v[3];
  }

  // Span element e whose new master is x (a tile's unaligned head or tail).
  __device__ __forceinline__ void one(uint64_t e, float x) const {
    const uint32_t i = find(e);
    if (i == count) return;
    const CopyTensor& t = tensors[i];
    uint32_t r = 0;
    if (kRounding == Rounding::kStochastic) r = math::sr_random_word(seed, step_of(t.param), t.param, t.first + (e - t.begin));
    c[e] = round(x, r);
  }

  // Span elements e0 .. e0+3 (e0 a multiple of 4) whose new masters are x.
  __device__ __forceinline__ void quad(uint64_t e0, float4 x) const {
    const uint32_t i = find(e0);
    if (i < count && e0 + 4 <= tensors[i].begin + tensors[i].numel) {
      const CopyTensor t = tensors[i];
      const uint64_t index = t.first + (e0 - t.begin);
      uint32_t r[4] = {0, 0, 0, 0};
      if (kRounding == Rounding::kStochastic) {
        const uint64_t step = step_of(t.param);
        const math::Philox4x32 a = math::sr_random_block(seed, step, t.param, index >> 2);
        const uint32_t s = static_cast<uint32_t>(index & 3u);
        // A quad off the tensor's block grid also needs the next block's first words.
        const math::Philox4x32 b = s == 0 ? a : math::sr_random_block(seed, step, t.param, (index >> 2) + 1);
#pragma unroll
        for (uint32_t j = 0; j < 4; ++j) r[j] = pick(a, b, s + j);
      }
      ushort4 out;
      out.x = round(x.x, r[0]);
      out.y = round(x.y, r[1]);
      out.z = round(x.z, r[2]);
      out.w = round(x.w, r[3]);
      if ((reinterpret_cast<uintptr_t>(c + e0) & 7u) == 0) {
        *reinterpret_cast<ushort4*>(c + e0) = out;
      } else {
        c[e0] = out.x;
        c[e0 + 1] = out.y;
        c[e0 + 2] = out.z;
        c[e0 + 3] = out.w;
      }
      return;
    }
    // The quad meets a tensor boundary or padding: element by element.
    one(e0, x.x);
    one(e0 + 1, x.y);
    one(e0 + 2, x.z);
    one(e0 + 3, x.w);
  }
};

// Calls launch(writer) with the copy writer of the node (NoCopy without a model copy): one
// kernel instantiation per (precision, rounding).
template <class Launch>
void with_copy(const CudaContext& ctx, const GraphNode& node, Launch&& launch) {
  // A node without a copy, or whose part (a sharded step's cut) holds no tensor: nothing to write.
  if (node.copy.c.count == 0 || ctx.copy.count == 0) return launch(NoCopy{});
  const int32_t* steps = node.tensor_state.count ? ctx.at<const int32_t>(node.tensor_state) + node.tensor_state.count / 2 : nullptr;
  auto make = [&](auto tag) {
    using W = decltype(tag);
    return W{ctx.at<uint16_t>(node.copy.c), ctx.copy.tensors, ctx.copy.chunks, ctx.copy.count, node.copy.seed,
             ctx.scalars.i32, steps};
  };
  const bool bf16 = node.copy.precision == Precision::kBf16;
  if (node.copy.rounding == Rounding::kNearest) {
    if (bf16) return launch(make(CopyWriter<Precision::kBf16, Rounding::kNearest>{}));
    return launch(make(CopyWriter<Precision::kFp16, Rounding::kNearest>{}));
  }
  if (bf16) return launch(make(CopyWriter<Precision::kBf16, Rounding::kStochastic>{}));
  launch(make(CopyWriter<Precision::kFp16, Rounding::kStochastic>{}));
}

}  // namespace cuda
}  // namespace renaissance
