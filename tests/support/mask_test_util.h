// What the per-tensor mask tests share (test_tensor_mask*.cc, test_hyper_groups.cc): weights and
// gradients seeded by a parameter's name (so every Task of a comparison, whatever its layout,
// gets the same values) and a bitwise snapshot of one tensor's W, M, V and model copy.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "renaissance/task.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace testing_util {

// FNV-1a of the name: the seed of that parameter's values.
inline uint32_t name_seed(const std::string& name) {
  uint32_t h = 2166136261u;
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 16777619u;
  return h;
}
inline std::vector<float> named_weights(const ParamSpec& p) { return lcg_values(name_seed(p.name), p.numel(), 0.5f); }
// The gradient of parameter p at step `step` (0-based).
inline std::vector<float> named_grads(const ParamSpec& p, int step) {
  return lcg_values(name_seed(p.name) + 1000u * static_cast<uint32_t>(step + 1), p.numel(), 4.0f);
}

// A cell of the mask tests that sweep kinds x precisions x backends.
struct KindPrecisionCase {
  KindCase kind;
  Precision precision;
  BackendKind backend;
};
inline void PrintTo(const KindPrecisionCase& c, std::ostream* os) {
  *os << c.kind.name << "/" << precision_name(c.precision) << "/" << backend_kind_name(c.backend);
}

// TaskOptions of a case: its backend (two threads), the mask on or off, its precision with the
// gradients in the model dtype where there is a model copy.
inline TaskOptions kind_precision_options(const KindPrecisionCase& c, bool mask) {
  TaskOptions o = task_options(c.backend, mask);
  o.precision.precision = c.precision;
  o.precision.model_dtype_gradients = c.precision != Precision::kFp32;
  return o;
}

// Every kind case in each of `precisions` on every backend of the build.
inline std::vector<KindPrecisionCase> kind_precision_cases(std::initializer_list<Precision> precisions) {
  std::vector<KindPrecisionCase> cases;
  for (BackendKind b : backends_under_test()) {
    for (const KindCase& k : all_kind_cases()) {
      for (Precision p : precisions) cases.push_back({k, p, b});
    }
  }
  return cases;
}
// gtest's name of a case: "adamw_bf16_cpu".
inline std::string kind_precision_case_name(const ::testing::TestParamInfo<KindPrecisionCase>& info) {
  return info.param.kind.name + "_" + precision_name(info.param.precision) + "_" + backend_kind_name(info.param.backend);
}

// W, then M and V where the kind has them, as floats, and the model copy's encodings (if any),
// of tensor id.
struct TensorSnapshot {
  std::vector<std::vector<float>> families;
  std::vector<uint16_t> copy;
};
inline const Family kSnapshotFamilies[] = {Family::kW, Family::kM, Family::kV};
inline TensorSnapshot snapshot_tensor(Task& task, size_t id) {
  TensorSnapshot s;
  for (Family f : kSnapshotFamilies) {
    if (!task.plan().has_family(f)) continue;
    std::vector<float> v(static_cast<size_t>(task.param(id).numel()));
    task.read(f, id, v.data());
    s.families.push_back(v);
  }
  if (task.plan().has_model_copy()) {
    s.copy.resize(static_cast<size_t>(task.param(id).numel()));
    task.read_model_copy(id, s.copy.data());
  }
  return s;
}
inline ::testing::AssertionResult same_snapshot(const TensorSnapshot& a, const TensorSnapshot& b) {
  if (a.families.size() != b.families.size()) return ::testing::AssertionFailure() << "different families";
  for (size_t k = 0; k < a.families.size(); ++k) {
    auto r = same_bits(a.families[k], b.families[k]);
    if (!r) return r << " (family " << k << ")";
  }
  if (a.copy != b.copy) return ::testing::AssertionFailure() << "model copies differ";
  return ::testing::AssertionSuccess();
}

}  // namespace testing_util
}  // namespace renaissance
