// The CPU's widening of model-dtype gradients (backend_cpu/ops_widen_grad.cc) against the scalar
// definitions of math/precision.h (bf16_to_f32, f16_to_f32), bit for bit, under every Highway
// target compiled in and supported here: all 65536 encodings of each format (zeros, fp16
// subnormals, infinities, quiet and signalling NaN payloads included), whole and as odd-length
// pieces at odd offsets (vector bodies with scalar heads and tails); and the CHECK_FINITE scans
// (ops_check.cc) of model-dtype G on the same encodings and of fp32 G, a bad element at every
// place of runs that exercise each of the scan's four quarter streams, its one-vector loop and
// its scalar tail.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "backend_cpu/grad_dtype.h"
#include "renaissance/math/precision.h"
#include "support/simd_targets.h"

namespace renaissance {
namespace {

// How many of src[offset, offset + n) widen to other bits than the scalar definition's.
int compare(Precision p, const std::vector<uint16_t>& src, uint64_t offset, uint64_t n) {
  std::vector<float> got(n, math::f32_from_bits(0xdeadbeefu));
  cpu::widen_grad(p, src.data() + offset, n, got.data());
  int bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint16_t h = src[offset + i];
    const uint32_t want = math::f32_bits(math::half_to_f32(p == Precision::kBf16, h));
    if (math::f32_bits(got[i]) != want && ++bad <= 3) {
      ADD_FAILURE() << (p == Precision::kBf16 ? "bf16" : "fp16") << " encoding 0x" << std::hex << h << ": got 0x"
                    << math::f32_bits(got[i]) << ", scalar definition 0x" << want;
    }
  }
  return bad;
}

TEST(WidenGradSimd, EveryTargetEqualsTheScalarDefinitionOnEveryEncoding) {
  std::vector<uint16_t> all(1u << 16);
  for (uint32_t h = 0; h < all.size(); ++h) all[h] = static_cast<uint16_t>(h);
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  std::ostringstream exercised;
  for (int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    const testing_util::OnlySimdTarget only(target);
    // Proof that dispatch now runs this target's code.
    ASSERT_EQ(std::string(cpu::widen_grad_target()), hwy::TargetName(target));
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      EXPECT_EQ(compare(p, all, 0, all.size()), 0);
      EXPECT_EQ(compare(p, all, 0x7bf3, 301), 0);  // across the fp16 finite/inf edge 0x7c00
      EXPECT_EQ(compare(p, all, 3, 5), 0);          // shorter than a vector
    }
    exercised << (exercised.tellp() > 0 ? " " : "") << hwy::TargetName(target);
  }
  RecordProperty("highway_targets", exercised.str());
  std::cout << "[widen grad simd] Highway targets exercised: " << exercised.str() << std::endl;
}

// The non-finite check of model-dtype G (cpu::encoded_has_non_finite, the CHECK_FINITE op's scan)
// under every target: each of the 65536 encodings alone in a run of zeros must be found exactly
// when the scalar definition widens it to a NaN or an infinity. The run (167) splits into four
// quarters of 32 (16- and 32-lane targets) or 40 (8 lanes), a one-vector loop and a scalar tail;
// the places start and end each of them.
TEST(WidenGradSimd, NonFiniteScanFindsEveryNonFiniteEncodingAtEveryPlace) {
  constexpr uint64_t kN = 4 * 32 + 32 + 7;
  const uint64_t places[] = {0, 1, 31, 32, 40, 63, 64, 80, 96, 120, 127, 128, 150, 159, 160, kN - 1};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const testing_util::OnlySimdTarget only(target);
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      std::vector<uint16_t> g(kN, 0);
      int bad = 0;
      for (uint32_t h = 0; h < (1u << 16); ++h) {
        const bool want = !std::isfinite(math::half_to_f32(p == Precision::kBf16, static_cast<uint16_t>(h)));
        for (uint64_t at : places) {
          g[at] = static_cast<uint16_t>(h);
          if (cpu::encoded_has_non_finite(p, g.data(), kN) != want && ++bad <= 3) {
            ADD_FAILURE() << (p == Precision::kBf16 ? "bf16" : "fp16") << " encoding 0x" << std::hex << h << std::dec
                          << " at " << at << ": " << (want ? "not found" : "found, but it is finite");
          }
          g[at] = 0;
        }
      }
      EXPECT_EQ(bad, 0);
      // Shorter than a vector and empty.
      g[2] = p == Precision::kBf16 ? 0x7f80 : 0x7c00;
      EXPECT_TRUE(cpu::encoded_has_non_finite(p, g.data(), 3));
      EXPECT_FALSE(cpu::encoded_has_non_finite(p, g.data(), 2));
      EXPECT_FALSE(cpu::encoded_has_non_finite(p, g.data(), 0));
    }
  }
}

// Both scans with one bad element at each place of runs of several lengths (every split into
// quarters, one-vector loop and tail on every target), and nothing found in a run of the largest
// finite values. fp32: a quiet and a signalling NaN, +Inf, -Inf; model dtypes: the infinities of
// both signs and the smallest and largest NaNs (all other encodings: the test above).
TEST(WidenGradSimd, NonFiniteScansFindOneBadElementAtEveryPlaceOfEveryLength) {
  const float kBadFloats[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), math::f32_from_bits(0x7f800001u)};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const testing_util::OnlySimdTarget only(target);
    for (uint64_t n : {1u, 7u, 31u, 64u, 167u, 259u, 1031u}) {
      SCOPED_TRACE("length " + std::to_string(n));
      const float largest_float = std::numeric_limits<float>::max();
      std::vector<float> g(n, largest_float);
      EXPECT_FALSE(cpu::fp32_has_non_finite(g.data(), n));
      int missed = 0;
      for (uint64_t at = 0; at < n; ++at) {
        for (float bad : kBadFloats) {
          g[at] = bad;
          if (!cpu::fp32_has_non_finite(g.data(), n) && ++missed <= 3) ADD_FAILURE() << "fp32 0x" << std::hex << math::f32_bits(bad) << std::dec << " at " << at << ": not found";
          g[at] = largest_float;
        }
      }
      EXPECT_EQ(missed, 0);
      for (Precision p : {Precision::kBf16, Precision::kFp16}) {
        const bool bf16 = p == Precision::kBf16;
        const uint16_t largest_finite = bf16 ? 0x7f7f : 0x7bff;
        const uint16_t exp = bf16 ? 0x7f80 : 0x7c00;
        const uint16_t bad_codes[] = {exp, static_cast<uint16_t>(exp | 0x8000), static_cast<uint16_t>(exp + 1), 0x7fff, 0xffff};
        std::vector<uint16_t> h(n, largest_finite);
        EXPECT_FALSE(cpu::encoded_has_non_finite(p, h.data(), n));
        int missed_codes = 0;
        for (uint64_t at = 0; at < n; ++at) {
          for (uint16_t bad : bad_codes) {
            h[at] = bad;
            if (!cpu::encoded_has_non_finite(p, h.data(), n) && ++missed_codes <= 3) ADD_FAILURE() << (bf16 ? "bf16" : "fp16") << " 0x" << std::hex << bad << std::dec << " at " << at << ": not found";
            h[at] = largest_finite;
          }
        }
        EXPECT_EQ(missed_codes, 0);
      }
    }
  }
}

}  // namespace
}  // namespace renaissance
