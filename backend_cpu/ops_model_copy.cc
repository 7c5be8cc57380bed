// The model copy of a mixed-precision task (issue 14): after an update block, each new master
// is rounded to bf16/fp16 (math/precision.h, shared with the CUDA backend) and stored into
// C_MODEL_COPY. The stochastic-rounding word depends on the element's index in its tensor, never
// on the block, so chunking and thread count cannot change a bit. Scalar code: the rounding is
// integer arithmetic, the same on every SIMD target.
#include <algorithm>
#include <cstdint>

#include "backend_cpu/cpu_ops.h"
#include "renaissance/math/precision.h"

namespace renaissance {
namespace cpu {

namespace {

template <Precision kPrecision, Rounding kRounding>
void round_tensor_part(const float* w, uint16_t* c, uint64_t idx_begin, uint64_t idx_end, uint64_t seed,
                       uint64_t t, uint32_t param) {
  math::Philox4x32 block{};
  for (uint64_t idx = idx_begin; idx < idx_end; ++idx) {
    const float x = w[idx];
    uint16_t out;
    if (kRounding == Rounding::kNearest) {
      out = kPrecision == Precision::kBf16 ? math::f32_to_bf16_rne(x) : math::f32_to_f16_rne(x);
    } else {
      // One Philox call per four elements of the tensor (math::sr_random_word's words).
      if (idx == idx_begin || (idx & 3u) == 0) block = math::sr_random_block(seed, t, param, idx >> 2);
      const uint32_t r = block.v[idx & 3u];
      out = kPrecision == Precision::kBf16 ? math::f32_to_bf16_sr(x, r) : math::f32_to_f16_sr(x, r);
    }
    c[idx] = out;
  }
}

}  // namespace

void write_model_copy(const CpuContext& ctx, const GraphNode& node, uint64_t begin, uint64_t end) {
  const ModelCopy& copy = node.copy;
  const float* w = ctx.at<float>(node.w);
  uint16_t* c = ctx.at<uint16_t>(copy.c);
  const uint64_t t = static_cast<uint64_t>(static_cast<uint32_t>(ctx.scalars.i32[kStep]));
  // The first tensor that ends after `begin` (tensors are in span order).
  auto it = std::upper_bound(copy.tensors.begin(), copy.tensors.end(), begin,
                             [](uint64_t pos, const CopyTensor& ct) { return pos < ct.begin + ct.numel; });
  for (; it != copy.tensors.end() && it->begin < end; ++it) {
    const uint64_t lo = std::max(begin, it->begin) - it->begin;
    const uint64_t hi = std::min(end, it->begin + it->numel) - it->begin;
    const float* tw = w + it->begin;
    uint16_t* tc = c + it->begin;
    const bool bf16 = copy.precision == Precision::kBf16;
    if (copy.rounding == Rounding::kNearest) {
      if (bf16) round_tensor_part<Precision::kBf16, Rounding::kNearest>(tw, tc, lo, hi, copy.seed, t, it->param);
      else round_tensor_part<Precision::kFp16, Rounding::kNearest>(tw, tc, lo, hi, copy.seed, t, it->param);
    } else {
      if (bf16) round_tensor_part<Precision::kBf16, Rounding::kStochastic>(tw, tc, lo, hi, copy.seed, t, it->param);
      else round_tensor_part<Precision::kFp16, Rounding::kStochastic>(tw, tc, lo, hi, copy.seed, t, it->param);
    }
  }
}

}  // namespace cpu
}  // namespace renaissance
