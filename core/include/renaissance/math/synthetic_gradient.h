// Counter-based synthetic gradients for `renaissance run`, the benchmarks and the conformance
// suite: element i of tensor k at step s is a pure function of (seed, s, k, i), computed with
// integer hashing and one exact float conversion and one IEEE multiply, so every backend
// generates the same bits where the data lives.
#pragma once

#include <cstdint>

#include "renaissance/math/host_device.h"

namespace renaissance {
namespace math {

// SplitMix64's finaliser: a bijective 64-bit mix.
RN_HD uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A value uniform on [-amplitude, amplitude) in steps of amplitude * 2^-23.
RN_HD float synthetic_gradient(uint64_t seed, uint64_t step, uint64_t tensor, uint64_t index,
                               float amplitude) {
  const uint64_t h = mix64(mix64(mix64(seed ^ 0x52454e4149535341ULL) + step) + (tensor << 40) + index);
  const int32_t centred = static_cast<int32_t>(h >> 40) - (1 << 23);  // 24 bits, centred: exact in float
  const float unit = amplitude * (1.0f / 8388608.0f);                 // amplitude * 2^-23
  return static_cast<float>(centred) * unit;
}

}  // namespace math
}  // namespace renaissance
