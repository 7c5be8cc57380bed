// Muon's Newton–Schulz in fast mode on the CPU (backend_cpu/newton_schulz_fast_cpu.h): within a
// measured bound of the float64 iteration (tests/support/oracle_f64.h) on wide, tall, conv-like,
// one-row and multi-block shapes, closer to it than exact mode and not exact mode's bits, on every
// copy of its product this CPU runs (AVX-512, AVX2 + FMA, baseline), the same bits on any thread
// count and run to run, the transpose rule bit for bit, a zero update zero.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "backend_cpu/exact_matmul_cpu.h"
#include "backend_cpu/fast_product_cpu.h"
#include "backend_cpu/newton_schulz_fast_cpu.h"
#include "renaissance/math/newton_schulz.h"
#include "support/optimizer_cases.h"
#include "support/oracle_f64.h"
#include "support/simd_targets.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

// The bounds of fast mode against float64 (docs/math.md, "Muon: fast mode"), measured on the
// shapes below: relative L2 distance 4.8e-7 to 1.7e-6, largest element error 2e-7 to 8e-7 (the
// elements are O(0.1-1)); the bounds keep a margin of about 6. fp32 products carry 24 bits
// against the exact products' 13-14, so fast mode is 160-530x closer to float64 than exact mode
// (0.007-0.047 % on the same inputs, with its diagonal split); the tests ask for 20x.
constexpr double kFastCloserThanExact = 20.0;
constexpr double kFastRelL2 = 1e-5;
constexpr double kFastMaxAbs = 5e-6;

struct Shape {
  size_t rows, cols;
};
// Wide, tall (transposed), square, one row, a conv weight (16, 8, 3, 3) viewed as 16 x 72, and
// matrices of several row blocks (kFastProductBlockRows = 64), one of them tall.
const Shape kShapes[] = {{8, 20}, {20, 8}, {32, 32}, {1, 33}, {16, 72}, {64, 256}, {200, 130}, {150, 300}};

// A momentum-like update: |u| in [0.1, 1) with a sign per element (support/optimizer_cases.h).
std::vector<float> update(Shape s, uint64_t seed) {
  const ParamSpec p{"u", {static_cast<int64_t>(s.rows), static_cast<int64_t>(s.cols)}, Role::kFcWeight};
  return testing_util::make_grads({p}, seed, 0, 1.0)[0];
}

Eigen::ArrayXd f64_of(const std::vector<float>& u, Shape s) {
  const Eigen::ArrayXd ud = Eigen::Map<const Eigen::ArrayXf>(u.data(), static_cast<Eigen::Index>(u.size())).cast<double>();
  return oracle::newton_schulz_f64(ud, static_cast<int64_t>(s.rows), static_cast<int64_t>(s.cols),
                                   default_config(OptimizerKind::kMuon));
}

std::vector<float> fast(const std::vector<float>& u, Shape s, int threads) {
  std::vector<float> out(u.size());
  cpu::newton_schulz_fast_cpu(u.data(), s.rows, s.cols, out.data(), {}, 5, 1e-7f, nullptr, threads);
  return out;
}

double rel_l2(const std::vector<float>& got, const Eigen::ArrayXd& want) {
  const Eigen::ArrayXd g = Eigen::Map<const Eigen::ArrayXf>(got.data(), static_cast<Eigen::Index>(got.size())).cast<double>();
  return std::sqrt((g - want).square().sum() / want.square().sum());
}
double max_abs(const std::vector<float>& got, const Eigen::ArrayXd& want) {
  const Eigen::ArrayXd g = Eigen::Map<const Eigen::ArrayXf>(got.data(), static_cast<Eigen::Index>(got.size())).cast<double>();
  return (g - want).abs().maxCoeff();
}

TEST(NewtonSchulzFastCpu, WithinTheMeasuredBoundOfFloat64AndCloserThanExactMode) {
  double worst_rel = 0, worst_abs = 0;
  for (const Shape s : kShapes) {
    SCOPED_TRACE(std::to_string(s.rows) + "x" + std::to_string(s.cols));
    const std::vector<float> u = update(s, 7 + s.rows);
    const Eigen::ArrayXd want = f64_of(u, s);
    const std::vector<float> got = fast(u, s, 2);
    std::vector<float> exact(u.size());
    ASSERT_TRUE(math::newton_schulz_reference(u.data(), s.rows, s.cols, exact.data()));
    const double rel = rel_l2(got, want), abs = max_abs(got, want), rel_exact = rel_l2(exact, want);
    std::printf("fast NS %zux%zu: relative L2 to float64 %.3g, max abs %.3g (exact mode %.3g)\n", s.rows, s.cols,
                rel, abs, rel_exact);
    EXPECT_LE(rel, kFastRelL2);
    EXPECT_LE(abs, kFastMaxAbs);
    // fp32 products: far closer to float64 than the fixed-point ones (a fast mode that ran the
    // exact products, or lost bits in a product, would not be).
    EXPECT_LT(rel * kFastCloserThanExact, rel_exact);
    worst_rel = std::max(worst_rel, rel);
    worst_abs = std::max(worst_abs, abs);
  }
  std::printf("fast NS worst: relative L2 %.3g, max abs %.3g\n", worst_rel, worst_abs);
}

// The copy of the product that Highway's target implies.
std::string copy_of(int64_t target) {
  if (target == HWY_AVX3 || target == HWY_AVX3_DL) return "AVX-512";
  if (target == HWY_AVX2) return "AVX2+FMA";
  return "baseline";
}

// Each copy of the product this CPU runs, dispatch pinned to it (through Highway's target list,
// as the library picks it): within the bound of float64 and closer than exact mode, and each
// copy's bits its own (the dispatch reaches distinct code: FMA and the vector width change the
// rounding of some sums).
TEST(NewtonSchulzFastCpu, EveryCopyOfTheProductIsWithinTheBoundAndDispatchedByTheCpu) {
  const Shape s{150, 300};
  const std::vector<float> u = update(s, 19);
  const Eigen::ArrayXd want = f64_of(u, s);
  std::vector<float> exact(u.size());
  ASSERT_TRUE(math::newton_schulz_reference(u.data(), s.rows, s.cols, exact.data()));
  const double rel_exact = rel_l2(exact, want);
  std::map<std::string, std::vector<float>> by_copy;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    const testing_util::OnlySimdTarget only(target);
    const std::string copy = copy_of(target);
    SCOPED_TRACE(std::string(hwy::TargetName(target)) + " -> " + copy);
    EXPECT_EQ(std::string(cpu::fast_product_target()), copy);
    const std::vector<float> got = fast(u, s, 2);
    const double rel = rel_l2(got, want), abs = max_abs(got, want);
    std::printf("fast NS %zux%zu on %s (%s): relative L2 %.3g, max abs %.3g\n", s.rows, s.cols,
                hwy::TargetName(target), copy.c_str(), rel, abs);
    EXPECT_LE(rel, kFastRelL2);
    EXPECT_LE(abs, kFastMaxAbs);
    EXPECT_LT(rel * kFastCloserThanExact, rel_exact);
    if (by_copy.count(copy) != 0) {
      EXPECT_TRUE(testing_util::same_bits(got, by_copy[copy]));  // one copy, one set of bits
    }
    by_copy[copy] = got;
  }
  // With dispatch free, the best copy: the one the widest target implies.
  EXPECT_EQ(std::string(cpu::fast_product_target()), copy_of(hwy::SupportedAndGeneratedTargets().front()));
  for (const auto& [name, bits] : by_copy) {
    for (const auto& [other, other_bits] : by_copy) {
      if (name < other) {
        EXPECT_FALSE(testing_util::same_bits(bits, other_bits)) << name << " and " << other;
      }
    }
  }
}

TEST(NewtonSchulzFastCpu, NotTheExactModesBits) {
  for (const Shape s : kShapes) {
    if (s.rows < 2) continue;  // one row: X Xᵀ is one dot product, which may round alike
    const std::vector<float> u = update(s, 3);
    std::vector<float> exact(u.size());
    ASSERT_TRUE(math::newton_schulz_reference(u.data(), s.rows, s.cols, exact.data()));
    EXPECT_FALSE(testing_util::same_bits(fast(u, s, 1), exact)) << s.rows << "x" << s.cols;
  }
}

TEST(NewtonSchulzFastCpu, SameBitsOnEveryThreadCountAndRunToRun) {
  for (const Shape s : kShapes) {
    const std::vector<float> u = update(s, 11);
    const std::vector<float> one = fast(u, s, 1);
    for (int threads : {1, 2, 3, 4}) {
      EXPECT_TRUE(testing_util::same_bits(fast(u, s, threads), one)) << s.rows << "x" << s.cols << " on " << threads;
    }
    // In place, with a reused scratch, as the backend calls it.
    cpu::NewtonSchulzFastScratch scratch;
    for (int run = 0; run < 2; ++run) {
      std::vector<float> x = u;
      cpu::newton_schulz_fast_cpu(x.data(), s.rows, s.cols, x.data(), {}, 5, 1e-7f, &scratch, 2);
      EXPECT_TRUE(testing_util::same_bits(x, one)) << s.rows << "x" << s.cols << " in place, run " << run;
    }
  }
}

TEST(NewtonSchulzFastCpu, ATallMatrixIsTheTransposeOfItsWideOneBitForBit) {
  for (const Shape s : {Shape{24, 9}, Shape{200, 130}}) {
    const std::vector<float> u = update(s, 5);
    std::vector<float> ut(u.size());
    for (size_t i = 0; i < s.rows; ++i) {
      for (size_t j = 0; j < s.cols; ++j) ut[j * s.rows + i] = u[i * s.cols + j];
    }
    const std::vector<float> out = fast(u, s, 2), out_t = fast(ut, {s.cols, s.rows}, 2);
    for (size_t i = 0; i < s.rows; ++i) {
      for (size_t j = 0; j < s.cols; ++j) {
        ASSERT_EQ(testing_util::float_bits(out[i * s.cols + j]), testing_util::float_bits(out_t[j * s.rows + i]))
            << s.rows << "x" << s.cols << " at " << i << "," << j;
      }
    }
  }
}

TEST(NewtonSchulzFastCpu, AZeroUpdateStaysZero) {
  std::vector<float> u(6 * 10, 0.0f), out(6 * 10, 1.0f);
  cpu::newton_schulz_fast_cpu(u.data(), 6, 10, out.data());
  for (float x : out) EXPECT_EQ(testing_util::float_bits(x), 0u);
}

}  // namespace
}  // namespace renaissance
