// The model copy of a mixed-precision task: after an update block, each new master
// is rounded to bf16/fp16 and stored into C_MODEL_COPY. The stochastic-rounding word depends on
// the element's index in its tensor, never on the block, so chunking and thread count cannot
// change a bit.
// Vectorised with Highway: the lane-wise code (half_simd-inl.h, shared with the fused update of
// fused_update-inl.h) restates math/precision.h's scalar integer formulas (RNE, stochastic
// rounding, Philox-4x32-10) with the same integer operations, so every target computes the
// scalar definition's bits; tests/cpu/test_model_copy_simd.cc checks this per
// target on ties, subnormals, overflow, NaN/Inf and random inputs. Philox runs on Lanes()
// counters at once (one per block of eight elements) and the eight 16-bit halves of its output
// are interleaved back into element order, as sr_random_word assigns them.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_model_copy.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstdint>
#include <type_traits>

#include "backend_cpu/half_simd-inl.h"
#include "backend_cpu/model_copy.h"
#include "renaissance/math/precision.h"
#include "renaissance/model_copy_key.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {
namespace {

// The scalar definition, for heads and tails shorter than a vector (and the HWY_SCALAR target):
// sr_random_word's bits (SrWords: each Philox block drawn once).
template <Precision kPrecision, Rounding kRounding>
void round_scalar(const float* w, uint16_t* c, uint64_t n, uint64_t first, uint64_t seed, uint64_t t, uint32_t param) {
  SrWords words(seed, t, param);
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t r = kRounding == Rounding::kStochastic ? words(first + i) : 0;
    c[i] = round_copy<kPrecision, kRounding>(w[i], r);
  }
}

#if HWY_TARGET != HWY_SCALAR
namespace hn = hwy::HWY_NAMESPACE;

template <Precision kPrecision, Rounding kRounding>
void round_vector(const float* w, uint16_t* c, uint64_t n, uint64_t first, uint64_t seed, uint64_t t, uint32_t param) {
  half::ForEachCopyVector<kRounding>(
      n, first, seed, t, param,
      [&](uint64_t i, half::VU rnd) {
        hn::StoreU(half::RoundVec<kPrecision, kRounding>(hn::LoadU(half::DF(), w + i), rnd), half::D16(), c + i);
      },
      [&](uint64_t b, uint64_t e) { round_scalar<kPrecision, kRounding>(w + b, c + b, e - b, first + b, seed, t, param); });
}
#endif  // HWY_TARGET != HWY_SCALAR

template <Precision kPrecision, Rounding kRounding>
void round_part(const float* w, uint16_t* c, uint64_t n, uint64_t first, uint64_t seed, uint64_t t, uint32_t param) {
#if HWY_TARGET == HWY_SCALAR
  round_scalar<kPrecision, kRounding>(w, c, n, first, seed, t, param);
#else
  round_vector<kPrecision, kRounding>(w, c, n, first, seed, t, param);
#endif
}

}  // namespace

void RoundModelCopy(int precision, int rounding, const float* w, uint16_t* c, uint64_t n, uint64_t first,
                    uint64_t seed, uint64_t t, uint32_t param) {
  const bool bf16 = precision == static_cast<int>(Precision::kBf16);
  if (rounding == static_cast<int>(Rounding::kNearest)) {
    if (bf16) round_part<Precision::kBf16, Rounding::kNearest>(w, c, n, first, seed, t, param);
    else round_part<Precision::kFp16, Rounding::kNearest>(w, c, n, first, seed, t, param);
  } else {
    if (bf16) round_part<Precision::kBf16, Rounding::kStochastic>(w, c, n, first, seed, t, param);
    else round_part<Precision::kFp16, Rounding::kStochastic>(w, c, n, first, seed, t, param);
  }
}

const char* ModelCopyTarget() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <hwy/cache_control.h>

#include <algorithm>
#include <vector>

#include "backend_cpu/cpu_ops.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(RoundModelCopy);
HWY_EXPORT(ModelCopyTarget);

void round_model_copy(Precision precision, Rounding rounding, const float* w, void* c, uint64_t n,
                      uint64_t first, uint64_t seed, uint64_t t, uint32_t param) {
  if (precision != Precision::kBf16 && precision != Precision::kFp16) {  // no vector code: the scalar definitions
    for (uint64_t i = 0; i < n; ++i) {
      const uint16_t e = rounding == Rounding::kStochastic
                             ? math::f32_to_encoded_sr(precision, w[i], math::sr_random_word(seed, t, param, first + i))
                             : math::f32_to_encoded_rne(precision, w[i]);
      math::store_encoding(precision, c, i, e);
    }
    return;
  }
  HWY_DYNAMIC_DISPATCH(RoundModelCopy)(static_cast<int>(precision), static_cast<int>(rounding), w,
                                       static_cast<uint16_t*>(c), n, first, seed, t, param);
}

const char* model_copy_target() { return HWY_DYNAMIC_DISPATCH(ModelCopyTarget)(); }

namespace {

// Elements [begin, end) of the node's span cut at its copy's tensor boundaries, in span order:
// fn(lo, hi, &tensor, step) for each run inside a tensor, with the step that keys its stochastic
// rounding (copy_step: with tensor_mask each tensor's own count, graph.h), and, with kPadding,
// fn(lo, hi, nullptr, 0) for each run between tensors (whose copy is never written). The table
// counts from the group's first element, the node's span from ModelCopy::base: `first` (the
// tensor's index of element lo) is passed as fn's fifth argument.
template <bool kPadding, class Fn>
void for_each_copy_piece(const CpuContext& ctx, const GraphNode& node, uint64_t begin, uint64_t end, Fn&& fn) {
  const CopyTensor* tensors = ctx.at<const CopyTensor>(node.copy.tensors.tensors);
  const CopyTensor* tensors_end = tensors + node.copy.tensors.tensors.count;
  const uint64_t base = node.copy.base;
  const uint32_t task_t = static_cast<uint32_t>(ctx.scalars.i32[kStep]);
  const int32_t* steps = node.work.tensor_state.count ? ctx.at<int32_t>(node.work.tensor_state) + node.work.tensor_state.count / 2 : nullptr;
  auto padding = [&](uint64_t lo, uint64_t hi) {
    if (kPadding && lo < hi) fn(lo, hi, static_cast<const CopyTensor*>(nullptr), uint64_t{0}, uint64_t{0});
  };
  // The first tensor that ends after `begin` (tensors are in span order, their ends ascending).
  const CopyTensor* it = std::upper_bound(tensors, tensors_end, begin + base,
                                          [](uint64_t pos, const CopyTensor& ct) { return pos < ct.begin + ct.numel; });
  uint64_t at = begin;
  for (; it != tensors_end && it->begin < end + base; ++it) {
    // The tensor's elements in the node's span: [lo, hi).
    const uint64_t lo = std::max(at, it->begin > base ? it->begin - base : 0);
    const uint64_t hi = std::min(end, it->begin + it->numel - base);
    padding(at, lo);
    if (lo < hi) {
      fn(lo, hi, &*it, copy_step(steps, task_t, static_cast<uint32_t>(it->param)), it->first + (lo + base - it->begin));
    }
    at = std::max(at, hi);
  }
  padding(at, end);
}

}  // namespace

void write_model_copy(const CpuContext& ctx, const GraphNode& node, uint64_t begin, uint64_t end) {
  const ModelCopy& copy = node.copy;
  const float* w = ctx.at<float>(node.span(Family::kW));
  char* c = ctx.at<char>(copy.c);
  const uint64_t elem = precision_bytes(copy.precision);
  // A masked tensor's copy is rewritten from its unchanged master with its unchanged key, so it
  // keeps its bits.
  for_each_copy_piece<false>(ctx, node, begin, end,
                             [&](uint64_t lo, uint64_t hi, const CopyTensor* t, uint64_t step, uint64_t first) {
                               round_model_copy(copy.precision, copy.rounding, w + lo, c + lo * elem, hi - lo, first,
                                                copy.seed, step, static_cast<uint32_t>(t->param));
                             });
}

void run_fused_range(const CpuContext& ctx, const GraphNode& node, FusedFn fn, FusedMode with_copy, FusedMode no_copy,
                     uint64_t begin, uint64_t end, const float* s) {
  const ModelCopy& copy = node.copy;
  float* w = ctx.at<float>(node.span(Family::kW));
  const char* g = ctx.at<char>(node.span(Family::kG));
  const uint64_t g_elem = precision_bytes(node.grad.encoding);
  float* m = node.span(Family::kM).count ? ctx.at<float>(node.span(Family::kM)) : nullptr;
  float* v = node.span(Family::kV).count ? ctx.at<float>(node.span(Family::kV)) : nullptr;
  uint16_t* c = copy.c.count ? ctx.at<uint16_t>(copy.c) : nullptr;
  const CoeffSet set = coeff_set(node);
  const bool l2 = node.flags.weight_decay_mode == WeightDecayMode::kL2;
  // Elements [lo, hi): inside tensor t (copy written, keyed by `step`), or padding (t null).
  auto piece = [&](uint64_t lo, uint64_t hi, const CopyTensor* t, uint64_t step, uint64_t first) {
    FusedPiece p;
    p.w = w + lo;
    p.g = g + lo * g_elem;
    p.m = m ? m + lo : nullptr;
    p.v = v ? v + lo : nullptr;
    p.n = hi - lo;
    p.ahead = ctx.tuning.prefetch_elements;
    if (t != nullptr) {
      p.c = c + lo;
      p.first = first;
      p.seed = copy.seed;
      p.t = step;
      p.param = static_cast<uint32_t>(t->param);
    }
    fn(p, t != nullptr ? with_copy : no_copy, s, set, l2);
  };
  if (c == nullptr) {
    if (begin < end) piece(begin, end, nullptr, 0, 0);
    return;
  }
  for_each_copy_piece<true>(ctx, node, begin, end, piece);
  // Non-temporal stores are weakly ordered: fence them before this thread's part is reported done.
  hwy::FlushStream();
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
