// The CPU's fast exact product and Newton–Schulz (backend_cpu/exact_matmul_cpu.h) against the host
// references of renaissance/math (exact_matmul_reference, newton_schulz_reference), bit for bit:
// every Highway target the build compiled, both product units (the SIMD lanes and, where the CPU
// has it, the AMX tile unit), 1 and 2 threads, odd shapes and k tails, empty dimensions,
// non-finite rows and columns, subnormals, and sums over k > 131071 with worst-case digits that
// overflow int32 unless the kernels move their sums to int64 in time.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend_cpu/exact_matmul_cpu.h"
#include "renaissance/math/exact_matmul.h"
#include "renaissance/math/newton_schulz.h"
#include "support/simd_targets.h"

namespace renaissance {
namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// How many elements of got differ in their bits from want (the first few reported).
int count_differences(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  int bad = 0;
  for (size_t e = 0; e < want.size(); ++e) {
    if (bits(got[e]) != bits(want[e]) && ++bad <= 3) {
      ADD_FAILURE() << what << ": element " << e << " is " << got[e] << " (0x" << std::hex << bits(got[e])
                    << "), the reference " << want[e] << " (0x" << bits(want[e]) << ")";
    }
  }
  return bad;
}

// Normal values with magnitudes spread over 2^-30..2^30 per row and element, a few exact zeros.
std::vector<float> spread(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(count);
  for (float& v : x) {
    v = rng() % 17 == 0 ? 0.0f : nd(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 61) - 30));
  }
  return x;
}

// Runs fn once per Highway target the build compiled, with dispatch pinned to it.
template <class Fn>
std::string for_each_target(Fn&& fn) {
  std::ostringstream names;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const testing_util::OnlySimdTarget only(target);
    EXPECT_EQ(std::string(cpu::exact_matmul_target()), hwy::TargetName(target));
    fn(hwy::TargetName(target));
    names << (names.tellp() > 0 ? " " : "") << hwy::TargetName(target);
  }
  return names.str();
}

// The product units to compare: the SIMD lanes always, the tile unit where this CPU has one.
struct Unit {
  cpu::ExactProductUnit unit;
  const char* name;
};
std::vector<Unit> product_units() {
  std::vector<Unit> units = {{cpu::ExactProductUnit::kSimdLanes, "simd lanes"}};
  if (cpu::exact_products_on_tiles(cpu::ExactProductUnit::kBest)) {
    units.push_back({cpu::ExactProductUnit::kBest, "amx tiles"});
  }
  return units;
}

// The product on every target, every unit and at 1 and 2 threads equals the reference's bits.
void expect_reference_bits(const std::vector<float>& a, const std::vector<float>& b, size_t m, size_t k, size_t n,
                           const std::string& what, const std::vector<int>& thread_counts = {1, 2}) {
  std::vector<float> want(m * n, 1.0f);
  ASSERT_TRUE(math::exact_matmul_reference(a.data(), b.data(), want.data(), m, k, n));
  for_each_target([&](const char* target) {
    for (const Unit& unit : product_units()) {
      for (int threads : thread_counts) {
        std::vector<float> got(m * n, 7.0f);
        cpu::ExactMatmulScratch scratch;
        scratch.unit = unit.unit;
        ASSERT_TRUE(cpu::exact_matmul_cpu(a.data(), b.data(), got.data(), m, k, n, &scratch, threads));
        EXPECT_EQ(count_differences(got, want, what + " " + target + " " + unit.name + " threads " + std::to_string(threads)), 0);
      }
    }
  });
}

TEST(ExactMatmulCpu, FixedPointFromBitsEqualsTheReferenceRounding) {
  std::mt19937 rng(3);
  std::vector<float> xs = {0.0f, -0.0f, 0.5f, 1.5f, 2.5f, -2.5f, 8191.5f, 1.99999988f, -1.99999988f,
                           std::ldexp(1.0f, -149), std::ldexp(3.0f, -149), std::ldexp(1.0f, -126),
                           std::ldexp(0x7fffff, -149), std::numeric_limits<float>::max()};
  for (int i = 0; i < 20000; ++i) {
    uint32_t u = rng();
    if ((u & 0x7f800000u) == 0x7f800000u) u &= ~0x00800000u;  // no inf or NaN (a row's scale excludes them)
    float x;
    std::memcpy(&x, &u, sizeof x);
    xs.push_back(x);
  }
  size_t checked = 0;
  for (float x : xs) {
    // Every shift a row holding x can get: its own (|x| * 2^shift <= 2^13) and those of larger rows.
    const int top = math::fixed_point_shift(std::fabs(x));
    for (int shift = top; shift >= top - 30 && shift >= -115; --shift) {
      ASSERT_EQ(cpu::fixed_point_from_bits(x, shift), math::to_fixed_point(x, shift))
          << x << " (0x" << std::hex << bits(x) << std::dec << ") at shift " << shift;
      ++checked;
    }
  }
  EXPECT_GT(checked, 500000u);
  // The SIMD conversion of whole rows on every target (lanes and scalar tail), the same shifts.
  for_each_target([&](const char* target) {
    for (int offset = 0; offset <= 30; offset += 3) {
      std::vector<float> row;
      std::vector<int> shifts;
      for (float x : xs) {
        const int shift = math::fixed_point_shift(std::fabs(x)) - offset;
        if (shift >= -115) row.push_back(x), shifts.push_back(shift);
      }
      // One shift per call: group the inputs by shift, a row of 37 (a tail on every width) at a time.
      for (size_t start = 0; start + 37 <= row.size(); start += 37) {
        std::vector<float> piece(37);
        const int shift = shifts[start];
        for (size_t e = 0; e < 37; ++e) piece[e] = std::ldexp(row[start + e], shifts[start + e] - shift);
        std::vector<int16_t> q(37, 12345);
        cpu::fixed_point_row(piece.data(), piece.size(), shift, q.data());
        for (size_t e = 0; e < 37; ++e) {
          ASSERT_EQ(q[e], math::to_fixed_point(piece[e], shift)) << target << " " << piece[e] << " at shift " << shift;
        }
      }
    }
  });
}

TEST(ExactMatmulCpu, ShapesEqualTheReferenceOnEveryTargetAndThreadCount) {
  std::mt19937 rng(11);
  // (m, k, n): single elements, k below, at and above the vector widths and the 64 padding, k
  // past the 960 chunk, C past the 48 x 48 blocks with partial register tiles on both edges, and
  // past the tile unit's 64 x 64 blocks with a single 16-row tile and a partial one on the edges.
  const size_t shapes[][3] = {{1, 1, 1},   {1, 7, 1},    {3, 5, 2},    {4, 16, 3},   {5, 17, 4},
                              {2, 31, 7},  {7, 32, 5},   {6, 33, 9},   {9, 63, 11},  {8, 64, 12},
                              {13, 65, 6}, {3, 129, 50}, {50, 100, 3}, {49, 961, 52}, {97, 1000, 50},
                              {1, 2000, 1}, {70, 200, 130}};
  for (const auto& s : shapes) {
    const size_t m = s[0], k = s[1], n = s[2];
    const std::vector<float> a = spread(m * k, rng), b = spread(k * n, rng);
    expect_reference_bits(a, b, m, k, n, std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n));
  }
}

TEST(ExactMatmulCpu, EmptyDimensionsEqualTheReference) {
  std::mt19937 rng(5);
  // k = 0: every element is +0.0; m or n = 0: nothing is written (and nothing is read past the end).
  for (const auto& s : std::vector<std::vector<size_t>>{{3, 0, 4}, {0, 5, 4}, {3, 5, 0}, {0, 0, 0}}) {
    const std::vector<float> a = spread(s[0] * s[1], rng), b = spread(s[1] * s[2], rng);
    expect_reference_bits(a, b, s[0], s[1], s[2], "empty");
  }
}

TEST(ExactMatmulCpu, ZeroAndNonFiniteRowsAndColumnsEqualTheReference) {
  std::mt19937 rng(17);
  const size_t m = 9, k = 70, n = 8;
  std::vector<float> a = spread(m * k, rng), b = spread(k * n, rng);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t p = 0; p < k; ++p) a[1 * k + p] = 0.0f;  // a zero row
  a[3 * k + 69] = inf;                                  // an inf in the k tail
  a[5 * k + 0] = -inf;
  a[7 * k + 40] = nan;
  for (size_t p = 0; p < k; ++p) b[p * n + 2] = 0.0f;  // a zero column
  b[10 * n + 4] = nan;
  b[69 * n + 7] = -inf;
  expect_reference_bits(a, b, m, k, n, "non-finite");
  std::vector<float> got(m * n);
  ASSERT_TRUE(cpu::exact_matmul_cpu(a.data(), b.data(), got.data(), m, k, n));
  EXPECT_TRUE(std::isnan(got[3 * n + 0]) && std::isnan(got[0 * n + 4]) && std::isnan(got[7 * n + 7]));
  EXPECT_FALSE(std::isnan(got[0 * n + 0]));
}

TEST(ExactMatmulCpu, SubnormalsEqualTheReference) {
  std::mt19937 rng(23);
  const size_t m = 6, k = 45, n = 5;
  std::vector<float> a(m * k), b(k * n);
  // Rows of subnormals only, rows mixing subnormals with normals, and the smallest magnitudes.
  for (size_t e = 0; e < a.size(); ++e) {
    const float sub = std::ldexp(static_cast<float>(rng() % 0x7fffff + 1), -149) * (rng() % 2 ? 1.0f : -1.0f);
    a[e] = (e / k) % 2 == 0 ? sub : (rng() % 3 == 0 ? sub * 1e30f : sub);
  }
  for (size_t e = 0; e < b.size(); ++e) b[e] = std::ldexp(static_cast<float>(rng() % 8), -149);
  expect_reference_bits(a, b, m, k, n, "subnormal");
}

// |q| = 2^13 everywhere and k > 131071: each product is 2^26, so 16 calls of the kernel's int32
// multiply-accumulate (two products a lane) already pass INT32_MAX, and a whole sum needs 45 bits.
TEST(ExactMatmulCpu, LongSumsOfWorstCaseDigitsAreExact) {
  const size_t m = 5, k = 131073 + 70, n = 4;
  const float big = 1.99999988f;  // q = 8192 at its own shift 12
  std::vector<float> a(m * k, big), b(k * n, big);
  // Row 1 and column 1 alternate signs in blocks of 37; row 2 is negated: sums of both signs.
  for (size_t p = 0; p < k; ++p) {
    if ((p / 37) % 2) a[1 * k + p] = -big;
    a[2 * k + p] = -big;
    if ((p / 37) % 2) b[p * n + 1] = -big;
  }
  // The all-positive element by hand: 8192^2 * k * 2^-24 = 4k (exact in float).
  std::vector<float> want(m * n);
  ASSERT_TRUE(math::exact_matmul_reference(a.data(), b.data(), want.data(), m, k, n));
  EXPECT_EQ(want[0], 4.0f * static_cast<float>(k));
  expect_reference_bits(a, b, m, k, n, "worst case", {2});
}

// The tile unit's worst digit sums: q = -8128 = 128 (-63) - 64 has the digit sum s = -127, so the
// int32 sum of s_a s_b = 127^2 over k passes INT32_MAX after 133 144 terms; k = 2^18 + 70 needs
// the kernel's int64 combination every 2^16 terms (the SIMD lanes see the same sums too).
TEST(ExactMatmulCpu, LongSumsOfTheLargestDigitSumsAreExact) {
  const size_t m = 3, k = (size_t{1} << 18) + 70, n = 2;
  std::vector<float> a(m * k, -8128.0f), b(k * n, -8128.0f);  // q = -8128 at shift 0
  for (size_t p = 0; p < k; ++p) {
    if (p % 3 == 0) a[1 * k + p] = 8127.0f;  // q = 8127: hi = 63, lo = 63, s = 126
    if ((p / 5) % 2) b[p * n + 1] = 8191.0f;   // q = 8191: hi = 64, lo = -1, s = 63
  }
  std::vector<float> want(m * n);
  ASSERT_TRUE(math::exact_matmul_reference(a.data(), b.data(), want.data(), m, k, n));
  EXPECT_EQ(want[0], static_cast<float>(8128.0 * 8128.0 * static_cast<double>(k)));
  expect_reference_bits(a, b, m, k, n, "largest digit sums", {2});
}

TEST(ExactMatmulCpu, TooLongKIsRefusedAsTheReference) {
  float c = 3.0f;
  const float one = 1.0f;
  // Not dereferenced: the length check comes first, as in the reference.
  EXPECT_FALSE(cpu::exact_matmul_cpu(&one, &one, &c, 1, math::kExactMatmulMaxK + 1, 1));
  EXPECT_EQ(c, 3.0f);
}

// Σ x² of one whole tile with each lane's 16 elements added quad-major (element e of every round,
// then e + 1, ...) instead of round-major: another order, for the test's sensitivity.
double quad_major_tile_sum(const float* x) {
  double lanes[math::kNormLanes] = {};
  for (int e = 0; e < math::kNormQuad; ++e) {
    for (int r = 0; r < math::kNormRounds; ++r) {
      for (int j = 0; j < math::kNormLanes; ++j) {
        lanes[j] = lanes[j] + math::square_in_double(x[r * math::kNormRound + j * math::kNormQuad + e]);
      }
    }
  }
  math::norm_lane_tree(lanes);
  return lanes[0];
}

TEST(ExactMatmulCpu, SumOfSquaresIsTheCanonicalOne) {
  std::mt19937 rng(37);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Whole tiles, a short last tile, fewer elements than a round; values of one magnitude, whose
  // double sums depend on the order of their additions.
  for (size_t count : {size_t{1}, size_t{5}, size_t{1023}, size_t{4095}, size_t{4096}, size_t{4097},
                       size_t{3 * 4096 + 1029}, size_t{300001}}) {
    std::vector<float> x(count);
    for (float& v : x) v = nd(rng);
    const double want = math::tensor_sum_of_squares(x.data(), static_cast<int64_t>(count));
    for (int threads : {1, 2, 3}) {
      const double got = cpu::sum_of_squares_canonical(x.data(), count, threads);
      uint64_t gb, wb;
      std::memcpy(&gb, &got, sizeof gb);
      std::memcpy(&wb, &want, sizeof wb);
      EXPECT_EQ(gb, wb) << count << " elements, " << threads << " threads: " << got << " vs " << want;
    }
  }
  // Another order within a lane changes the bits of some tiles of such values: the comparison
  // above can tell orders apart.
  int differ = 0;
  std::vector<float> tile(math::kNormTile);
  for (int t = 0; t < 20; ++t) {
    for (float& v : tile) v = nd(rng);
    differ += quad_major_tile_sum(tile.data()) != math::tensor_sum_of_squares(tile.data(), math::kNormTile);
  }
  EXPECT_GT(differ, 0);
}

TEST(ExactMatmulCpu, NewtonSchulzEqualsTheReference) {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // (rows, cols): wide, tall (transposed), square, C past a block, a single row and column.
  // 50 x 130 and 140 x 33 have more than one norm tile (4096 elements), the last one short;
  // 180 x 100 gives the split's products O O and O_B X three blocks a side, off the diagonal too.
  const size_t shapes[][2] = {{5, 7}, {7, 5}, {16, 40}, {33, 65}, {64, 64}, {1, 1}, {1, 9}, {9, 1}, {50, 130}, {140, 33},
                              {180, 100}};
  std::ostringstream exercised;
  for (const auto& s : shapes) {
    const size_t rows = s[0], cols = s[1];
    std::vector<float> u(rows * cols);
    for (float& v : u) v = nd(rng) * 0.01f;
    std::vector<float> want(rows * cols);
    ASSERT_TRUE(math::newton_schulz_reference(u.data(), rows, cols, want.data()));
    const std::string what = "ns " + std::to_string(rows) + "x" + std::to_string(cols);
    const std::string names = for_each_target([&](const char* target) {
      for (const Unit& unit : product_units()) {
        cpu::NewtonSchulzScratch scratch;  // reused across the thread counts: stale contents change nothing
        scratch.unit = unit.unit;
        for (int threads : {1, 2}) {
          std::vector<float> got(rows * cols, 5.0f);
          ASSERT_TRUE(cpu::newton_schulz_exact_cpu(u.data(), rows, cols, got.data(), {}, 5, 1e-7f, &scratch, threads));
          EXPECT_EQ(count_differences(got, want, what + " " + target + " " + unit.name + " threads " + std::to_string(threads)),
                    0);
        }
      }
    });
    if (exercised.tellp() == 0) exercised << names;
  }
  std::cout << "[exact matmul cpu] Highway targets exercised: " << exercised.str()
            << "; AMX tile unit: " << (cpu::amx_int8_usable() ? "exercised" : "not on this CPU") << std::endl;
}

TEST(ExactMatmulCpu, NewtonSchulzOtherCoefficientsStepsAndEdgeInputsEqualTheReference) {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t rows = 12, cols = 20;
  std::vector<float> u(rows * cols);
  for (float& v : u) v = nd(rng);
  const math::NewtonSchulzCoefficients odd{2.0f, -1.5f, 0.5f};
  std::vector<float> zero(rows * cols, 0.0f), with_nan = u, tiny(rows * cols), zero_row = u;
  with_nan[37] = std::numeric_limits<float>::quiet_NaN();
  // A zero row of X: its row and column of A and of O are zero, its diagonal d_i = 0.
  std::fill(zero_row.begin() + 3 * cols, zero_row.begin() + 4 * cols, 0.0f);
  for (size_t e = 0; e < tiny.size(); ++e) tiny[e] = std::ldexp(static_cast<float>(e % 5), -140);  // norm below eps
  struct Case {
    const std::vector<float>* u;
    math::NewtonSchulzCoefficients coeff;
    int steps;
    float eps;
    const char* name;
  };
  const Case cases[] = {{&u, odd, 3, 1e-7f, "coefficients"}, {&u, {}, 0, 1e-7f, "zero steps"},
                        {&u, {}, 1, 1e-7f, "one step"},      {&zero, {}, 5, 1e-7f, "zero matrix"},
                        {&with_nan, {}, 2, 1e-7f, "nan"},    {&tiny, {}, 5, 1e-3f, "norm below eps"},
                        {&zero_row, {}, 5, 1e-7f, "a zero row"}};
  for (const Case& c : cases) {
    std::vector<float> want(rows * cols), got(rows * cols);
    ASSERT_TRUE(math::newton_schulz_reference(c.u->data(), rows, cols, want.data(), c.coeff, c.steps, c.eps));
    ASSERT_TRUE(cpu::newton_schulz_exact_cpu(c.u->data(), rows, cols, got.data(), c.coeff, c.steps, c.eps, nullptr, 2));
    EXPECT_EQ(count_differences(got, want, c.name), 0);
  }
  // In place, wide and tall (the tall one is transposed on the way in and out).
  for (const bool tall : {false, true}) {
    const size_t r = tall ? cols : rows, c = tall ? rows : cols;
    std::vector<float> want(r * c), inout = u;
    ASSERT_TRUE(math::newton_schulz_reference(u.data(), r, c, want.data()));
    ASSERT_TRUE(cpu::newton_schulz_exact_cpu(inout.data(), r, c, inout.data(), {}, 5, 1e-7f, nullptr, 2));
    EXPECT_EQ(count_differences(inout, want, tall ? "in place, tall" : "in place, wide"), 0);
  }
}

}  // namespace
}  // namespace renaissance
