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
#include "renaissance/model_copy_key.h"

namespace renaissance {
namespace cuda {

struct GradF32 {
  const float* p;
  __device__ __forceinline__ float operator[](int64_t i) const { return p[i]; }
  __host__ __device__ __forceinline__ GradF32 operator+(int64_t off) const { return GradF32{p + off}; }
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
  __host__ __device__ __forceinline__ GradHalf operator+(int64_t off) const { return GradHalf{p + off}; }
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

// TaskOptions::gradient_table (graph.h): G read through the per-parameter address table. Element
// i of the reader is element base + i of the node's G span; model_copy_key.h's GradTableRef finds
// its tensor and address (padding reads +0.0, as the arena's zero padding does). quads() loads a
// quad as one vector only where its four elements lie in one tensor at an aligned address
// (16 bytes fp32, 8 bytes bf16/fp16), else element by element: the same values either way.
// Both read the chunk's address (ref.chunk_at, filled by grad_chunks.cu this step) first: inside a
// chunk that lies in one tensor the element's address is that plus its offset (one dependent
// load instead of three or four); elsewhere the full lookup.
template <Precision kFormat>
struct GradTabled {
  GradTableRef ref;
  int64_t base;
  static constexpr uint32_t kElem = precision_bytes(kFormat);
  __device__ __forceinline__ static float load(uint64_t at) {
    if (at == 0) return 0.0f;
    if (kFormat == Precision::kFp32) return *reinterpret_cast<const float*>(at);
    return math::half_to_f32(kFormat == Precision::kBf16, *reinterpret_cast<const uint16_t*>(at));
  }
  __device__ __forceinline__ float operator[](int64_t i) const {
    return load(ref.chunked_address(static_cast<uint64_t>(base + i), kElem));
  }
  __host__ __device__ __forceinline__ GradTabled operator+(int64_t off) const { return GradTabled{ref, base + off}; }
  struct Quads {
    GradTableRef ref;
    int64_t base;
    __device__ __forceinline__ float4 operator[](int64_t q) const {
      const uint64_t e0 = static_cast<uint64_t>(base + 4 * q);
      const uint64_t fast = ref.chunked_quad(e0, kElem);
      const uint64_t at = fast != 0 ? fast : ref.run_address(e0, 4, kElem);
      if (at != 0 && at % (4 * kElem) == 0) {
        // __ldg: a global-space, read-only load (a plain dereference of an integer address is
        // a generic one). No kernel writes G while the step reads it.
        if (kFormat == Precision::kFp32) return __ldg(reinterpret_cast<const float4*>(at));
        const ushort4 h = __ldg(reinterpret_cast<const ushort4*>(at));
        const bool bf16 = kFormat == Precision::kBf16;
        return make_float4(math::half_to_f32(bf16, h.x), math::half_to_f32(bf16, h.y), math::half_to_f32(bf16, h.z),
                           math::half_to_f32(bf16, h.w));
      }
      // In one tensor but misaligned (its four elements are contiguous from `at`).
      if (at != 0) return make_float4(load(at), load(at + kElem), load(at + 2 * kElem), load(at + 3 * kElem));
      return make_float4(load(ref.address(e0, kElem)), load(ref.address(e0 + 1, kElem)),
                         load(ref.address(e0 + 2, kElem)), load(ref.address(e0 + 3, kElem)));
    }
  };
  __device__ __forceinline__ Quads quads() const { return Quads{ref, base}; }
};

}  // namespace cuda
}  // namespace renaissance
