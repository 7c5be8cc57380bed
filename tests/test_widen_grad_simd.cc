// The CPU's widening of model-dtype gradients (backend_cpu/ops_widen_grad.cc) against the scalar
// definitions of math/precision.h (bf16_to_f32, f16_to_f32), bit for bit, under every Highway
// target compiled in and supported here: all 65536 encodings of each format (zeros, fp16
// subnormals, infinities, quiet and signalling NaN payloads included), whole and as odd-length
// pieces at odd offsets (vector bodies with scalar heads and tails).
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "backend_cpu/grad_dtype.h"
#include "renaissance/math/precision.h"

namespace renaissance {
namespace {

struct ResetSupportedTargets {
  ~ResetSupportedTargets() { hwy::SetSupportedTargetsForTest(0); }
};

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
    ResetSupportedTargets reset;
    hwy::SetSupportedTargetsForTest(target);
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

}  // namespace
}  // namespace renaissance
