// Independent oracles for bf16/fp16 rounding, shared by test_precision.cc and
// test_mixed_precision.cc: the formats decoded field by field in double, neighbours found by
// bisection over those decodings, and the rounding decided from exact distances in double.
// Nothing here uses math/precision.h's bit tricks.
#pragma once

#include <cmath>
#include <cstdint>

namespace renaissance {
namespace precision_oracle {

enum class Fmt { kBf16, kF16 };

// Field decoding of an encoding, in double: the independent definition of the formats.
inline double decode(Fmt fmt, uint16_t h) {
  const int exp_bits = fmt == Fmt::kBf16 ? 8 : 5, frac_bits = fmt == Fmt::kBf16 ? 7 : 10;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const bool neg = (h >> 15) != 0;
  const int exp = (h >> frac_bits) & ((1 << exp_bits) - 1);
  const int frac = h & ((1 << frac_bits) - 1);
  double v;
  if (exp == (1 << exp_bits) - 1) {
    v = frac == 0 ? INFINITY : NAN;
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(frac), 1 - bias - frac_bits);
  } else {
    v = std::ldexp(static_cast<double>(frac + (1 << frac_bits)), exp - bias - frac_bits);
  }
  return neg ? -v : v;
}

inline uint16_t largest_finite(Fmt fmt) { return fmt == Fmt::kBf16 ? 0x7f7f : 0x7bff; }
inline uint16_t inf_pattern(Fmt fmt) { return fmt == Fmt::kBf16 ? 0x7f80 : 0x7c00; }

// The neighbours of a finite magnitude x >= 0: lo = the largest encoding <= x, found by
// bisection over the positive encodings (monotone in the pattern); hi = lo + 1, whose value is
// the next one up, with the pattern of inf standing for the value just past the largest finite
// one (2^128 for bf16, 65536 for fp16: one ulp of the top binade further).
struct Neighbours {
  uint16_t lo;
  double lo_value, hi_value;
};
inline Neighbours neighbours(Fmt fmt, double x) {
  uint32_t a = 0, b = largest_finite(fmt);
  if (x >= decode(fmt, static_cast<uint16_t>(b))) {
    a = b;
  } else {
    while (b - a > 1) {  // invariant: value(a) <= x < value(b)
      const uint32_t mid = (a + b) / 2;
      (decode(fmt, static_cast<uint16_t>(mid)) <= x ? a : b) = mid;
    }
  }
  const double top = fmt == Fmt::kBf16 ? std::ldexp(1.0, 128) : 65536.0;
  const double hi = a == largest_finite(fmt) ? top : decode(fmt, static_cast<uint16_t>(a + 1));
  return {static_cast<uint16_t>(a), decode(fmt, static_cast<uint16_t>(a)), hi};
}

// Round to nearest, ties to even, decided from exact distances in double.
inline uint16_t oracle_rne(Fmt fmt, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(static_cast<double>(x));
  if (std::isinf(ax)) return sign | inf_pattern(fmt);
  const Neighbours n = neighbours(fmt, ax);
  const double below = ax - n.lo_value, above = n.hi_value - ax;  // exact: same scale
  uint16_t mag = n.lo;
  if (above < below || (above == below && (n.lo & 1) != 0)) mag = static_cast<uint16_t>(n.lo + 1);
  return sign | mag;
}

// Stochastic rounding as docs/math.md defines it: up iff floor(frac * 2^32) + r >= 2^32 with
// frac = (|x| - lo) / ulp; |x| >= 65536 is inf for fp16.
inline uint16_t oracle_sr(Fmt fmt, float x, uint32_t r) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(static_cast<double>(x));
  if (std::isinf(ax) || (fmt == Fmt::kF16 && ax >= 65536.0)) return sign | inf_pattern(fmt);
  const Neighbours n = neighbours(fmt, ax);
  const double frac = (ax - n.lo_value) / (n.hi_value - n.lo_value);  // ulp is a power of 2
  const uint64_t fixed = static_cast<uint64_t>(std::floor(std::ldexp(frac, 32)));
  const bool up = fixed + r >= (uint64_t{1} << 32);
  return sign | static_cast<uint16_t>(n.lo + (up ? 1 : 0));
}

}  // namespace precision_oracle
}  // namespace renaissance
