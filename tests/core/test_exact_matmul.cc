// The exact matrix product of Muon's orthogonalisation (renaissance/math/exact_matmul.h): the
// rounding of the fixed-point conversion, hand-computed products, the independence of the
// summation order, the longest sums, non-finite inputs, and an oracle written apart from the
// header (its own scales from std::ilogb, its own rounding through std::nearbyint, __int128 sums).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "renaissance/math/exact_matmul.h"

namespace renaissance {
namespace {

using math::exact_matmul_reference;
using math::fixed_point_shift;
using math::to_fixed_point;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

TEST(ExactMatmul, FixedPointRoundsHalfToEven) {
  EXPECT_EQ(to_fixed_point(0.5f, 0), 0);
  EXPECT_EQ(to_fixed_point(1.5f, 0), 2);
  EXPECT_EQ(to_fixed_point(2.5f, 0), 2);
  EXPECT_EQ(to_fixed_point(-0.5f, 0), 0);
  EXPECT_EQ(to_fixed_point(-1.5f, 0), -2);
  EXPECT_EQ(to_fixed_point(-2.5f, 0), -2);
  EXPECT_EQ(to_fixed_point(8191.5f, 0), 8192);
  EXPECT_EQ(to_fixed_point(0.49999997f, 0), 0);
  EXPECT_EQ(to_fixed_point(0.50000006f, 0), 1);
  EXPECT_EQ(to_fixed_point(3.0f, -1), 2);  // 1.5 -> 2
  EXPECT_EQ(to_fixed_point(5.0f, -1), 2);  // 2.5 -> 2
  // A subnormal scaled up: 2^-149 * 2^149 = 1.
  EXPECT_EQ(to_fixed_point(std::ldexp(1.0f, -149), 149), 1);
}

TEST(ExactMatmul, ShiftPutsTheLargestMagnitudeBelowTwoToThirteen) {
  EXPECT_EQ(fixed_point_shift(1.0f), 12);     // 1 * 2^12 = 4096
  EXPECT_EQ(fixed_point_shift(1.5f), 12);
  EXPECT_EQ(fixed_point_shift(2.0f), 11);
  EXPECT_EQ(fixed_point_shift(0.25f), 14);
  EXPECT_EQ(fixed_point_shift(std::ldexp(1.0f, -149)), 161);  // the smallest subnormal
  EXPECT_EQ(fixed_point_shift(0.0f), 0);
  // The largest magnitude below 2: q = 8192, the bound.
  EXPECT_EQ(to_fixed_point(1.99999988f, fixed_point_shift(1.99999988f)), 8192);
}

TEST(ExactMatmul, SmallProductEqualsTheHandComputedOne) {
  // Every element fits 13 bits at its scale, so the product is the exact one.
  const float a[] = {1.0f, 2.0f, 0.5f, -3.0f};    // 2 x 2
  const float b[] = {4.0f, 0.25f, -1.0f, 8.0f};   // 2 x 2
  float c[4];
  ASSERT_TRUE(exact_matmul_reference(a, b, c, 2, 2, 2));
  EXPECT_EQ(c[0], 2.0f);       // 1*4 + 2*(-1)
  EXPECT_EQ(c[1], 16.25f);     // 1*0.25 + 2*8
  EXPECT_EQ(c[2], 5.0f);       // 0.5*4 + (-3)(-1)
  EXPECT_EQ(c[3], -23.875f);   // 0.5*0.25 + (-3)*8
}

TEST(ExactMatmul, SmallElementsBesideALargeOneRoundAtTheRowScale) {
  // Row (1, 2^-14, 3 * 2^-14): shift 12, so 2^-14 -> 0.25 -> 0 and 3 * 2^-14 -> 0.75 -> 1.
  const float a[] = {1.0f, std::ldexp(1.0f, -14), 3.0f * std::ldexp(1.0f, -14)};
  const float b[] = {1.0f, 1.0f, 1.0f};  // a 3 x 1 column of ones (shift 12, q = 4096)
  float c;
  ASSERT_TRUE(exact_matmul_reference(a, b, &c, 1, 3, 1));
  EXPECT_EQ(c, 1.0f + std::ldexp(1.0f, -12));  // (4096 + 0 + 1) * 4096 * 2^-24
}

TEST(ExactMatmul, TheOrderOverKChangesNoBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t m = 5, k = 301, n = 4;
  std::vector<float> a(m * k), b(k * n), c1(m * n), c2(m * n);
  for (float& x : a) x = nd(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 40) - 20));
  for (float& x : b) x = nd(rng);
  ASSERT_TRUE(exact_matmul_reference(a.data(), b.data(), c1.data(), m, k, n));
  std::vector<size_t> perm(k);
  for (size_t p = 0; p < k; ++p) perm[p] = p;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<float> ap(m * k), bp(k * n);
  for (size_t p = 0; p < k; ++p) {
    for (size_t i = 0; i < m; ++i) ap[i * k + p] = a[i * k + perm[p]];
    for (size_t j = 0; j < n; ++j) bp[p * n + j] = b[perm[p] * n + j];
  }
  ASSERT_TRUE(exact_matmul_reference(ap.data(), bp.data(), c2.data(), m, k, n));
  for (size_t e = 0; e < m * n; ++e) EXPECT_EQ(bits(c1[e]), bits(c2[e])) << e;
  // The same sums in float, in the two orders, differ somewhere: the test can tell orders apart.
  size_t float_differs = 0;
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      float s1 = 0.0f, s2 = 0.0f;
      for (size_t p = 0; p < k; ++p) {
        s1 += a[i * k + p] * b[p * n + j];
        s2 += ap[i * k + p] * bp[p * n + j];
      }
      float_differs += bits(s1) != bits(s2);
    }
  }
  EXPECT_GT(float_differs, 0u);
}

TEST(ExactMatmul, LongestSumsWithWorstCaseDigitsAreExact) {
  // k > 131071 with every q at its bound 8192 (1.99999988 at shift 12): the sum 8192^2 * k
  // needs more than 32 bits; the result is (8192 * 8192 * k) * 2^-24 = 4k, exact in float.
  const size_t k = 131073;
  std::vector<float> a(k, 1.99999988f), b(k, 1.99999988f);
  float c = 0.0f;
  ASSERT_TRUE(exact_matmul_reference(a.data(), b.data(), &c, 1, k, 1));
  EXPECT_EQ(c, 4.0f * static_cast<float>(k));
  // Alternating signs cancel exactly, leaving one term: 8192 * 8192 * 2^-24 = 4.
  for (size_t p = 0; p < k; ++p) a[p] = (p % 2 == 0) ? 1.99999988f : -1.99999988f;
  ASSERT_TRUE(exact_matmul_reference(a.data(), b.data(), &c, 1, k, 1));
  EXPECT_EQ(c, 4.0f);
}

TEST(ExactMatmul, NonFiniteRowOrColumnGivesNaNThereOnly) {
  const float inf = std::numeric_limits<float>::infinity();
  const float a[] = {1.0f, 2.0f, inf, 1.0f};  // row 1 holds an inf
  const float b[] = {1.0f, std::nanf(""), 1.0f, 1.0f};  // column 1 holds a NaN
  float c[4];
  ASSERT_TRUE(exact_matmul_reference(a, b, c, 2, 2, 2));
  EXPECT_EQ(c[0], 3.0f);
  EXPECT_TRUE(std::isnan(c[1]));
  EXPECT_TRUE(std::isnan(c[2]));
  EXPECT_TRUE(std::isnan(c[3]));
}

TEST(ExactMatmul, RefusesAKTooLongForAnExactRounding) {
  float x = 0.0f;
  EXPECT_FALSE(exact_matmul_reference(&x, &x, &x, 1, math::kExactMatmulMaxK + 1, 1));
}

// An independent oracle of the definition: scales from std::ilogb, rounding through
// std::nearbyint in the default mode (ties to even), __int128 sums, long double scaling.
float oracle_element(const std::vector<float>& a, const std::vector<float>& b, size_t i, size_t j, size_t k,
                     size_t n) {
  float amax = 0.0f, bmax = 0.0f;
  for (size_t p = 0; p < k; ++p) {
    amax = std::max(amax, std::fabs(a[i * k + p]));
    bmax = std::max(bmax, std::fabs(b[p * n + j]));
  }
  const int sa = amax == 0.0f ? 0 : 12 - std::ilogb(amax);
  const int sb = bmax == 0.0f ? 0 : 12 - std::ilogb(bmax);
  __int128 sum = 0;
  for (size_t p = 0; p < k; ++p) {
    const long long qa = std::llrint(std::scalbln(static_cast<long double>(a[i * k + p]), sa));
    const long long qb = std::llrint(std::scalbln(static_cast<long double>(b[p * n + j]), sb));
    sum += static_cast<__int128>(qa) * qb;
  }
  return static_cast<float>(std::scalbln(static_cast<long double>(static_cast<long long>(sum)), -(sa + sb)));
}

TEST(ExactMatmul, AgreesWithAnIndependentOracle) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t m = 7, k = 129, n = 6;
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (size_t e = 0; e < a.size(); ++e) {
    // Mixed magnitudes (2^-130 .. 2^30, subnormals included), exact zeros and exact ties.
    const int scale = static_cast<int>(rng() % 160) - 130;
    a[e] = (e % 17 == 0) ? 0.0f : std::ldexp(nd(rng), scale);
  }
  for (size_t e = 0; e < b.size(); ++e) b[e] = (e % 13 == 0) ? 2.5f : nd(rng);
  for (size_t i = 0; i < 2; ++i) std::fill(a.begin() + i * k, a.begin() + (i + 1) * k, 0.0f);  // zero rows
  for (size_t p = 0; p < k; ++p) a[3 * k + p] = static_cast<float>(p % 5) - 2.0f;  // small integers
  // Row 4: 1 sets the scale 2^12; the rest are exact ties there ((2t + 1) / 2 units, both signs).
  a[4 * k] = 1.0f;
  for (size_t p = 1; p < k; ++p) {
    a[4 * k + p] = std::ldexp((static_cast<float>(p % 9) + 0.5f) * (p % 2 ? 1.0f : -1.0f), -12);
  }
  ASSERT_TRUE(exact_matmul_reference(a.data(), b.data(), c.data(), m, k, n));
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      EXPECT_EQ(bits(c[i * n + j]), bits(oracle_element(a, b, i, j, k, n))) << i << "," << j;
    }
  }
}

TEST(ExactMatmul, ErrorStaysWithinTheFixedPointBound) {
  // |c - ab| <= sum_p (|a||db| + |da||b| + |da||db|) + half an ulp of c, with |da| <= 2^-(sa+1)
  // and |db| <= 2^-(sb+1) (half a unit of the last fixed-point place); docs/math.md states it.
  std::mt19937 rng(3);
  std::normal_distribution<double> nd(0.0, 1.0);
  const size_t m = 6, k = 512, n = 5;
  std::vector<float> a(m * k), b(k * n), c(m * n);
  for (float& x : a) x = static_cast<float>(nd(rng));
  for (float& x : b) x = static_cast<float>(nd(rng) * 1e-3);
  ASSERT_TRUE(exact_matmul_reference(a.data(), b.data(), c.data(), m, k, n));
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      float amax = 0.0f, bmax = 0.0f;
      for (size_t p = 0; p < k; ++p) {
        amax = std::max(amax, std::fabs(a[i * k + p]));
        bmax = std::max(bmax, std::fabs(b[p * n + j]));
      }
      const double da = std::ldexp(1.0, std::ilogb(amax) - 13), db = std::ldexp(1.0, std::ilogb(bmax) - 13);
      double exact = 0.0, bound = 0.0;
      for (size_t p = 0; p < k; ++p) {
        exact += static_cast<double>(a[i * k + p]) * b[p * n + j];
        bound += std::fabs(a[i * k + p]) * db + da * std::fabs(b[p * n + j]) + da * db;
      }
      const float got = c[i * n + j];
      bound += std::ldexp(1.0, std::ilogb(got) - 24) + 1e-12 * std::fabs(exact);
      EXPECT_LE(std::fabs(got - exact), bound) << i << "," << j;
      EXPECT_GT(std::fabs(got - exact), 0.0) << "no rounding at all: the bound test is vacuous";
    }
  }
}

}  // namespace
}  // namespace renaissance
