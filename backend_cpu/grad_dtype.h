// Model-dtype gradients on the CPU (PrecisionOptions::model_dtype_gradients): the ops read G as
// fp32 floats, so a G of bf16 / fp16 encodings is widened exactly (math/precision.h) into a
// per-thread buffer one block at a time, right before the op computes on it. The block is small
// (at most a chunk or a few norm tiles), so it stays in cache: memory still sees one read of G,
// at 2 bytes per element. The math is then exactly the fp32-gradient math on the widened values.
// With a gradient table (TaskOptions::gradient_table) the same blocks come from each tensor's own
// memory (GradSource below).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "renaissance/graph.h"
#include "renaissance/math/precision.h"
#include "renaissance/model_copy_key.h"

namespace renaissance {
namespace cpu {

// dst[i] = the float value of encoding i at src (exact: every encoding's value is a float;
// src holds n encodings of precision_bytes(dtype) each), the bits of math/precision.h's
// scalar definitions. Vectorised per Highway target for bf16 / fp16 (ops_widen_grad.cc;
// hwy::SetSupportedTargetsForTest restricts the dispatch).
void widen_grad(Precision dtype, const void* src, uint64_t n, float* dst);

// The name of the Highway target widen_grad dispatches to now.
const char* widen_grad_target();

// Is any of the n encodings a NaN or an infinity? Exactly when its exponent field is all ones
// (then its widened float is not finite; widening maps every other encoding to a finite).
// Vectorised per Highway target (ops_check.cc), a scan of integer lanes.
bool encoded_has_non_finite(Precision dtype, const void* g, uint64_t n);

// The same question for n fp32 gradients (ops_check.cc; the CHECK_FINITE scan of fp32 G).
bool fp32_has_non_finite(const float* g, uint64_t n);

// The fp32 gradient of elements [begin, end) of a span whose G starts at `g` (bytes) in
// `dtype`: a pointer p with p[i] the (widened) gradient of element i for i in [begin, end).
// fp32: the span itself. bf16 / fp16: the calling thread's buffer, valid until its next call.
// (p is formed in integers, so p + i is an address inside the buffer, never pointer arithmetic
// outside an array.)
inline const float* fp32_grad(const char* g, Precision dtype, uint64_t begin, uint64_t end) {
  if (dtype == Precision::kFp32) return reinterpret_cast<const float*>(g);
  thread_local std::vector<float> buffer;
  if (buffer.size() < end - begin) buffer.resize(end - begin);
  widen_grad(dtype, g + begin * precision_bytes(dtype), end - begin, buffer.data());
  return reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(buffer.data()) - begin * sizeof(float));
}

// Where a node's ops read G: the node's arena span (`g`, `dtype` encodings), or with
// TaskOptions::gradient_table each tensor's own memory through the table (`table.table` non-null;
// graph.h, model_copy_key.h's GradTableRef). Made by cpu_ops.h's grad_source.
struct GradSource {
  const char* g = nullptr;
  Precision dtype = Precision::kFp32;
  GradTableRef table;
};

// fp32_grad for a GradSource: the same pointer convention (p[i] for i in [begin, end)). Through
// the table, a block inside one fp32 tensor is that tensor's own memory; any other block is
// gathered (and widened) run by run into the calling thread's buffer, padding as +0.0, as the
// arena's padding G reads.
inline const float* fp32_grad(const GradSource& src, uint64_t begin, uint64_t end) {
  if (src.table.table == nullptr) return fp32_grad(src.g, src.dtype, begin, end);
  const uint32_t elem = precision_bytes(src.dtype);
  if (src.dtype == Precision::kFp32) {
    if (const uint64_t at = src.table.run_address(begin, end - begin, elem)) {
      return reinterpret_cast<const float*>(static_cast<uintptr_t>(at - begin * sizeof(float)));
    }
  }
  thread_local std::vector<float> buffer;
  if (buffer.size() < end - begin) buffer.resize(end - begin);
  const CopyLookup& lookup = src.table.lookup;
  for (uint64_t e = begin; e < end;) {
    const uint32_t i = lookup.first_ending_after(e);
    float* out = buffer.data() + (e - begin);
    if (i == lookup.count || lookup.tensors[i].begin > e) {  // padding up to the next tensor
      const uint64_t stop = i == lookup.count ? end : std::min<uint64_t>(end, lookup.tensors[i].begin);
      std::fill(out, out + (stop - e), 0.0f);
      e = stop;
      continue;
    }
    const CopyTensor& t = lookup.tensors[i];
    const uint64_t stop = std::min<uint64_t>(end, t.begin + t.numel);
    const uint64_t at = src.table.address_in(t, e, elem);
    if (src.dtype == Precision::kFp32) {
      const float* from = reinterpret_cast<const float*>(static_cast<uintptr_t>(at));
      std::copy(from, from + (stop - e), out);
    } else {
      widen_grad(src.dtype, reinterpret_cast<const void*>(static_cast<uintptr_t>(at)), stop - e, out);
    }
    e = stop;
  }
  return reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(buffer.data()) - begin * sizeof(float));
}

}  // namespace cpu
}  // namespace renaissance
