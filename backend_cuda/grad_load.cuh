// How the CUDA kernels read G (PrecisionOptions::model_dtype_gradients): a small value type per
// encoding, passed to the kernels as a template argument, whose operator[] returns element i as
// fp32 (bf16 / fp16 widened exactly by math/precision.h) and whose quads() loads four elements
// at once (one float4, or one 8-byte ushort4 widened lane by lane). The kernels then compute
// exactly as on fp32 gradients, so the bits are those of an fp32-gradient task fed the widened
// values; only the bytes read from memory change (2 per element instead of 4).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

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

// The element and quad types of an encoding of math::encoding_bytes 2 (bf16, fp16) or 1.
template <Precision kFormat>
struct EncodingTypes {
  static constexpr bool kOneByte = math::encoding_bytes(kFormat) == 1;
  static_assert(kOneByte || math::encoding_bytes(kFormat) == 2, "an encoding of 1 or 2 bytes");
  using Bits = std::conditional_t<kOneByte, uint8_t, uint16_t>;
  using Quad = std::conditional_t<kOneByte, uchar4, ushort4>;
};

// kFormat: an encoding (not kFp32), read through math/precision.h's encoded_to_f32.
template <Precision kFormat>
struct GradHalf {
  using Bits = typename EncodingTypes<kFormat>::Bits;
  using Quad = typename EncodingTypes<kFormat>::Quad;
  const Bits* p;
  __device__ __forceinline__ static float widen(uint16_t h) { return math::encoded_to_f32(kFormat, h); }
  __device__ __forceinline__ float operator[](int64_t i) const { return widen(p[i]); }
  __host__ __device__ __forceinline__ GradHalf operator+(int64_t off) const { return GradHalf{p + off}; }
  struct Quads {
    const Quad* p;
    __device__ __forceinline__ float4 operator[](int64_t q) const {
      const Quad h = p[q];
      return make_float4(widen(h.x), widen(h.y), widen(h.z), widen(h.w));
    }
  };
  __device__ __forceinline__ Quads quads() const { return Quads{reinterpret_cast<const Quad*>(p)}; }
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
    if constexpr (kFormat == Precision::kFp32) {
      return *reinterpret_cast<const float*>(at);
    } else {
      using Bits = typename EncodingTypes<kFormat>::Bits;
      return math::encoded_to_f32(kFormat, *reinterpret_cast<const Bits*>(at));
    }
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
        if constexpr (kFormat == Precision::kFp32) {
          return __ldg(reinterpret_cast<const float4*>(at));
        } else {
          using Quad = typename EncodingTypes<kFormat>::Quad;
          const Quad h = __ldg(reinterpret_cast<const Quad*>(at));
          return make_float4(math::encoded_to_f32(kFormat, h.x), math::encoded_to_f32(kFormat, h.y),
                             math::encoded_to_f32(kFormat, h.z), math::encoded_to_f32(kFormat, h.w));
        }
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
