// Model-dtype gradients on the CPU (PrecisionOptions::model_dtype_gradients): the ops read G as
// fp32 floats, so a G of bf16 / fp16 encodings is widened exactly (math/precision.h) into a
// per-thread buffer one block at a time, right before the op computes on it. The block is small
// (at most a chunk or a few norm tiles), so it stays in cache: memory still sees one read of G,
// at 2 bytes per element. The math is then exactly the fp32-gradient math on the widened values.
#pragma once

#include <cstdint>
#include <vector>

#include "renaissance/graph.h"
#include "renaissance/math/precision.h"

namespace renaissance {
namespace cpu {

// dst[i] = the float value of encoding src[i] (exact: every bf16 / fp16 value is a float), the
// bits of math/precision.h's scalar definitions. Vectorised per Highway target
// (ops_widen_grad.cc; hwy::SetSupportedTargetsForTest restricts the dispatch).
void widen_grad(Precision dtype, const uint16_t* src, uint64_t n, float* dst);

// The name of the Highway target widen_grad dispatches to now.
const char* widen_grad_target();

// Is any of the n encodings a NaN or an infinity? (Exactly when its widened float is not finite:
// widening keeps the all-ones exponent of NaN and inf and maps every other encoding to a finite.)
inline bool encoded_has_non_finite(Precision dtype, const uint16_t* g, uint64_t n) {
  const uint16_t exponent = dtype == Precision::kBf16 ? 0x7f80 : 0x7c00;
  uint16_t any = 0;
  for (uint64_t i = 0; i < n; ++i) any |= static_cast<uint16_t>((g[i] & exponent) == exponent);
  return any != 0;
}

// The fp32 gradient of elements [begin, end) of a span whose G starts at `g` (bytes) in
// `dtype`: a pointer p with p[i] the (widened) gradient of element i for i in [begin, end).
// fp32: the span itself. bf16 / fp16: the calling thread's buffer, valid until its next call.
// (p is formed in integers, so p + i is an address inside the buffer, never pointer arithmetic
// outside an array.)
inline const float* fp32_grad(const char* g, Precision dtype, uint64_t begin, uint64_t end) {
  if (dtype == Precision::kFp32) return reinterpret_cast<const float*>(g);
  thread_local std::vector<float> buffer;
  if (buffer.size() < end - begin) buffer.resize(end - begin);
  widen_grad(dtype, reinterpret_cast<const uint16_t*>(g) + begin, end - begin, buffer.data());
  return reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(buffer.data()) - begin * sizeof(float));
}

}  // namespace cpu
}  // namespace renaissance
