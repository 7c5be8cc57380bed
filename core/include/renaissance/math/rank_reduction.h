// The arithmetic of a sharded step's gradient reduction, written once for every backend
// (docs/distributed.md, "ordered" and "fast"): Backend::reduce_ranks runs it on the backend's own
// memory (a CPU loop, a CUDA kernel), the single-process simulation (synthesize_rank_sum) runs
// the same two formulas, so a K-rank step and its simulation cannot drift apart.
#pragma once

#include <cstdint>
#include <cstring>

#include "renaissance/math/host_device.h"
#include "renaissance/math/precision.h"
#include "renaissance/precision.h"

namespace renaissance {
namespace math {

// GradReduce::kOrdered: the K ranks' values of one element are added to a running fp32 sum in
// rank order r = 0, 1, ..., K-1, left to right (sum = value of rank 0, then ordered_rank_add for
// r = 1, ...), and the sum is divided by K (a division, not a multiplication by 1/K).
RN_HD float ordered_rank_add(float running_sum, float rank_value) { return running_sum + rank_value; }
RN_HD float ordered_rank_mean(float sum, int ranks) { return sum / static_cast<float>(ranks); }

// Element i of G-encoded memory: fp32, or a model-dtype encoding widened exactly (model-dtype
// gradients). Stored: fp32 as is, an encoding rounded to nearest even (math/precision.h).
RN_HD float load_grad(Precision dtype, const void* base, uint64_t i) {
  if (dtype == Precision::kFp32) {
    float x;
    std::memcpy(&x, static_cast<const char*>(base) + i * sizeof(float), sizeof x);
    return x;
  }
  return encoded_to_f32(dtype, load_encoding(dtype, base, i));
}
RN_HD void store_grad(Precision dtype, void* base, uint64_t i, float x) {
  if (dtype == Precision::kFp32) {
    std::memcpy(static_cast<char*>(base) + i * sizeof(float), &x, sizeof x);
    return;
  }
  store_encoding(dtype, base, i, f32_to_encoded_rne(dtype, x));
}

// One pass of the reduction over `count` elements: `summands` blocks of `stride` elements each
// (encoded as `in`) at `blocks`; element i of the pass is element first + i of every block.
//   sum = block 0's value; sum = ordered_rank_add(sum, block r's value) for r = 1..summands-1;
//   divisor > 0: sum = ordered_rank_mean(sum, divisor); stored as `out` at element i of dst.
// The sharded step's uses: the ordered mean (K summands, divisor K, in = out = G's dtype), the
// fast path's widening of 2-byte G before the engine's fp32 sum (1 summand, no divisor, out
// fp32: the value passes through untouched) and its division of that sum (1 summand, divisor K,
// in fp32, out G's dtype). Both pointers are in the executing backend's memory.
struct RankReduce {
  const void* blocks = nullptr;
  uint64_t stride = 0;
  uint64_t first = 0;
  uint64_t count = 0;
  int summands = 1;
  int divisor = 0;
  Precision in = Precision::kFp32;
  Precision out = Precision::kFp32;
  void* dst = nullptr;
};

RN_HD void rank_reduce_element(const RankReduce& op, uint64_t i) {
  float sum = load_grad(op.in, op.blocks, op.first + i);
  for (int r = 1; r < op.summands; ++r) {
    sum = ordered_rank_add(sum, load_grad(op.in, op.blocks, static_cast<uint64_t>(r) * op.stride + op.first + i));
  }
  if (op.divisor > 0) sum = ordered_rank_mean(sum, op.divisor);
  store_grad(op.out, op.dst, i, sum);
}

}  // namespace math
}  // namespace renaissance
