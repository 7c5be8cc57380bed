// RENAISSANCE_CPU_UNROLL (backend_cpu/ops_adam.h): the Adam-family kernels that take 2 or 4 SIMD
// vectors per loop iteration must write the same bits as the one-vector kernel (which the golden
// fingerprints and the oracle tests pin down), under every Highway target compiled in and
// supported here, for every length around the group, vector and scalar-tail boundaries and on
// inputs with NaN payloads, infinities, signed zeros and subnormals.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend_cpu/ops_adam.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Mostly ordinary values (so that most lanes do real arithmetic), with edge patterns mixed in.
std::vector<float> inputs(size_t n, uint32_t seed, float scale, bool non_negative) {
  const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x7f800000u, 0xff800000u,
                            0x7fc00000u, 0x7fc12345u, 0xffc00001u, 0x7f7fffffu, 0x3f800000u, 0x00800000u};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = rng() % 7 == 0 ? from_bits(edges[rng() % (sizeof edges / sizeof edges[0])]) : normal(rng);
    if (non_negative && !(x[i] >= 0.0f) && !(x[i] != x[i])) x[i] = -x[i];
  }
  return x;
}

struct Arrays {
  std::vector<float> w, m, v;
};

// One kernel call over n elements starting `offset` floats into the arrays (so the vectors are
// not always aligned); returns the arrays after the call.
Arrays run(cpu::ElementwiseFn fn, size_t n, size_t offset, const float* s, bool weight_group, uint32_t seed) {
  Arrays a{inputs(n + offset, seed, 0.05f, false), inputs(n + offset, seed + 2, 1e-3f, false),
           inputs(n + offset, seed + 3, 1e-6f, true)};
  const std::vector<float> g = inputs(n + offset, seed + 1, 1e-2f, false);
  fn(a.w.data() + offset, g.data() + offset, a.m.data() + offset, a.v.data() + offset, n, s, weight_group, false);
  return a;
}

// Every bit, except that any NaN equals any NaN: where two operands of an add or a mul are both
// NaN, x86 returns the first one's payload and the compiler may commute the operands, so even one
// kernel's scalar tail gives other payloads in another instantiation (seen on AVX2 here). NaN
// payloads are no part of the contract (the CUDA backend writes one canonical NaN).
void expect_same_bits(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != want[i] && got[i] != got[i]) continue;
    ASSERT_EQ(to_bits(want[i]), to_bits(got[i])) << what << " element " << i;
  }
}

struct ResetSupportedTargets {
  ~ResetSupportedTargets() { hwy::SetSupportedTargetsForTest(0); }
};

TEST(AdamUnroll, EveryUnrollWritesTheBitsOfOneVectorPerIteration) {
  float s[kNumScalarF32] = {};
  s[kLr] = 1e-3f;
  s[kWeightDecay] = 0.1f;
  s[kDecayFactor] = 0.9999f;
  s[kBeta1] = 0.9f;
  s[kBeta2] = 0.999f;
  s[kOneMinusBeta1] = 0.1f;
  s[kOneMinusBeta2] = 0.001f;
  s[kEps] = 1e-8f;
  s[kInvLossScale] = 0.5f;
  s[kBiasCorrection1] = 3.0f;
  s[kBiasCorrection2] = 70.0f;
  s[kClipCoefficient] = 0.75f;
  ResetSupportedTargets reset;
  int targets = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    ++targets;
    for (bool decoupled : {true, false}) {
      const cpu::ElementwiseFn one = cpu::adam_kernel(decoupled, 1);
      for (unsigned unroll : {2u, 4u}) {
        const cpu::ElementwiseFn fn = cpu::adam_kernel(decoupled, unroll);
        ASSERT_NE(fn, one) << "unroll " << unroll << " is the one-vector kernel: nothing is compared";
        // Every length up to a group of four 16-lane vectors and a few more, then lengths around
        // the later group boundaries, at two alignments.
        std::vector<size_t> lengths;
        for (size_t n = 0; n <= 80; ++n) lengths.push_back(n);
        for (size_t n : {127, 128, 129, 191, 192, 193, 255, 256, 257, 273}) lengths.push_back(n);
        for (size_t n : lengths) {
          for (size_t offset : {size_t{0}, size_t{3}}) {
            for (bool weight_group : {true, false}) {
              const uint32_t seed = static_cast<uint32_t>(n * 8 + offset * 2 + weight_group);
              const Arrays want = run(one, n, offset, s, weight_group, seed);
              const Arrays got = run(fn, n, offset, s, weight_group, seed);
              const std::string what = std::string(hwy::TargetName(target)) + (decoupled ? " adamw" : " adam") +
                                       " unroll " + std::to_string(unroll) + " n " + std::to_string(n) + " offset " +
                                       std::to_string(offset) + (weight_group ? " weight" : " bias");
              expect_same_bits(want.w, got.w, what + " w");
              expect_same_bits(want.m, got.m, what + " m");
              expect_same_bits(want.v, got.v, what + " v");
            }
          }
        }
      }
    }
  }
  EXPECT_GT(targets, 0);
}

}  // namespace
}  // namespace renaissance
