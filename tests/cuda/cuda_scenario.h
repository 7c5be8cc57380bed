// The CUDA-against-CPU scenarios of tests/cuda: a parameter set with odd sizes, a Task run on one
// backend for a few steps (synthetic gradients under a loss scale, an optional hook before each
// step) and its state read back, and the bit-for-bit comparison of two such snapshots.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "renaissance/backend.h"
#include "renaissance/math/synthetic_gradient.h"
#include "renaissance/task.h"
#include "support/test_util.h"

namespace renaissance {
namespace cuda_scenario {

// Odd sizes: zero-size, one-element and scalar tensors, sizes just past powers of two.
inline std::vector<ParamSpec> odd_params() {
  return {{"a", {3, 5}, Role::kDeepConv},      {"b", {7}, Role::kBnBias},         {"c", {0}, Role::kFcWeight},
          {"d", {17}, Role::kBnWeight},        {"e", {1}, Role::kFcBias},         {"f", {4097}, Role::kFirstConv},
          {"g", {1023}, Role::kDeepConv},      {"h", {0, 3}, Role::kBnBias},      {"i", {2, 4099}, Role::kFcWeight},
          {"j", {12289}, Role::kDeepConv},     {"k", {}, Role::kDeepConv},        {"l", {65, 3}, Role::kBnWeight},
          {"m", {3, 3, 3, 331}, Role::kDeepConv}};
}

struct Snapshot {
  std::vector<float> w, m, v, n;
  int64_t steps = 0;
  int64_t skipped = 0;
  std::string fingerprint;
};

// Called after the step's gradients are written and before step(): may change lr or the loss
// scale or poison a gradient.
using StepHook = std::function<void(Task&, int step)>;

struct Scenario {
  std::vector<ParamSpec> params;
  OptimizerConfig config;
  int steps = 3;
  double loss_scale = 1024.0;
  bool check_finite = true;
  StepHook hook;
  std::vector<OptimizerConfig> groups;  // non-empty: hyperparameter groups instead of `config`
};

// Weights: synthetic values of magnitude up to 1, except every 5th tensor, which starts at zero
// (LARS then takes its η = 1 branch).
inline void init_weights(Task& task) {
  for (size_t id = 0; id < task.num_params(); ++id) {
    const auto n = static_cast<size_t>(task.param(id).numel());
    std::vector<float> w(n, 0.0f);
    if (id % 5 != 3) {
      for (size_t i = 0; i < n; ++i) w[i] = math::synthetic_gradient(99, 0, id, i, 1.0f);
    }
    task.set_weight(id, w.data());
  }
}

inline void append(Task& task, Family family, std::vector<float>* out) {
  if (!task.plan().has_family(family)) return;
  for (size_t id = 0; id < task.num_params(); ++id) {
    const size_t n = family == Family::kN ? 1 : static_cast<size_t>(task.param(id).numel());
    if (n == 0) continue;
    const size_t at = out->size();
    out->resize(at + n);
    task.read(family, id, out->data() + at);
  }
}

inline Snapshot snapshot(Task& task) {
  Snapshot s;
  append(task, Family::kW, &s.w);
  append(task, Family::kM, &s.m);
  append(task, Family::kV, &s.v);
  append(task, Family::kN, &s.n);
  s.steps = task.step_count();
  s.skipped = task.skipped_steps();
  s.fingerprint = task.fingerprint();
  return s;
}

inline Snapshot run(BackendKind kind, const Scenario& sc, const BackendOptions& backend_options = {}) {
  TaskOptions options;
  options.backend = kind;
  options.backend_options = backend_options;
  options.check_finite = sc.check_finite;
  Task task(sc.params, options);
  if (sc.groups.empty()) {
    task.optimizer(sc.config);
  } else {
    task.optimizer_groups(sc.groups);
  }
  task.set_loss_scale(sc.loss_scale);
  task.compile();
  init_weights(task);
  for (int step = 0; step < sc.steps; ++step) {
    // Gradients as a backward pass under loss scaling would leave them: scaled up.
    task.synthesize_gradients(2024, static_cast<uint64_t>(step), static_cast<float>(0.05 * sc.loss_scale));
    if (sc.hook) sc.hook(task, step);
    task.step();
  }
  return snapshot(task);
}

inline void expect_same(const Snapshot& cpu, const Snapshot& gpu) {
  EXPECT_TRUE(testing_util::same_bits(cpu.w, gpu.w)) << "W";
  EXPECT_TRUE(testing_util::same_bits(cpu.m, gpu.m)) << "M";
  EXPECT_TRUE(testing_util::same_bits(cpu.v, gpu.v)) << "V";
  EXPECT_TRUE(testing_util::same_bits(cpu.n, gpu.n)) << "N (LARS trust ratios)";
  EXPECT_EQ(cpu.steps, gpu.steps);
  EXPECT_EQ(cpu.skipped, gpu.skipped);
  EXPECT_EQ(cpu.fingerprint, gpu.fingerprint);
}

// TaskOptions on `kind`, all else their defaults.
inline TaskOptions backend_task_options(BackendKind kind) {
  TaskOptions options;
  options.backend = kind;
  return options;
}

}  // namespace cuda_scenario
}  // namespace renaissance
