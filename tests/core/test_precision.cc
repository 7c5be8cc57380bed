// math/precision.h against oracles that do not share its bit tricks: widening is checked
// exhaustively (all 2^16 bf16 and fp16 encodings) against a decoding of the fields with ldexp;
// narrowing (nearest-even and stochastic) against neighbours found by bisection over the
// exhaustively checked widening and a decision taken in double arithmetic (every distance there
// is exact); Philox-4x32-10 against the Random123 known-answer vectors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <tuple>

#include "renaissance/error.h"
#include "renaissance/graph.h"
#include "renaissance/math/precision.h"
#include "renaissance/precision.h"
#include "support/precision_oracle.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using math::bf16_to_f32;
using math::f16_to_f32;
using testing_util::float_bits;

using namespace precision_oracle;  // NOLINT: Fmt, decode, neighbours, oracle_rne, oracle_sr

float widen(Fmt fmt, uint16_t h) { return fmt == Fmt::kBf16 ? bf16_to_f32(h) : f16_to_f32(h); }

void check_widening(Fmt fmt) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float got = widen(fmt, static_cast<uint16_t>(h));
    const double want = decode(fmt, static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h >> 15) != 0) << std::hex << h;
    } else {
      // The double value is a float value: the conversion is exact, compare the bits (±0 too).
      ASSERT_EQ(float_bits(got), float_bits(static_cast<float>(want))) << std::hex << h;
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
    }
  }
}

TEST(Precision, WideningBf16IsExactForAll65536Encodings) { check_widening(Fmt::kBf16); }
TEST(Precision, WideningF16IsExactForAll65536Encodings) { check_widening(Fmt::kF16); }

uint16_t narrow_rne(Fmt fmt, float x) {
  return fmt == Fmt::kBf16 ? math::f32_to_bf16_rne(x) : math::f32_to_f16_rne(x);
}
uint16_t narrow_sr(Fmt fmt, float x, uint32_t r) {
  return fmt == Fmt::kBf16 ? math::f32_to_bf16_sr(x, r) : math::f32_to_f16_sr(x, r);
}

// Floats at and around every representable target value and every midpoint: for each positive
// finite pattern p, value(p), the exact midpoint of p and p+1 (a tie; it is a float since the
// targets have fewer fraction bits than float32), and the floats one step either side of both.
template <class F>
void for_each_edge_float(Fmt fmt, F&& f) {
  for (uint32_t p = 0; p <= largest_finite(fmt); ++p) {
    const double lo = decode(fmt, static_cast<uint16_t>(p));
    const double hi = p == largest_finite(fmt) ? (fmt == Fmt::kBf16 ? std::ldexp(1.0, 128) : 65536.0)
                                               : decode(fmt, static_cast<uint16_t>(p + 1));
    const double mid = (lo + hi) / 2;
    ASSERT_EQ(static_cast<double>(static_cast<float>(mid)), mid) << "the tie must be a float";
    for (double base : {lo, mid}) {
      const float c = static_cast<float>(base);
      for (float x : {c, std::nextafter(c, 0.0f), std::nextafter(c, INFINITY)}) {
        f(x);
        f(-x);
      }
    }
  }
}

void check_rne(Fmt fmt) {
  for_each_edge_float(fmt, [&](float x) {
    ASSERT_EQ(narrow_rne(fmt, x), oracle_rne(fmt, x)) << std::hexfloat << x;
  });
  // Explicit ties, compared with the even neighbour written out: 1 + half an ulp goes down to 1,
  // 1 + 3 half-ulps goes up to 1 + 2 ulps.
  const double ulp1 = fmt == Fmt::kBf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  const uint16_t one = fmt == Fmt::kBf16 ? 0x3f80 : 0x3c00;
  EXPECT_EQ(narrow_rne(fmt, static_cast<float>(1.0 + ulp1 / 2)), one);
  EXPECT_EQ(narrow_rne(fmt, static_cast<float>(1.0 + 3 * ulp1 / 2)), one + 2);
  EXPECT_EQ(narrow_rne(fmt, static_cast<float>(-(1.0 + 3 * ulp1 / 2))), 0x8000 | (one + 2));
  std::mt19937 rng(14);
  for (int i = 0; i < 300000; ++i) {
    const float x = math::f32_from_bits(static_cast<uint32_t>(rng()));
    if (std::isnan(x)) continue;
    ASSERT_EQ(narrow_rne(fmt, x), oracle_rne(fmt, x)) << std::hexfloat << x;
  }
}

TEST(Precision, Bf16NearestEvenMatchesOracleAtEveryTieAndEdge) { check_rne(Fmt::kBf16); }
TEST(Precision, F16NearestEvenMatchesOracleAtEveryTieAndEdge) { check_rne(Fmt::kF16); }

TEST(Precision, F16OverflowSubnormalAndSpecialEdges) {
  using math::f32_to_f16_rne;
  EXPECT_EQ(f32_to_f16_rne(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16_rne(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // just below the tie
  EXPECT_EQ(f32_to_f16_rne(65520.0f), 0x7c00);                        // tie -> even = inf
  EXPECT_EQ(f32_to_f16_rne(-1e9f), 0xfc00);
  EXPECT_EQ(f32_to_f16_rne(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16_rne(std::ldexp(1.0f, -25)), 0x0000);  // tie with 0: even
  EXPECT_EQ(f32_to_f16_rne(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16_rne(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 subnormal ulps: tie -> 2
  EXPECT_EQ(f32_to_f16_rne(-std::ldexp(1.0f, -30)), 0x8000);  // signed zero
  EXPECT_EQ(f32_to_f16_rne(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);  // to the smallest normal
  EXPECT_EQ(f32_to_f16_rne(std::numeric_limits<float>::denorm_min()), 0x0000);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float x : {nan, -nan, math::f32_from_bits(0x7f800001u), math::f32_from_bits(0xff800001u)}) {
    EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16_rne(x))));
    EXPECT_EQ(f32_to_f16_rne(x) & 0x8000, (float_bits(x) >> 31) << 15);
    EXPECT_TRUE(std::isnan(bf16_to_f32(math::f32_to_bf16_rne(x))));  // a signalling NaN with
    EXPECT_TRUE(std::isnan(f16_to_f32(math::f32_to_f16_sr(x, 0xffffffffu))));  // low payload too
    EXPECT_TRUE(std::isnan(bf16_to_f32(math::f32_to_bf16_sr(x, 0xffffffffu))));
  }
  EXPECT_EQ(math::f32_to_bf16_rne(INFINITY), 0x7f80);
  EXPECT_EQ(math::f32_to_bf16_rne(std::numeric_limits<float>::max()), 0x7f80);  // IEEE overflow
  EXPECT_EQ(math::f32_to_bf16_sr(-INFINITY, 0xffffffffu), 0xff80);
  EXPECT_EQ(math::f32_to_f16_sr(INFINITY, 0), 0x7c00);
}

void check_sr(Fmt fmt) {
  std::mt19937 rng(1414);
  for_each_edge_float(fmt, [&](float x) {
    for (uint32_t r : {0u, 0xffffffffu, 0x80000000u, 0x7fffffffu, static_cast<uint32_t>(rng())}) {
      ASSERT_EQ(narrow_sr(fmt, x, r), oracle_sr(fmt, x, r)) << std::hexfloat << x << " r=" << r;
    }
  });
  for (int i = 0; i < 300000; ++i) {
    const float x = math::f32_from_bits(static_cast<uint32_t>(rng()));
    if (std::isnan(x)) continue;
    const uint32_t r = static_cast<uint32_t>(rng());
    ASSERT_EQ(narrow_sr(fmt, x, r), oracle_sr(fmt, x, r)) << std::hexfloat << x << " r=" << r;
  }
  // Magnitudes deep in the fp16 subnormal range, where the fixed point keeps 32 bits.
  for (int e = -60; e < -14; ++e) {
    const float x = std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024.0f, e);
    // r = 2^32 - 1 rounds up any nonzero fixed point: the truncation point shows.
    for (uint32_t r : {static_cast<uint32_t>(rng()), 0xffffffffu, 0u}) {
      ASSERT_EQ(narrow_sr(fmt, x, r), oracle_sr(fmt, x, r)) << std::hexfloat << x << " r=" << r;
    }
  }
}

TEST(Precision, Bf16StochasticMatchesOracle) { check_sr(Fmt::kBf16); }
TEST(Precision, F16StochasticMatchesOracle) { check_sr(Fmt::kF16); }

// A quarter of the way from 1 to the next bf16: r uniform over a grid of 2^16 words sends it
// up exactly a quarter of the time (the probability is exact, not approximate).
TEST(Precision, StochasticProbabilityIsExact) {
  const float x = static_cast<float>(1.0 + std::ldexp(1.0, -7) / 4);
  int up = 0;
  for (uint32_t k = 0; k < 65536; ++k) up += math::f32_to_bf16_sr(x, k << 16) == 0x3f81;
  EXPECT_EQ(up, 16384);
  const float y = static_cast<float>(1.0 + 3 * std::ldexp(1.0, -10) / 8);  // fp16: 3/8 ulp
  up = 0;
  for (uint32_t k = 0; k < 8192; ++k) up += math::f32_to_f16_sr(y, k << 19) == 0x3c01;
  EXPECT_EQ(up, 3072);
}

// Known-answer vectors of the Random123 distribution (kat_vectors: counter words, key words,
// expected output), for Philox-4x32 with 10 rounds.
TEST(Precision, Philox4x32x10KnownAnswers) {
  struct Kat {
    uint32_t c[4], k[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& kat : kats) {
    const math::Philox4x32 got = math::philox4x32_10(kat.c[0], kat.c[1], kat.c[2], kat.c[3], kat.k[0], kat.k[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.v[i], kat.out[i]) << "word " << i;
  }
}

// The key layout of docs/math.md: counter (index/8 low, index/8 high, param, t), key (seed low,
// seed high), 16-bit half index%8 (half 2 = low 16 bits of word 1), handed to the rounding as
// r16 << 16; every component of the key changes the word.
TEST(Precision, StochasticRoundingKey) {
  const uint64_t seed = 0x0123456789abcdefULL, index = (uint64_t{5} << 35) + 8 * 77 + 2;
  const math::Philox4x32 block = math::philox4x32_10(77 + 0u, 5u, 9u, 3u, 0x89abcdefu, 0x01234567u);
  EXPECT_EQ(math::sr_random_word(seed, 3, 9, index), block.v[1] << 16);
  const uint32_t w = math::sr_random_word(seed, 3, 9, index);
  EXPECT_NE(math::sr_random_word(seed, 4, 9, index), w);
  EXPECT_NE(math::sr_random_word(seed, 3, 10, index), w);
  EXPECT_NE(math::sr_random_word(seed, 3, 9, index + 1), w);
  EXPECT_NE(math::sr_random_word(seed, 3, 9, index + 8), w);
  EXPECT_NE(math::sr_random_word(seed ^ (uint64_t{1} << 40), 3, 9, index), w);
}

// One Philox call serves eight elements: element 8b + h draws half h of block b's output (word
// h/2, its low 16 bits for even h, its high 16 bits for odd h), so the eight elements of an
// octet take eight different halves of one call, and element 8(b+1) starts the next counter.
// Only the top 16 bits of the rounding word are ever set.
TEST(Precision, StochasticRoundingDrawsHalvesOfOneCallPerOctet) {
  const uint64_t seed = 0xfeedface12345678ULL, t = 0x1234567890ULL;  // t: only its low 32 bits count
  const uint32_t param = 41;
  for (uint64_t b : {uint64_t{0}, uint64_t{3}, uint64_t{0xffffffffu}, (uint64_t{7} << 32) + 9}) {
    const math::Philox4x32 out = math::philox4x32_10(static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32),
                                                     param, 0x34567890u, 0x12345678u, 0xfeedfaceu);
    const math::Philox4x32 next = math::philox4x32_10(static_cast<uint32_t>(b + 1),
                                                      static_cast<uint32_t>((b + 1) >> 32), param, 0x34567890u,
                                                      0x12345678u, 0xfeedfaceu);
    const uint32_t halves[8] = {out.v[0] & 0xffffu, out.v[0] >> 16, out.v[1] & 0xffffu, out.v[1] >> 16,
                                out.v[2] & 0xffffu, out.v[2] >> 16, out.v[3] & 0xffffu, out.v[3] >> 16};
    for (uint32_t h = 0; h < 8; ++h) {
      const uint32_t r = math::sr_random_word(seed, t, param, 8 * b + h);
      EXPECT_EQ(r, halves[h] << 16) << "block " << b << " half " << h;
      EXPECT_EQ(r & 0xffffu, 0u);
    }
    // Element 8(b+1) uses the next counter's low half of word 0, not a half of this call.
    EXPECT_EQ(math::sr_random_word(seed, t, param, 8 * b + 8), (next.v[0] & 0xffffu) << 16);
    // The eight halves are eight different draws (true of these blocks; a repeat would mean two
    // elements share a half).
    for (uint32_t h = 0; h < 8; ++h) {
      for (uint32_t k = h + 1; k < 8; ++k) EXPECT_NE(halves[h], halves[k]) << h << " " << k;
    }
  }
  // bf16 adds r16 itself: a master 1 + 0x7fff / 2^23 (just under halfway) rounds up exactly when
  // r16 >= 0x8001, i.e. decided by the draw's 16 bits.
  const float x = math::f32_from_bits(0x3f807fffu);
  EXPECT_EQ(math::f32_to_bf16_sr(x, 0x80010000u), 0x3f81);
  EXPECT_EQ(math::f32_to_bf16_sr(x, 0x80000000u), 0x3f80);
  // fp16 normal adds r16 >> 3: 1 + 1/2^11 (exactly 1/2 ulp, 0x1000 below the fp16 ulp of 2^13)
  // rounds up exactly when r16 >> 3 >= 0x1000, i.e. r16 >= 0x8000.
  const float y = math::f32_from_bits(0x3f801000u);
  EXPECT_EQ(math::f32_to_f16_sr(y, 0x80000000u), 0x3c01);
  EXPECT_EQ(math::f32_to_f16_sr(y, 0x7fff0000u), 0x3c00);
}

// The rule of which (G encoding, copy format, rounding) combinations exist, against the list a
// task's options can make, written out: no copy (nearest) with fp32 gradients; a bf16 or fp16 copy
// rounded either way with fp32 gradients or gradients in the copy's own format.
TEST(PrecisionCombination, ValidExactlyForTheCombinationsATaskCanMake) {
  using P = Precision;
  using R = Rounding;
  const std::set<std::tuple<P, P, R>> valid = {
      {P::kFp32, P::kFp32, R::kNearest},    {P::kFp32, P::kBf16, R::kNearest}, {P::kFp32, P::kBf16, R::kStochastic},
      {P::kFp32, P::kFp16, R::kNearest},    {P::kFp32, P::kFp16, R::kStochastic}, {P::kBf16, P::kBf16, R::kNearest},
      {P::kBf16, P::kBf16, R::kStochastic}, {P::kFp16, P::kFp16, R::kNearest}, {P::kFp16, P::kFp16, R::kStochastic}};
  int count = 0;
  for (P g : {P::kFp32, P::kBf16, P::kFp16}) {
    for (P c : {P::kFp32, P::kBf16, P::kFp16}) {
      for (R r : {R::kNearest, R::kStochastic}) {
        const bool want = valid.count({g, c, r}) != 0;
        EXPECT_EQ(precision_combination_valid(g, c, r), want)
            << "grad " << precision_name(g) << " copy " << precision_name(c) << " " << rounding_name(r);
        count += want ? 1 : 0;
      }
    }
  }
  EXPECT_EQ(count, 9);
  PrecisionOptions o;
  EXPECT_EQ(gradient_precision(o), P::kFp32);
  o.precision = P::kFp16;
  EXPECT_EQ(gradient_precision(o), P::kFp32);
  o.model_dtype_gradients = true;
  EXPECT_EQ(gradient_precision(o), P::kFp16);
}

// The step compiler applies the same rule: stochastic rounding without a model copy is refused
// there too, not only by Task::compile (a plan and options made by hand reach it directly).
TEST(PrecisionCombination, TheStepCompilerRefusesStochasticRoundingWithoutACopy) {
  const std::vector<ParamSpec> params = {{"w", {8, 8}, Role::kDeepConv}, {"b", {8}, Role::kBnBias}};
  const MemoryPlan plan(params, plan_config_from_optimizer(OptimizerKind::kAdamW));
  const OptimizerConfig config = default_config(OptimizerKind::kAdamW);
  EXPECT_NO_THROW(compile_step(plan, config, true, PrecisionOptions{}));
  PrecisionOptions stochastic;
  stochastic.rounding = Rounding::kStochastic;
  try {
    compile_step(plan, config, true, stochastic);
    FAIL() << "compile_step accepted fp32 with stochastic rounding";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("stochastic rounding needs a bf16 or fp16 model copy"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace renaissance
