// Helpers shared by the unit tests: which backends to run, bit-pattern comparison, where the
// repository's own test data lives (testdata/, data/layouts/).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "renaissance/backend.h"
#include "renaissance/task.h"

namespace renaissance {
namespace testing_util {

// Every backend this build has; tests instantiate over these and skip CUDA without a device.
inline std::vector<BackendKind> backends_under_test() {
#if RENAISSANCE_WITH_CUDA
  return {BackendKind::kCpu, BackendKind::kCuda};
#else
  return {BackendKind::kCpu};
#endif
}

// TaskOptions on the CPU backend, everything else default (the replay tests' reference Tasks).
inline TaskOptions cpu_task_options() {
  TaskOptions o;
  o.backend = BackendKind::kCpu;
  return o;
}

inline std::string backend_param_name(const ::testing::TestParamInfo<BackendKind>& info) {
  return backend_kind_name(info.param);
}

// Skips the current test (with the reason) when `kind` cannot run on this machine.
#define RN_SKIP_IF_UNAVAILABLE(kind)                                                        \
  do {                                                                                      \
    if (!::renaissance::backend_available(kind)) {                                          \
      GTEST_SKIP() << "backend " << ::renaissance::backend_kind_name(kind)                  \
                   << " is not available on this machine (no CUDA device or no CUDA build)"; \
    }                                                                                       \
  } while (0)

inline uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// Compares bit patterns (NaN payloads and signed zeros included); reports the first mismatch.
inline ::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << a.size() << " vs " << b.size();
  }
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (float_bits(a[i]) != float_bits(b[i])) {
      if (mismatches++ == 0) first = i;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatches << " of " << a.size() << " elements differ; first at " << first
                                       << ": " << a[first] << " vs " << b[first];
}

// The repository root and its testdata/ folder (set by tests/CMakeLists.txt): tests read only
// files that a clone of the repository has.
// Deterministic values in [-a, a) from a small LCG keyed by `seed` (the tests own their data;
// `offset` picks another stream of the same generator).
inline std::vector<float> lcg_values(uint32_t seed, int64_t n, float a, uint32_t offset = 12345u) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + offset;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = a * (static_cast<float>(s >> 8) / 8388608.0f - 1.0f);
  }
  return v;
}

inline std::string source_dir() { return RENAISSANCE_SOURCE_DIR; }
inline std::string testdata_dir() { return RENAISSANCE_TESTDATA_DIR; }

}  // namespace testing_util
}  // namespace renaissance
