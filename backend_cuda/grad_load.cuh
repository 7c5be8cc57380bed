// How the CUDA kernels read G (PrecisionOptions::model_dtype_gradients): a small value type per
// encoding, passed to the kernels as a template argument, whose operator[] returns element i as
// fp32 (bf16 / fp16 widened exactly by math/precision.h) and whose quads() loads four elements
// at once (one float4, or one 8-byte ushort4 widened lane by lane). The kernels then compute
// exactly as on fp32 gradients, so the bits are those of an fp32-gradient task fed the widened
// values; only the bytes read from memory change (2 per element instead of 4).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/cuda_check.h"
#include "renaissance/graph.h"
#include "renaissance/math/precision.h"

namespace renaissance {
namespace cuda {

struct GradF32 {
  const float* p;
  __device__ __forceinline__ float operator[](int64_t i) const { return p[i]; }
  __device__ __forceinline__ GradF32 operator+(int64_t off) const { return GradF32{p + off}; }
  struct Quads {
    const float4* p;
    __device__ __forceinline__ float4 operator[](int64_t q) const { return p[q]; }
  };
  // Element 4q .. 4q+3 as one float4 (p must be 16-byte aligned there).
  __device__ __forceinline__ Quads quads() const { return Quads{reinterpret_cast<const float4*>(p)}; }
};

// kFormat: Precision::kBf16 or Precision::kFp16.
template <Precision kFormat>
struct GradHalf {
  const uint16_t* p;
  __device__ __forceinline__ static float widen(uint16_t h) {
    return math::half_to_f32(kFormat == Precision::kBf16, h);
  }
  __device__ __forceinline__ float operator[](int64_t i) const { return widen(p[i]); }
  __device__ __forceinline__ GradHalf operator+(int64_t off) const { return GradHalf{p + off}; }
  struct Quads {
    const ushort4* p;
    __device__ __forceinline__ float4 operator[](int64_t q) const {
      const ushort4 h = p[q];
      return make_float4(widen(h.x), widen(h.y), widen(h.z), widen(h.w));
    }
  };
  __device__ __forceinline__ Quads quads() const { return Quads{reinterpret_cast<const ushort4*>(p)}; }
};
using GradBf16 = GradHalf<Precision::kBf16>;
using GradF16 = GradHalf<Precision::kFp16>;

// Calls launch(grad) with the reader of the node's G for its encoding (one kernel instantiation
// per encoding).
template <class Launch>
void with_grad(const char* arena, const GraphNode& node, Launch&& launch) {
  const char* g = arena + node.g.offset;
  switch (node.grad_dtype) {
    case Precision::kBf16:
      return launch(GradBf16{reinterpret_cast<const uint16_t*>(g)});
    case Precision::kFp16:
      return launch(GradF16{reinterpret_cast<const uint16_t*>(g)});
    case Precision::kFp32:
      break;
  }
  launch(GradF32{reinterpret_cast<const float*>(g)});
}

}  // namespace cuda
}  // namespace renaissance
