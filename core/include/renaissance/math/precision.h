// Mixed precision, written once for both backends (docs/math.md, "Mixed precision"):
// fp32 -> bf16 / fp16 rounding (to nearest even, or stochastic), their exact widening to fp32,
// and the Philox-4x32-10 counter-based generator that keys stochastic rounding.
// encoded_to_f32, f32_to_encoded_rne / _sr, load_encoding / store_encoding: the codec of each
// Precision, chosen in one place for every backend.
// Everything is integer bit manipulation on the IEEE encodings (no float arithmetic, hence no
// FMA, flush-to-zero or rounding-mode question), so every backend, SIMD target and compiler
// computes the same bits. Vector kernels may reimplement a function here lane-wise, but the
// tests compare them with these scalar definitions.
#pragma once

#include <cstdint>
#include <cstring>

#include "renaissance/math/host_device.h"
#include "renaissance/precision.h"

namespace renaissance {
namespace math {

RN_HD uint32_t f32_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
RN_HD float f32_from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// ---- Widening: every bf16 / fp16 value is exactly a float32 value. -------------------------

// bf16 is the upper half of a float32: widening appends 16 zero bits (NaN payloads kept).
RN_HD float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// fp16: 1 sign, 5 exponent (bias 15), 10 fraction bits. Normal numbers re-bias the exponent;
// subnormals (exponent 0) are normalised by shifting the fraction up to its leading one.
RN_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t frac = h & 0x3ffu;
  if (exp == 0x1fu) return f32_from_bits(sign | 0x7f800000u | (frac << 13));  // inf, NaN
  if (exp == 0) {
    if (frac == 0) return f32_from_bits(sign);  // ±0
    exp = 1;                                     // subnormal: value frac * 2^-24
    while ((frac & 0x400u) == 0) {
      frac <<= 1;
      --exp;
    }
    frac &= 0x3ffu;
    // exp is now 1 - (shifts); the float exponent of 2^(exp - 15) is exp - 15 + 127.
    return f32_from_bits(sign | ((exp + 112u) << 23) | (frac << 13));
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (frac << 13));
}

// ---- Narrowing. -----------------------------------------------------------------------------
//
// Both roundings work on the magnitude's bit pattern (sign-magnitude encodings round the
// magnitude; the sign is copied). A NaN stays a NaN: the sign and the top fraction bits are
// kept and the quiet bit is set, so a NaN never turns into an infinity. An infinity stays one.

// Round to nearest, ties to even. Adding 0x7fff plus the lowest kept bit to the pattern and
// truncating is exact RNE; a carry out of the fraction increments the exponent, which is the
// correct next binade, and past the largest finite bf16 it yields 0x7f80 = inf (IEEE overflow).
RN_HD uint16_t f32_to_bf16_rne(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// fp16 largest finite value 65504 = 0x7bff. Halfway to 65536 is 65520 (0x477ff000): the tie
// goes to the even neighbour, 65536, which is inf; so every |x| >= 65520 becomes ±inf.
RN_HD uint16_t f32_to_f16_rne(float x) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);             // overflow, inf
  if (a >= 0x38800000u) {  // |x| >= 2^-14: a normal fp16 (or 65504 after a carry)
    const uint32_t rebased = a - (112u << 23);
    return static_cast<uint16_t>(sign | ((rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13));
  }
  // Subnormal fp16 (or zero): the result is |x| / 2^-24 rounded to an integer. With the implicit
  // bit m = 1.f * 2^23 and biased exponent e, |x| / 2^-24 = m / 2^(126 - e).
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // |x| < 2^-25 (shift > 24): below half the smallest subnormal -> 0
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  const uint32_t up = (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(sign | (q + up));  // q + up == 0x400 is the smallest normal
}

// Stochastic rounding with a 32-bit uniform random word r. Definition (the same for both
// formats): write |x| in fixed point with the target format's last fraction bit at bit 32,
// truncate what lies below bit 0, add r, and keep the bits from 32 up. |x| thus rounds away
// from zero with probability (the truncated distance to the lower neighbour) / ulp, exactly for
// every float32 input except where |x| has bits below 2^-32 of the target's ulp (only fp16
// subnormal results; those bits, below 2^-56, are dropped). Where only k < 32 bits of |x| lie below the target's last bit (16 for bf16, 13
// for normal fp16) the sum carries exactly when (r >> (32 - k)) + those bits reaches 2^k, so
// only the top k bits of r matter; that is how it is computed. The next value above the
// largest finite one is inf: |x| beyond it may round to inf, with that probability.
// The 2-byte format chosen at run time (bf16 when `bf16`, else fp16): exact widening and
// round-to-nearest-even, the one place that picks between the two definitions above.
RN_HD float half_to_f32(bool bf16, uint16_t h) { return bf16 ? bf16_to_f32(h) : f16_to_f32(h); }
RN_HD uint16_t f32_to_half_rne(bool bf16, float x) { return bf16 ? f32_to_bf16_rne(x) : f32_to_f16_rne(x); }

RN_HD uint16_t f32_to_bf16_sr(float x, uint32_t r) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  if ((u & 0x7fffffffu) == 0x7f800000u) return static_cast<uint16_t>(u >> 16);
  return static_cast<uint16_t>((u + (r >> 16)) >> 16);
}

RN_HD uint16_t f32_to_f16_sr(float x, uint32_t r) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // |x| >= 65536: inf
  if (a >= 0x38800000u) {  // normal range: 13 bits below the fp16 ulp; a carry may reach inf
    const uint32_t rebased = a - (112u << 23);
    return static_cast<uint16_t>(sign | ((rebased + (r >> 19)) >> 13));
  }
  // Subnormal range: |x| / 2^-24 = m / 2^shift, as a 32.32 fixed-point number, truncated.
  const uint32_t e = a >> 23;
  if (e == 0) return sign;  // float zero or subnormal (< 2^-126): its fixed point is 0
  const uint32_t shift = 126u - e;  // 14..125
  if (shift >= 56) return sign;     // m < 2^24: nothing is left at or above bit 0
  const uint64_t m = (a & 0x7fffffu) | 0x800000u;
  const uint64_t fixed = (m << 32) >> shift;
  return static_cast<uint16_t>(sign | static_cast<uint32_t>((fixed + r) >> 32));
}

// ---- The encodings by Precision, the one place that maps a Precision to its codec. ----------
//
// Every encoding (bf16, fp16, ...; never fp32) travels as a uint16_t holding its bits, a 1-byte
// one in the low byte; in memory it takes encoding_bytes(p) bytes. Each backend's access layer
// calls these (its vector paths restate them for the formats they vectorise), so a new encoding
// is its functions above, its codec and one case in with_codec and in encoding_bytes below.

// Bytes of one encoding in memory: precision.h's bytes column, usable in device code.
RN_HD constexpr uint32_t encoding_bytes(Precision p) {
  switch (p) {
    case Precision::kFp32: return 4;
    case Precision::kBf16: return 2;
    case Precision::kFp16: return 2;
  }
  return 0;
}
// Each encoding's codec: its exact widening and its two roundings. with_codec is the one switch
// over the encodings: it calls f with p's codec (fp32 has none: f is not called, and R{} returns).
struct Bf16Codec {
  RN_HD static float widen(uint16_t e) { return bf16_to_f32(e); }
  RN_HD static uint16_t round_rne(float x) { return f32_to_bf16_rne(x); }
  RN_HD static uint16_t round_sr(float x, uint32_t r) { return f32_to_bf16_sr(x, r); }
};
struct Fp16Codec {
  RN_HD static float widen(uint16_t e) { return f16_to_f32(e); }
  RN_HD static uint16_t round_rne(float x) { return f32_to_f16_rne(x); }
  RN_HD static uint16_t round_sr(float x, uint32_t r) { return f32_to_f16_sr(x, r); }
};
template <class R, class F>
RN_HD R with_codec(Precision p, F f) {
  switch (p) {
    case Precision::kBf16: return f(Bf16Codec{});
    case Precision::kFp16: return f(Fp16Codec{});
    case Precision::kFp32: break;
  }
  return R{};
}

RN_HD float encoded_to_f32(Precision p, uint16_t e) {
  return with_codec<float>(p, [e](auto codec) { return codec.widen(e); });
}
RN_HD uint16_t f32_to_encoded_rne(Precision p, float x) {
  return with_codec<uint16_t>(p, [x](auto codec) { return codec.round_rne(x); });
}
RN_HD uint16_t f32_to_encoded_sr(Precision p, float x, uint32_t r) {
  return with_codec<uint16_t>(p, [x, r](auto codec) { return codec.round_sr(x, r); });
}

// Encoding i of memory at `base` holding encodings of p, in and out (unaligned access allowed).
RN_HD uint16_t load_encoding(Precision p, const void* base, uint64_t i) {
  const char* at = static_cast<const char*>(base) + i * encoding_bytes(p);
  if (encoding_bytes(p) == 1) return static_cast<uint8_t>(*at);
  uint16_t e;
  std::memcpy(&e, at, sizeof e);
  return e;
}
RN_HD void store_encoding(Precision p, void* base, uint64_t i, uint16_t e) {
  char* at = static_cast<char*>(base) + i * encoding_bytes(p);
  if (encoding_bytes(p) == 1) {
    *at = static_cast<char>(e);
  } else {
    std::memcpy(at, &e, sizeof e);
  }
}
namespace encoding_check {
constexpr bool bytes_match_the_table() {
  for (const PrecisionRow& row : kPrecisionRows) {
    if (encoding_bytes(row.value) != row.bytes) return false;
  }
  return true;
}
}  // namespace encoding_check
static_assert(encoding_check::bytes_match_the_table(), "encoding_bytes must give precision.h's bytes column");

// ---- Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2,
// 3", SC11), from the paper's definition: ten rounds of a Feistel-like network on a 128-bit
// counter under a 64-bit key, the key bumped by the Weyl constants between rounds. ------------

struct Philox4x32 {
  uint32_t v[4];
};

RN_HD Philox4x32 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                               uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // the round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // the key schedule's Weyl constants
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// The random draw of element `index` of parameter `param` at applied step `t` (the step being
// applied, 1 for the first) under `seed` is a 16-bit number r16: one Philox call serves eight
// consecutive elements of a tensor. Key = (seed low 32 bits, seed high 32 bits); counter =
// (index / 8 low 32 bits, index / 8 high 32 bits, param, t low 32 bits); r16 is half index % 8
// of the 128-bit output, half h being the low (h even) or high (h odd) 16 bits of word h / 2.
// Keyed by the tensor's own element index, never an arena offset, so layouts, groups, chunks,
// launch shapes and shards all draw the same bits. The rounding functions above take a 32-bit
// word r; the draw hands them r = r16 << 16, so bf16 adds r16 itself, normal fp16 its top 13
// bits (r16 >> 3) and fp16 subnormal results resolve probabilities to 2^-16.
constexpr uint64_t kSrBlockElements = 8;  // elements per Philox call

// The Philox output of elements 8*block .. 8*block+7 (a caller walking a tensor in order draws
// each block once).
RN_HD Philox4x32 sr_random_block(uint64_t seed, uint64_t t, uint32_t param, uint64_t block) {
  return philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), param,
                       static_cast<uint32_t>(t), static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}
// Output word j (0..3) of a block, selected with comparisons, not by indexing the array with a
// variable (which would put the block in local memory on a GPU).
RN_HD uint32_t sr_block_output(const Philox4x32& b, uint32_t j) {
  return j == 0 ? b.v[0] : j == 1 ? b.v[1] : j == 2 ? b.v[2] : b.v[3];
}
// The rounding word (r16 << 16) of half h (0..7) of a block whose output word h / 2 is w.
RN_HD uint32_t sr_half_word(uint32_t w, uint32_t h) { return (h & 1u) ? (w & 0xffff0000u) : (w << 16); }
// Half h (0..7) of a block, as a rounding word.
RN_HD uint32_t sr_block_word(const Philox4x32& b, uint32_t h) {
  return sr_half_word(sr_block_output(b, (h >> 1) & 3u), h);
}
// The rounding word r16 << 16 of element `index`.
RN_HD uint32_t sr_random_word(uint64_t seed, uint64_t t, uint32_t param, uint64_t index) {
  return sr_block_word(sr_random_block(seed, t, param, index / kSrBlockElements),
                       static_cast<uint32_t>(index % kSrBlockElements));
}

}  // namespace math
}  // namespace renaissance
