// The bf16/fp16 model copy written by the update kernels themselves (issue 14): each update
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
#include "renaissance/model_copy_key.h"

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
  CopyLookup lookup;            // the node's tensors and chunk index, in device memory
  uint64_t seed;
  const int32_t* flags;         // the step's int32 scalars (kStep: the applied step t)
  const int32_t* tensor_steps;  // tensor_mask: each tensor's own count; null: the task's t

  __device__ __forceinline__ uint32_t task_t() const { return static_cast<uint32_t>(flags[kStep]); }

  // Span element e whose new master is x (a tile's unaligned head or tail).
  __device__ __forceinline__ void one(uint64_t e, float x) const {
    uint16_t out;
    if (copy_one<kPrecision, kRounding>(lookup, seed, tensor_steps, task_t(), e, x, &out)) c[e] = out;
  }

  // Span elements e0 .. e0+3 (e0 a multiple of 4) whose new masters are x.
  __device__ __forceinline__ void quad(uint64_t e0, float4 x) const {
    uint16_t out[4];
    if (copy_quad<kPrecision, kRounding>(lookup, seed, tensor_steps, task_t(), e0, x.x, x.y, x.z, x.w, out)) {
      if ((reinterpret_cast<uintptr_t>(c + e0) & 7u) == 0) {
        *reinterpret_cast<ushort4*>(c + e0) = make_ushort4(out[0], out[1], out[2], out[3]);
      } else {
        for (int j = 0; j < 4; ++j) c[e0 + j] = out[j];
      }
      return;
    }
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
    return W{ctx.at<uint16_t>(node.copy.c), ctx.copy, node.copy.seed, ctx.scalars.i32, steps};
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
