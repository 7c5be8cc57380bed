// The fused update-and-copy loop of the element-wise updates (fused_update.h), one template for
// every element-wise kind: a kind supplies only its Rule (the call into update_rules.inc, see
// simd_policy-inl.h's RuleChunk), and FusedUpdate<Rule> is its per-target FusedFn. Per vector of
// elements: load w, m, v and the 2-byte (or fp32) G, widen G in-register (half_simd-inl.h's
// WidenLoad: the exact integer widen), apply the rule, store w, m, v, round the new w into the
// copy (half_simd-inl.h's RoundVec, with Philox words for stochastic rounding) and store it. The
// scalar heads and tails apply the same rule with the scalar policy and the scalar definitions of
// math/precision.h, so where a piece splits between vector and scalar code never changes a bit,
// and the bits are those of the unfused path (widen_grad, RuleChunk, round_model_copy).
// tests/cpu/test_fused_update.cc compares both paths per Highway target.
// Included once per Highway target from the kinds' op files (Highway's -inl.h convention).

#if defined(RENAISSANCE_FUSED_UPDATE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RENAISSANCE_FUSED_UPDATE_INL_H_
#undef RENAISSANCE_FUSED_UPDATE_INL_H_
#else
#define RENAISSANCE_FUSED_UPDATE_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <type_traits>

#include "backend_cpu/fused_update.h"
#include "backend_cpu/half_simd-inl.h"
#include "backend_cpu/simd_policy-inl.h"
#include "renaissance/math/precision.h"
#include "renaissance/model_copy_key.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// Element k of G as a float (exact widen of a 2-byte encoding: math/precision.h).
template <Precision kGrad>
HWY_INLINE float GradAt(const void* g, uint64_t k) {
  if (kGrad == Precision::kFp32) return static_cast<const float*>(g)[k];
  return math::half_to_f32(kGrad == Precision::kBf16, static_cast<const uint16_t*>(g)[k]);
}

// The loop bodies below must be inlined into the loops (GCC otherwise calls the vector body per
// vector, passing the vectors through memory, once a function holds many instantiations).
#if defined(__GNUC__) || defined(__clang__)
#define RN_FUSED_BODY __attribute__((always_inline))
#else
#define RN_FUSED_BODY
#endif

// fp16 stochastic rounding splits the loop: a sub-block of kSplitElements is updated, then its
// new masters are rounded from L1. F16Sr is long; behind the division and square root of the
// same iteration it ran slower fused than in its own loop (dev VM, AVX3, in cache: 1.42 ns per
// AdamW element fused, 1.19 split, 1.27 unfused; bf16 stochastic was slower split: 0.79 against
// 0.74). Still one pass over memory. A multiple of every vector width and of 8 (a Philox block).
constexpr uint64_t kSplitElements = 512;

// One instantiation per (Rule, G encoding, copy format, rounding); its own function (not inlined
// into FusedUpdate's switch), so the compiler's inlining budget is spent inside its loop.
template <class Rule, Precision kGrad, Precision kCopy, Rounding kRounding>
HWY_NOINLINE void FusedLoop(const FusedPiece& p, const rules::Coeffs<FloatVec>& cv, const rules::Coeffs<float>& cs) {
  constexpr bool kHasCopy = kCopy != Precision::kFp32;
  constexpr bool kHasM = Rule::kHasM, kHasV = Rule::kHasV;
  float* HWY_RESTRICT w = p.w;
  float* HWY_RESTRICT m = p.m;
  float* HWY_RESTRICT v = p.v;
  uint16_t* HWY_RESTRICT c = p.c;
  // Element k's copy from its new master, the scalar definition (words: the piece's SrWords).
  auto scalar_round = [&](uint64_t k, SrWords& words) RN_FUSED_BODY {
    const uint32_t r = kRounding == Rounding::kStochastic ? words(p.first + k) : 0;
    c[k] = round_copy<kCopy, kRounding>(w[k], r);
  };
  // Elements [b, e): the scalar definitions (also the whole piece on HWY_SCALAR), with the copy
  // unless kRound is false.
  auto scalar = [&](uint64_t b, uint64_t e, auto round_tag) RN_FUSED_BODY {
    constexpr bool kRound = decltype(round_tag)::value;
    SrWords words(p.seed, p.t, p.param);
    for (uint64_t k = b; k < e; ++k) {
      float wk = w[k];
      float mk = kHasM ? m[k] : 0.0f;
      float vk = kHasV ? v[k] : 0.0f;
      Rule::template apply<rules::ScalarPolicy>(wk, GradAt<kGrad>(p.g, k), mk, vk, cs);
      w[k] = wk;
      if (kHasM) m[k] = mk;
      if (kHasV) v[k] = vk;
      if (kHasCopy && kRound) scalar_round(k, words);
    }
  };
  using WithCopy = std::integral_constant<bool, kHasCopy>;
#if HWY_TARGET == HWY_SCALAR
  (void)cv;
  scalar(0, p.n, WithCopy());
#else
  // The update of the full vector at element k; returns the new masters.
  const uint64_t ahead = p.ahead;
  auto update = [&](uint64_t k) RN_FUSED_BODY {
    const FloatTag d;
    // One request per 64-byte line: float arrays every 16 elements, 2-byte arrays every 32, into
    // the outer caches (locality 2, as cpu_ops.h's prefetch_lines); not the copy, which is
    // written with non-temporal stores and never read.
    // A hint only: never faults, never changes data (near the span's end it asks for spare lines).
    if (ahead != 0 && k % 16 < hn::Lanes(d)) {
      const uint64_t at = k + ahead;
      __builtin_prefetch(w + at, 0, 2);
      if (kHasM) __builtin_prefetch(m + at, 0, 2);
      if (kHasV) __builtin_prefetch(v + at, 0, 2);
      if (kGrad == Precision::kFp32) {
        __builtin_prefetch(static_cast<const float*>(p.g) + at, 0, 2);
      } else if (k % 32 < hn::Lanes(d)) {
        __builtin_prefetch(static_cast<const uint16_t*>(p.g) + at, 0, 2);
      }
    }
    FloatVec vw = hn::LoadU(d, w + k);
    FloatVec vg;
    if (kGrad == Precision::kFp32) {
      vg = hn::LoadU(d, static_cast<const float*>(p.g) + k);
    } else {
      vg = half::WidenLoad<kGrad == Precision::kBf16>(static_cast<const uint16_t*>(p.g) + k);
    }
    FloatVec vm = kHasM ? hn::LoadU(d, m + k) : hn::Zero(d);
    FloatVec vv = kHasV ? hn::LoadU(d, v + k) : hn::Zero(d);
    Rule::template apply<VectorPolicy>(vw, vg, vm, vv, cv);
    hn::StoreU(vw, d, w + k);
    if (kHasM) hn::StoreU(vm, d, m + k);
    if (kHasV) hn::StoreU(vv, d, v + k);
    return vw;
  };
  // The copy of the full vector at element k from its new masters x, with its lanes' words rnd.
  // A non-temporal store where c + k is aligned to the vector (the copy is never read by the
  // step, so caching it only costs a read of each line before it is written; the caller fences
  // the stores with hwy::FlushStream); Highway's Stream writes at least 16 bytes, so targets
  // with narrower copy vectors store.
  auto round = [&](uint64_t k, FloatVec x, half::VU rnd) RN_FUSED_BODY {
    const auto bits = half::RoundVec<kCopy, kRounding>(x, rnd);
    constexpr size_t kCopyVectorBytes = hn::MaxLanes(half::D16()) * sizeof(uint16_t);
    if (kCopyVectorBytes >= 16 && reinterpret_cast<uintptr_t>(c + k) % kCopyVectorBytes == 0) {
      hn::Stream(bits, half::D16(), c + k);
    } else {
      hn::StoreU(bits, half::D16(), c + k);
    }
  };
  if (kHasCopy && kCopy == Precision::kFp16 && kRounding == Rounding::kStochastic) {
    for (uint64_t b = 0; b < p.n; b += kSplitElements) {
      const uint64_t n = p.n - b < kSplitElements ? p.n - b : kSplitElements;
      half::ForEachCopyVector<Rounding::kNearest>(
          n, 0, 0, 0, 0, [&](uint64_t i, half::VU) RN_FUSED_BODY { update(b + i); },
          [&](uint64_t lo, uint64_t hi) RN_FUSED_BODY { scalar(b + lo, b + hi, std::false_type()); });
      half::ForEachCopyVector<kRounding>(
          n, p.first + b, p.seed, p.t, p.param,
          [&](uint64_t i, half::VU rnd) RN_FUSED_BODY { round(b + i, hn::LoadU(FloatTag(), w + b + i), rnd); },
          [&](uint64_t lo, uint64_t hi) RN_FUSED_BODY {
            SrWords words(p.seed, p.t, p.param);
            for (uint64_t k = b + lo; k < b + hi; ++k) scalar_round(k, words);
          });
    }
    return;
  }
  // Without a copy (or nearest) this is a plain loop over the vectors and a scalar tail.
  half::ForEachCopyVector<kHasCopy ? kRounding : Rounding::kNearest>(
      p.n, p.first, p.seed, p.t, p.param,
      [&](uint64_t k, half::VU rnd) RN_FUSED_BODY {
        const FloatVec x = update(k);
        if (kHasCopy) round(k, x, rnd);
      },
      [&](uint64_t b, uint64_t e) RN_FUSED_BODY { scalar(b, e, WithCopy()); });
#endif
}

// The FusedFn of Rule on this target (l2 is in the Rule's type already: the op file picks it).
template <class Rule>
HWY_INLINE void FusedUpdate(const FusedPiece& p, FusedMode mode, const float* s, CoeffSet set) {
  constexpr Precision k32 = Precision::kFp32, kB = Precision::kBf16, kH = Precision::kFp16;
  constexpr Rounding kN = Rounding::kNearest, kS = Rounding::kStochastic;
  const auto cv = vector_coeffs(s, set);
  const auto cs = scalar_coeffs(s, set);
  switch (mode) {
    case FusedMode::kG32: return FusedLoop<Rule, k32, k32, kN>(p, cv, cs);
    case FusedMode::kG32Bf16Rne: return FusedLoop<Rule, k32, kB, kN>(p, cv, cs);
    case FusedMode::kG32Bf16Sr: return FusedLoop<Rule, k32, kB, kS>(p, cv, cs);
    case FusedMode::kG32Fp16Rne: return FusedLoop<Rule, k32, kH, kN>(p, cv, cs);
    case FusedMode::kG32Fp16Sr: return FusedLoop<Rule, k32, kH, kS>(p, cv, cs);
    case FusedMode::kGBf16: return FusedLoop<Rule, kB, k32, kN>(p, cv, cs);
    case FusedMode::kGBf16Bf16Rne: return FusedLoop<Rule, kB, kB, kN>(p, cv, cs);
    case FusedMode::kGBf16Bf16Sr: return FusedLoop<Rule, kB, kB, kS>(p, cv, cs);
    case FusedMode::kGFp16: return FusedLoop<Rule, kH, k32, kN>(p, cv, cs);
    case FusedMode::kGFp16Fp16Rne: return FusedLoop<Rule, kH, kH, kN>(p, cv, cs);
    case FusedMode::kGFp16Fp16Sr: return FusedLoop<Rule, kH, kH, kS>(p, cv, cs);
    case FusedMode::kNone: break;  // never passed: run_elementwise takes the unfused path
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#endif  // RENAISSANCE_FUSED_UPDATE_INL_H_
