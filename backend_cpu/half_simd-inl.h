// Per-target lane-wise conversions between fp32 and the 2-byte formats (bf16, fp16), shared by
// the model copy's rounding loop (ops_model_copy.cc), the gradient widen (ops_widen_grad.cc) and
// the fused update-and-copy loop (fused_update-inl.h), so that the three compute one set of bits.
// Each function restates a scalar definition of math/precision.h with integer operations (RNE,
// stochastic rounding, Philox-4x32-10, the exact fp16 -> fp32 widen); every target gives the
// scalar definition's bits, NaN payloads included. tests/cpu/test_model_copy_simd.cc and
// tests/cpu/test_widen_grad_simd.cc check them per target. Included once per Highway target from
// inside HWY_BEFORE_NAMESPACE's region (Highway's -inl.h convention); nothing on HWY_SCALAR,
// where the callers take the scalar definitions.

#if defined(RENAISSANCE_HALF_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RENAISSANCE_HALF_SIMD_INL_H_
#undef RENAISSANCE_HALF_SIMD_INL_H_
#else
#define RENAISSANCE_HALF_SIMD_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <type_traits>

#include "renaissance/math/precision.h"
#include "renaissance/precision.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {
#if HWY_TARGET != HWY_SCALAR
namespace half {
namespace hn = hwy::HWY_NAMESPACE;
using DU = hn::ScalableTag<uint32_t>;
using VU = hn::Vec<DU>;
using DI = hn::RebindToSigned<DU>;
using DF = hn::RebindToFloat<DU>;
using MU = hn::Mask<DU>;
using D16 = hn::Rebind<uint16_t, DU>;  // as many 16-bit lanes as DU has 32-bit lanes
using V16 = hn::Vec<D16>;

HWY_INLINE VU K(uint32_t x) { return hn::Set(DU(), x); }
// Comparisons of values below 2^31 (magnitudes, exponents, shift counts) as signed lanes, which
// every target has natively.
HWY_INLINE MU GtS(VU a, int32_t b) {
  const DI di;
  return hn::RebindMask(DU(), hn::Gt(hn::BitCast(di, a), hn::Set(di, b)));
}
// Clamp a shift count computed as a signed lane into [lo, hi]; lanes outside are masked later.
HWY_INLINE VU ClampShift(VU s, int32_t lo, int32_t hi) {
  const DI di;
  return hn::BitCast(DU(), hn::Min(hn::Max(hn::BitCast(di, s), hn::Set(di, lo)), hn::Set(di, hi)));
}

// ---- widening (math/precision.h's bf16_to_f32, f16_to_f32) ----

// f16_to_f32, lane-wise: a normal number re-biases its exponent; inf/NaN keep the all-ones
// exponent and the fraction (payload) shifted up; a subnormal's value frac * 2^-24 is formed by
// an exact int -> float conversion (frac < 2^10) and an exact multiply by a power of two, which
// is the number the scalar loop normalises by shifting (both results are normal floats). The
// targets without F16C use it (WidenLoad).
HWY_INLINE VU F16ToF32Bits(VU h) {
  const DF df;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, K(0x8000u)));
  const VU exp = hn::And(hn::ShiftRight<10>(h), K(0x1fu));
  const VU frac = hn::And(h, K(0x3ffu));
  const VU normal = hn::Or(hn::ShiftLeft<23>(hn::Add(exp, K(112u))), hn::ShiftLeft<13>(frac));
  const VU special = hn::Or(K(0x7f800000u), hn::ShiftLeft<13>(frac));
  const VU sub = hn::BitCast(DU(), hn::Mul(hn::ConvertTo(df, hn::BitCast(DI(), frac)), hn::Set(df, 0x1p-24f)));
  VU r = hn::IfThenElse(hn::Eq(exp, K(0x1fu)), special, normal);
  r = hn::IfThenElse(hn::Eq(exp, K(0)), sub, r);
  return hn::Or(r, sign);
}

// x86 targets from AVX2 up have F16C (Highway's PromoteTo / DemoteTo between f16 and f32 use
// it; below AVX2 Highway emulates them, which is not these bits).
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
constexpr bool kHardwareF16 = true;
#else
constexpr bool kHardwareF16 = false;
#endif

// Lanes() 2-byte encodings at src, widened to floats (bf16: the bits shifted up; fp16: above).
// With F16C, fp16 is vcvtph2ps, whose bits are f16_to_f32's for every encoding except the 1022
// signalling NaNs, which it quiets (sets fraction bit 22; checked on all 65536 on AVX3 here):
// those lanes get the bit cleared again. widen_grad fp16 on the dev VM (AVX3, in cache): 0.10 ns
// per element against 0.17 with F16ToF32Bits.
template <bool kBf16>
HWY_INLINE hn::Vec<DF> WidenLoad(const uint16_t* src) {
  const V16 raw = hn::LoadU(D16(), src);
  const VU h = hn::PromoteTo(DU(), raw);
  if (kBf16) return hn::BitCast(DF(), hn::ShiftLeft<16>(h));
  if (kHardwareF16) {
    const hn::Rebind<hwy::float16_t, DU> dh;
    const VU hw = hn::BitCast(DU(), hn::PromoteTo(DF(), hn::BitCast(dh, raw)));
    const MU snan = hn::And(hn::Eq(hn::And(h, K(0x7e00u)), K(0x7c00u)), hn::Ne(hn::And(h, K(0x1ffu)), K(0)));
    return hn::BitCast(DF(), hn::Xor(hw, hn::IfThenElseZero(snan, K(0x00400000u))));
  }
  return hn::BitCast(DF(), F16ToF32Bits(h));
}

// ---- rounding into the model copy (f32_to_bf16_rne, f32_to_f16_rne, ..._sr) ----

// f32_to_bf16_rne, lane-wise.
HWY_INLINE VU Bf16Rne(VU u) {
  const VU a = hn::And(u, K(0x7fffffffu));
  const VU lsb = hn::And(hn::ShiftRight<16>(u), K(1));
  const VU rne = hn::ShiftRight<16>(hn::Add(hn::Add(u, K(0x7fffu)), lsb));
  return hn::IfThenElse(GtS(a, 0x7f800000), hn::Or(hn::ShiftRight<16>(u), K(0x0040u)), rne);
}

// f32_to_f16_rne, lane-wise. The subnormal branch (q + up) is computed as
// (m + half - 1 + (q & 1)) >> shift, which equals q + (rem > half || (rem == half && q odd)).
HWY_INLINE VU F16Rne(VU u) {
  const VU sign = hn::And(hn::ShiftRight<16>(u), K(0x8000u));
  const VU a = hn::And(u, K(0x7fffffffu));
  const VU rebased = hn::Sub(a, K(112u << 23));
  const VU normal =
      hn::ShiftRight<13>(hn::Add(hn::Add(rebased, K(0xfffu)), hn::And(hn::ShiftRight<13>(rebased), K(1))));
  const VU e = hn::ShiftRight<23>(a);
  const VU shift = ClampShift(hn::Sub(K(126), e), 14, 24);
  const VU m = hn::Or(hn::And(a, K(0x7fffffu)), K(0x800000u));
  const VU half_minus_1 = hn::Sub(K(1) << hn::Sub(shift, K(1)), K(1));
  const VU q_odd = hn::And(m >> shift, K(1));
  const VU sub = hn::Add(hn::Add(m, half_minus_1), q_odd) >> shift;
  VU r = hn::IfThenElseZero(GtS(e, 101), sub);  // e < 102: below half the smallest subnormal
  r = hn::IfThenElse(GtS(a, 0x387fffff), normal, r);
  r = hn::IfThenElse(GtS(a, 0x477fefff), K(0x7c00u), r);
  r = hn::IfThenElse(GtS(a, 0x7f800000), hn::Or(K(0x7e00u), hn::And(hn::ShiftRight<13>(a), K(0x3ffu))), r);
  return hn::Or(r, sign);
}

// f32_to_bf16_sr, lane-wise.
HWY_INLINE VU Bf16Sr(VU u, VU rnd) {
  const VU a = hn::And(u, K(0x7fffffffu));
  const VU hi = hn::ShiftRight<16>(u);
  VU r = hn::ShiftRight<16>(hn::Add(u, hn::ShiftRight<16>(rnd)));
  r = hn::IfThenElse(hn::Eq(a, K(0x7f800000u)), hi, r);
  return hn::IfThenElse(GtS(a, 0x7f800000), hn::Or(hi, K(0x0040u)), r);
}

// f32_to_f16_sr, lane-wise. The subnormal branch's 64-bit sum (m << 32 >> shift) + r is kept as
// two 32-bit halves: upper = m >> shift, lower = the bits shifted out (m << (32 - shift) for
// shift < 32, m >> (shift - 32) for 32..55), and the carry of lower + r comes from the sign bits.
// It is computed only for vectors with a lane below the smallest normal fp16 (zeros included):
// about half the operations (round_model_copy fp16 stochastic on the dev VM, AVX3, in cache:
// 0.51 ns per element against 0.66), and every lane still gets the value of its branch, so the
// bits are the same whichever way a vector goes.
HWY_INLINE VU F16Sr(VU u, VU rnd) {
  const VU sign = hn::And(hn::ShiftRight<16>(u), K(0x8000u));
  const VU a = hn::And(u, K(0x7fffffffu));
  const VU normal = hn::ShiftRight<13>(hn::Add(hn::Sub(a, K(112u << 23)), hn::ShiftRight<19>(rnd)));
  const MU above_subnormal = GtS(a, 0x387fffff);
  VU r = normal;
  if (!hn::AllTrue(DU(), above_subnormal)) {
    const VU e = hn::ShiftRight<23>(a);
    const VU shift = hn::Sub(K(126), e);  // 14..126 where the subnormal branch is taken
    const VU m = hn::Or(hn::And(a, K(0x7fffffu)), K(0x800000u));
    const VU s1 = ClampShift(shift, 14, 31);
    const VU s2 = ClampShift(hn::Sub(shift, K(32)), 0, 31);
    const MU wide = GtS(shift, 31);
    const VU upper = hn::IfThenZeroElse(wide, m >> s1);
    const VU lower = hn::IfThenElse(wide, m >> s2, m << hn::Sub(K(32), s1));
    const VU sum = hn::Add(lower, rnd);
    const VU carry = hn::ShiftRight<31>(hn::Or(hn::And(lower, rnd), hn::AndNot(sum, hn::Or(lower, rnd))));
    const VU sub = hn::IfThenZeroElse(GtS(shift, 55), hn::Add(upper, carry));  // also float zeros/subnormals
    r = hn::IfThenElse(above_subnormal, normal, sub);
  }
  r = hn::IfThenElse(GtS(a, 0x477fffff), K(0x7c00u), r);
  r = hn::IfThenElse(GtS(a, 0x7f800000), hn::Or(K(0x7e00u), hn::And(hn::ShiftRight<13>(a), K(0x3ffu))), r);
  return hn::Or(r, sign);
}

// The full 32x32 -> 64 products a * k of every lane, as high and low halves: MulEven multiplies
// the even lanes; the odd lanes are moved down into even position first.
HWY_INLINE void MulWide(VU a, uint32_t k, VU* hi, VU* lo) {
  const DU du;
  const hn::Repartition<uint64_t, DU> d64;
  const VU kv = K(k);
  const auto even = hn::MulEven(a, kv);
  const auto odd = hn::MulEven(hn::BitCast(du, hn::ShiftRight<32>(hn::BitCast(d64, a))), kv);
  *hi = hn::OddEven(hn::BitCast(du, odd), hn::BitCast(du, hn::ShiftRight<32>(even)));
  *lo = hn::OddEven(hn::BitCast(du, hn::ShiftLeft<32>(odd)), hn::BitCast(du, even));
}

// math::philox4x32_10 on kV vectors of Lanes() counters each (c0 varies per lane, c1..c3 and
// the key are shared). The kV chains are independent and interleaved round by round, so one
// chain's multiply latency hides behind the other's work.
template <int kV>
HWY_INLINE void Philox(const VU* c0_in, uint32_t c1s, uint32_t c2s, uint32_t c3s, uint32_t k0, uint32_t k1,
                       VU (*out)[4]) {
  VU c0[kV], c1[kV], c2[kV], c3[kV];
  for (int v = 0; v < kV; ++v) {
    c0[v] = c0_in[v];
    c1[v] = K(c1s);
    c2[v] = K(c2s);
    c3[v] = K(c3s);
  }
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    for (int v = 0; v < kV; ++v) {
      VU hi0, lo0, hi1, lo1;
      MulWide(c0[v], 0xD2511F53u, &hi0, &lo0);
      MulWide(c2[v], 0xCD9E8D57u, &hi1, &lo1);
      c0[v] = hn::Xor(hn::Xor(hi1, c1[v]), K(k0));
      c1[v] = lo1;
      c2[v] = hn::Xor(hn::Xor(hi0, c3[v]), K(k1));
      c3[v] = lo0;
    }
  }
  for (int v = 0; v < kV; ++v) {
    out[v][0] = c0[v];
    out[v][1] = c1[v];
    out[v][2] = c2[v];
    out[v][3] = c3[v];
  }
}

// With F16C (kHardwareF16 above): vcvtps2ph with an immediate round-to-nearest-even (how
// Highway's DemoteTo calls it) is IEEE's conversion, whose bits are F16Rne's for every input,
// NaNs included (quieted, the top nine payload bits kept). Highway emulates DemoteTo on SSE4 and
// below by truncation, so those targets keep F16Rne. tests/cpu/test_model_copy_simd.cc compares
// every target with the scalar definition (ties, subnormals, overflow, NaN/Inf, random).
constexpr bool kHardwareF16Rne = kHardwareF16;

// The copy encodings of the masters x (16-bit lanes); rnd holds each lane's rounding word
// (stochastic rounding only).
template <Precision kPrecision, Rounding kRounding>
HWY_INLINE V16 RoundVec(hn::Vec<DF> x, VU rnd) {
  const D16 d16;
  if (kHardwareF16Rne && kPrecision == Precision::kFp16 && kRounding == Rounding::kNearest) {
    const hn::Rebind<hwy::float16_t, DU> dh;
    return hn::BitCast(d16, hn::DemoteTo(dh, x));
  }
  const VU u = hn::BitCast(DU(), x);
  VU r;
  if (kRounding == Rounding::kNearest) r = kPrecision == Precision::kBf16 ? Bf16Rne(u) : F16Rne(u);
  else r = kPrecision == Precision::kBf16 ? Bf16Sr(u, rnd) : F16Sr(u, rnd);
  // Every lane holds a 16-bit encoding, so the saturating demotion is exact.
  return hn::DemoteTo(d16, hn::BitCast(DI(), r));
}

// The rounding words of Philox pass output v (kB = 8 halves per counter lane, in element order:
// element 8b + h takes half h of block b, the low (h even) or high (h odd) 16 bits of word
// h / 2). Interleaving the four outputs puts the words in block order; read as 16-bit numbers
// (little-endian, as every Highway target), they are then in element order. `words` holds at
// least 4 * Lanes() words; after the call, RoundWord(words, j) is vector j's rounding word.
HWY_INLINE void StoreRoundWords(const VU (&v)[4], uint32_t* HWY_RESTRICT words) {
  hn::StoreInterleaved4(v[0], v[1], v[2], v[3], DU(), words);
}
HWY_INLINE VU RoundWord(const uint32_t* words, uint64_t j) {
  const uint16_t* halves = reinterpret_cast<const uint16_t*>(words);
  return hn::ShiftLeft<16>(hn::PromoteTo(DU(), hn::LoadU(D16(), halves + j * hn::Lanes(DU()))));  // r16 << 16
}

// Walks the elements [0, n) of one tensor piece whose element 0 has index `first` in its tensor,
// in the order the model copy's loops need: vec(i, rnd) for the full vectors at i with their
// rounding words rnd (zero for nearest), scalar(b, e) for the elements [b, e) left over (the
// caller computes their words, e.g. with SrWords). Stochastic rounding: scalar up to the first
// element of a Philox block, then 8 * Lanes() elements per Philox vector, kV vectors per pass
// (4 while they fit, then 1). Four interleaved chains measured 0.39 ns per stochastic element
// against 0.53 with one (AVX3; 0.44 against 0.49 with two on AVX2; nearest is 0.14-0.18), the
// chains' multiplies otherwise waiting on each other. A pass whose counter's low word would wrap
// goes to scalar(). Which elements take which path never changes a bit: both compute the
// scalar definition.
template <Rounding kRounding, class VecFn, class ScalarFn>
HWY_INLINE void ForEachCopyVector(uint64_t n, uint64_t first, uint64_t seed, uint64_t t, uint32_t param, VecFn&& vec,
                                  ScalarFn&& scalar) {
  const DU du;
  const uint64_t lanes = hn::Lanes(du);
  uint64_t i = 0;
  if (kRounding == Rounding::kNearest) {
    for (; i + lanes <= n; i += lanes) vec(i, K(0));
  } else {
    constexpr uint64_t kB = math::kSrBlockElements;
    const uint64_t to_block = (kB - first % kB) % kB;  // elements before the next multiple of 8
    const uint64_t head = to_block < n ? to_block : n;
    scalar(uint64_t{0}, head);
    i = head;
    HWY_ALIGN uint32_t words[HWY_MAX_BYTES];  // 4 words per lane: at least 4 * lanes
    auto pass = [&](auto kv_tag) {
      constexpr int kV = decltype(kv_tag)::value;
      const uint64_t width = kV * kB * lanes;
      const uint64_t block = (first + i) / kB;
      const uint32_t lo = static_cast<uint32_t>(block);
      if (lo > UINT32_MAX - (kV * lanes - 1)) {  // the counter's low word would wrap inside the pass
        scalar(i, i + width);
        i += width;
        return;
      }
      VU c0[kV], v[kV][4];
      for (int k = 0; k < kV; ++k) c0[k] = hn::Iota(du, lo + static_cast<uint32_t>(k * lanes));
      Philox<kV>(c0, static_cast<uint32_t>(block >> 32), param, static_cast<uint32_t>(t), static_cast<uint32_t>(seed),
                 static_cast<uint32_t>(seed >> 32), v);
      for (int k = 0; k < kV; ++k) {
        StoreRoundWords(v[k], words);
        const uint64_t base = i + static_cast<uint64_t>(k) * kB * lanes;
        for (uint64_t j = 0; j < kB; ++j) vec(base + j * lanes, RoundWord(words, j));
      }
      i += width;
    };
    while (i + 4 * kB * lanes <= n) pass(std::integral_constant<int, 4>());
    while (i + kB * lanes <= n) pass(std::integral_constant<int, 1>());
  }
  scalar(i, n);
}

}  // namespace half
#endif  // HWY_TARGET != HWY_SCALAR

// The stochastic-rounding words of the elements of one tensor (math::sr_random_word's bits),
// each Philox block drawn once for the (up to 8) elements that share it, so a head of a tensor
// whose index is off a multiple of 8 costs one call, not one per element. For the scalar heads
// and tails (and the HWY_SCALAR target).
struct SrWords {
  uint64_t seed, t;
  uint32_t param;
  math::Philox4x32 block{};
  uint64_t drawn = UINT64_MAX;  // the block number in `block`

  SrWords(uint64_t seed_in, uint64_t t_in, uint32_t param_in) : seed(seed_in), t(t_in), param(param_in) {}
  uint32_t operator()(uint64_t index) {
    if (index / math::kSrBlockElements != drawn) {
      drawn = index / math::kSrBlockElements;
      block = math::sr_random_block(seed, t, param, drawn);
    }
    return math::sr_block_word(block, static_cast<uint32_t>(index % math::kSrBlockElements));
  }
};
}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#endif  // RENAISSANCE_HALF_SIMD_INL_H_
