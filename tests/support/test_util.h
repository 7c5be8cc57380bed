// Helpers shared by the unit tests: which backends to run, bit-pattern comparison, where the
// repository's own test data lives (testdata/, data/layouts/).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <memory>
#include <sstream>
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

// gtest's name of a parameter that operator<< prints as a gtest-safe name.
template <typename Param>
std::string streamed_param_name(const ::testing::TestParamInfo<Param>& info) {
  std::ostringstream os;
  os << info.param;
  return os.str();
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

// A path under gtest's temporary directory unique to this process ("rn-<pid>-name"): two test
// runs on one machine (two build trees, parallel jobs) never share a checkpoint or case folder.
inline std::string unique_temp_path(const std::string& name) {
  return ::testing::TempDir() + "rn-" + std::to_string(::getpid()) + "-" + name;
}

// A new empty folder made from a mkdtemp template ("/tmp/rn-name-XXXXXX"); "" (with a test
// failure) when it cannot be made.
inline std::string make_temp_dir(std::string tmpl) {
  if (::mkdtemp(&tmpl[0]) == nullptr) {
    ADD_FAILURE() << "mkdtemp(" << tmpl << ") failed";
    return "";
  }
  return tmpl;
}

// TaskOptions on `backend` with two CPU threads (a fixed, small team whatever the machine), the
// per-tensor mask on or off.
inline TaskOptions task_options(BackendKind backend, bool mask = false) {
  TaskOptions o;
  o.backend = backend;
  o.backend_options.threads = 2;
  o.tensor_mask = mask;
  return o;
}

// Family f of tensor id, as the task holds it.
inline std::vector<float> read_family(Task& task, Family f, size_t id) {
  std::vector<float> v(static_cast<size_t>(task.param(id).numel()));
  task.read(f, id, v.data());
  return v;
}

// `params` spread over `groups` hyperparameter groups: tensor i in group i % groups.
inline std::vector<ParamSpec> round_robin_groups(std::vector<ParamSpec> params, int groups) {
  for (size_t i = 0; i < params.size(); ++i) params[i].hyper_group = static_cast<int>(i) % groups;
  return params;
}

// The tensors of hyperparameter group h as a one-group layout (hyper_group 0) for a separate
// task; their ids in `params` are appended to *ids.
inline std::vector<ParamSpec> group_alone(const std::vector<ParamSpec>& params, int h, std::vector<size_t>* ids) {
  std::vector<ParamSpec> mine;
  for (size_t id = 0; id < params.size(); ++id) {
    if (params[id].hyper_group != h) continue;
    ids->push_back(id);
    mine.push_back(params[id]);
    mine.back().hyper_group = 0;
  }
  return mine;
}

// A task of hyperparameter groups against one separate task per group: W, M and V (those the
// plan has) of tensor ids[h][k] of `grouped` hold the bits of tensor k of separate[h].
inline void expect_groups_match_separate(Task& grouped, const std::vector<std::vector<size_t>>& ids,
                                         const std::vector<std::unique_ptr<Task>>& separate) {
  for (size_t h = 0; h < ids.size(); ++h) {
    for (size_t k = 0; k < ids[h].size(); ++k) {
      for (Family f : {Family::kW, Family::kM, Family::kV}) {
        if (!grouped.plan().has_family(f)) continue;
        EXPECT_TRUE(same_bits(read_family(grouped, f, ids[h][k]), read_family(*separate[h], f, k)))
            << "group " << h << " tensor " << grouped.param(ids[h][k]).name << " family " << family_name(f);
      }
    }
  }
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
