// The CPU model copy's vector rounding (backend_cpu/ops_model_copy.cc) against the scalar
// definitions of math/precision.h, bit for bit, under every Highway target compiled in and
// supported here (on x86 with Highway 1.0: AVX3, AVX2, SSE4, SSSE3 and the SCALAR baseline,
// which takes the scalar loop): constructed bf16/fp16 ties, fp16 subnormals and the overflow
// edges, NaN payloads, infinities, zeros, every float exponent and random patterns; stochastic
// rounding at element indices that start mid-block, cross 2^32 blocks and a Philox counter whose
// low word wraps.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend_cpu/model_copy.h"
#include "renaissance/math/precision.h"
#include "support/simd_targets.h"

namespace renaissance {
namespace {

std::vector<float> edge_inputs() {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x00000001u, 0x007fffffu, 0x00800000u,              // zeros, float subnormals
      0x32ffffffu, 0x33000000u, 0x33000001u, 0x337fffffu, 0x33800000u,  // around 2^-25 (fp16 -> 0 or 1)
      0x387fffffu, 0x38800000u, 0x38800001u,                            // the smallest normal fp16
      0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x477fffffu,  // 65504 .. 65536
      0x47800000u, 0x47800001u,                                         // 65536: fp16 inf
      0x7f7f7fffu, 0x7f7f8000u, 0x7f7f8001u, 0x7f7fffffu,              // the largest bf16, ties to inf
      0x7f800000u, 0x7f800001u, 0x7f802000u, 0x7fa00000u, 0x7fc00000u, 0x7fffffffu,  // inf, NaNs
      0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u,              // bf16 ties, even and odd
      0x3f801000u, 0x3f803000u, 0x3f800fffu, 0x3f801001u,              // fp16 normal ties
  };
  // fp16 subnormal results: every shift 14..24, remainder exactly half (q even and odd) and half +- 1.
  for (uint32_t shift = 14; shift <= 24; ++shift) {
    const uint32_t e = 126u - shift;
    const uint32_t half = 1u << (shift - 1u);
    for (uint32_t q : {0u, 1u, 2u, 3u, 0x3feu, 0x3ffu}) {
      for (int32_t d : {-1, 0, 1}) {
        const uint64_t m = (static_cast<uint64_t>(q) << shift) + half + static_cast<uint32_t>(d);
        if (m < (1u << 23) || m >= (1u << 24)) continue;  // the implicit bit must be bit 23
        bits.push_back((e << 23) | (static_cast<uint32_t>(m) & 0x7fffffu));
      }
    }
  }
  std::mt19937 rng(20261201);
  // bf16 and fp16-normal ties at random magnitudes.
  for (int i = 0; i < 400; ++i) {
    const uint32_t top = rng() & 0x7f7f0000u;
    bits.push_back(top | 0x8000u);
    bits.push_back(top | 0x18000u);
    const uint32_t mid = (rng() % (0x477fe000u - 0x38800000u) + 0x38800000u) & ~0x1fffu;
    bits.push_back(mid | 0x1000u);
    bits.push_back(mid | 0x3000u);
  }
  // Every float exponent with random fractions, and fully random patterns.
  for (uint32_t e = 0; e < 256; ++e) {
    for (int i = 0; i < 6; ++i) bits.push_back((e << 23) | (rng() & 0x7fffffu));
  }
  for (int i = 0; i < 2000; ++i) bits.push_back(rng());
  std::vector<float> out;
  for (uint32_t b : bits) {
    out.push_back(math::f32_from_bits(b));
    out.push_back(math::f32_from_bits(b ^ 0x80000000u));
  }
  return out;
}

// The scalar definition of element first + i.
uint16_t reference(Precision p, Rounding r, float x, uint64_t seed, uint64_t t, uint32_t param, uint64_t index) {
  if (r == Rounding::kNearest) return p == Precision::kBf16 ? math::f32_to_bf16_rne(x) : math::f32_to_f16_rne(x);
  const uint32_t word = math::sr_random_word(seed, t, param, index);
  return p == Precision::kBf16 ? math::f32_to_bf16_sr(x, word) : math::f32_to_f16_sr(x, word);
}

// Returns how many elements differ (each difference is reported, the first few in detail).
int compare(Precision p, Rounding r, const std::vector<float>& x, uint64_t offset, uint64_t n, uint64_t first,
            uint64_t seed, uint64_t t, uint32_t param) {
  std::vector<uint16_t> got(n, 0xdeadu);
  cpu::round_model_copy(p, r, x.data() + offset, got.data(), n, first, seed, t, param);
  int bad = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const uint16_t want = reference(p, r, x[offset + i], seed, t, param, first + i);
    if (got[i] != want && ++bad <= 3) {
      ADD_FAILURE() << precision_name(p) << " " << rounding_name(r) << " input 0x" << std::hex
                    << math::f32_bits(x[offset + i]) << " at index 0x" << first + i << ": got 0x" << got[i]
                    << ", scalar definition 0x" << want;
    }
  }
  return bad;
}

TEST(ModelCopySimd, EveryTargetEqualsTheScalarDefinition) {
  const std::vector<float> x = edge_inputs();
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  std::ostringstream exercised;
  // (first index, seed, t, param): a block-aligned start; starts 1, 2, 3, 5 and 7 into an
  // 8-element block; an index past 2^35 (the counter's high word); a block number whose low word
  // wraps within one vector.
  struct Key {
    uint64_t first, seed, t;
    uint32_t param;
  };
  const Key keys[] = {{0, 1, 1, 0},
                      {1, 0x0123456789abcdefull, 7, 3},
                      {2, 42, 1000, 12},
                      {3, 0xffffffffffffffffull, 0xffffffffull, 0xffffffffu},
                      {5, 11, 4, 7},
                      {(1ull << 35) + 7, 9, 2, 1},
                      {(0xffffffffull - 5) * 8 + 1, 5, 3, 2}};
  for (int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    const testing_util::OnlySimdTarget only(target);
    // Proof that dispatch now runs this target's code.
    ASSERT_EQ(std::string(cpu::model_copy_target()), hwy::TargetName(target));
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
        for (const Key& k : keys) {
          // The whole input, then an odd-length piece at an odd offset (a head and a tail).
          EXPECT_EQ(compare(p, r, x, 0, x.size(), k.first, k.seed, k.t, k.param), 0);
          EXPECT_EQ(compare(p, r, x, 3, 301, k.first, k.seed, k.t, k.param), 0);
        }
      }
    }
    exercised << (exercised.tellp() > 0 ? " " : "") << hwy::TargetName(target);
  }
  RecordProperty("highway_targets", exercised.str());
  std::cout << "[model copy simd] " << x.size() << " inputs; Highway targets exercised: " << exercised.str()
            << std::endl;
}

// Stochastic rounding draws from the element index only: the same tensor rounded in pieces of
// any length and start gives the bits of one call (as the CPU runner's blocks do).
TEST(ModelCopySimd, PiecesEqualOneCall) {
  const std::vector<float> x = edge_inputs();
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    std::vector<uint16_t> whole(x.size()), pieces(x.size());
    cpu::round_model_copy(p, Rounding::kStochastic, x.data(), whole.data(), x.size(), 0, 77, 5, 4);
    std::mt19937 rng(3);
    for (uint64_t b = 0; b < x.size();) {
      const uint64_t len = std::min<uint64_t>(x.size() - b, 1 + rng() % 150);
      cpu::round_model_copy(p, Rounding::kStochastic, x.data() + b, pieces.data() + b, len, b, 77, 5, 4);
      b += len;
    }
    EXPECT_EQ(whole, pieces) << precision_name(p);
  }
}

}  // namespace
}  // namespace renaissance
