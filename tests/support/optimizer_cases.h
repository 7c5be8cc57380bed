// Shared by the oracle, non-finite and determinism tests: the optimizer configurations that
// cover every kind (the SGD kinds in both weight-decay modes, all with wd > 0), deterministic
// host-side inputs, and helpers to run a Task and read back its whole state.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "audit/matrix.h"
#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "renaissance/task.h"
#include "support/test_util.h"

namespace renaissance {
namespace testing_util {

struct KindCase {
  std::string name;  // a gtest-safe name: letters, digits and '_'
  OptimizerConfig config;
};
// gtest prints parameters with this (found by ADL) instead of a hex dump.
inline void PrintTo(const KindCase& c, std::ostream* os) { *os << c.name; }

// Every kind with the kind table's reference hyperparameters (renaissance/kinds.h, shared with
// conformance and the fuzzers), the kinds that accept L2 weight decay in both modes. Why those
// values: weight decay is large enough (lr*wd = 5e-4 per step for SGD) that applying it to the
// wrong group, in the wrong mode, or not at all moves the weights by far more than the oracle
// tolerance; LARS uses tc/wd = 200 > 100 so that a tensor with tiny gradients (η ≈ tc/wd)
// reaches the clamp at 100; learning rates are small enough that no weight crosses zero during
// a test run (see element_sign below).
inline std::vector<KindCase> all_kind_cases() {
  std::vector<KindCase> cases;
  for (const KindInfo& info : kKindTable) {
    OptimizerConfig c = reference_config(info.kind);
    if (!info.allows_l2) {
      cases.push_back({info.name, c});
      continue;
    }
    cases.push_back({std::string(info.name) + "_decoupled", c});
    c.weight_decay_mode = WeightDecayMode::kL2;
    cases.push_back({std::string(info.name) + "_l2", c});
  }
  return cases;
}

// A (kind, backend) parameter: every kind case on every backend of the build.
struct KindBackendCase {
  KindCase kind;
  BackendKind backend;
};
inline void PrintTo(const KindBackendCase& c, std::ostream* os) { *os << c.kind.name << "/" << backend_kind_name(c.backend); }

inline std::vector<KindBackendCase> kind_backend_cases() {
  std::vector<KindBackendCase> cases;
  for (BackendKind b : backends_under_test()) {
    for (const KindCase& k : all_kind_cases()) cases.push_back({k, b});
  }
  return cases;
}
// gtest's name of a case: "adamw_cpu".
inline std::string kind_backend_case_name(const ::testing::TestParamInfo<KindBackendCase>& info) {
  return info.param.kind.name + "_" + backend_kind_name(info.param.backend);
}

// (backend, kind case) tuples, every backend of the build by every kind case, and their gtest
// names ("cpu_adamw"): the parameters of the suites that take both as a tuple.
using BackendKindTuple = std::tuple<BackendKind, KindCase>;
inline auto backend_kind_tuples() {
  return ::testing::Combine(::testing::ValuesIn(backends_under_test()), ::testing::ValuesIn(all_kind_cases()));
}
inline std::string backend_kind_tuple_name(const ::testing::TestParamInfo<BackendKindTuple>& info) {
  return std::string(backend_kind_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
}

// A kind with a norm pass (LARS, LAMB): N holds the weight group's per-tensor ratios.
inline bool is_lars(OptimizerKind k) { return kind_info(k).norm != NormPass::kNone; }
inline bool has_m(OptimizerKind k) { return kind_info(k).has_m; }
inline bool has_v(OptimizerKind k) { return kind_info(k).has_v; }

// Tensors of the given sizes, roles assigned round robin over all six roles.
inline std::vector<ParamSpec> layout_of_sizes(const std::vector<int64_t>& sizes, int role_offset = 0) {
  std::vector<ParamSpec> params;
  for (size_t i = 0; i < sizes.size(); ++i) {
    params.push_back({"p" + std::to_string(i), {sizes[i]}, static_cast<Role>((i + role_offset) % kNumRoles)});
  }
  return params;
}

// A counter-based uniform in [0, 1): the same value for the same (seed, a, b, c) on any machine.
inline double hash_unit(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + a * 0xd1b54a32d192ed03ULL + b * 0x8cb92ba72f3d8f75ULL + c;
  for (int r = 0; r < 2; ++r) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
  }
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);
}

// Sign of element i of tensor `tensor`: fixed for the whole run, shared by weights and
// gradients. With sign(w) = sign(g) in every step, no update ever subtracts two nearly equal
// numbers (m = β*m + g, ĝ + wd*w and w - lr*m all combine terms of one sign, and |w| stays far
// from 0), so float32 rounding stays at the level of a few ulps per operation and a relative
// error bound can be tight without flaky cancellation outliers in one-element tensors. The signs
// still vary from element to element, so sign mistakes in the library are not masked.
inline double element_sign(uint64_t tensor, uint64_t i) {
  return hash_unit(99, tensor, i, 0) < 0.5 ? -1.0 : 1.0;
}

// Initial weights: |w| in [1, 2) with the element's sign.
inline std::vector<std::vector<float>> make_weights(const std::vector<ParamSpec>& params, uint64_t seed) {
  std::vector<std::vector<float>> w(params.size());
  for (size_t id = 0; id < params.size(); ++id) {
    w[id].resize(static_cast<size_t>(params[id].numel()));
    for (size_t i = 0; i < w[id].size(); ++i) {
      w[id][i] = static_cast<float>(element_sign(id, i) * (1.0 + hash_unit(seed, 1, id, i)));
    }
  }
  return w;
}

// Gradients as the backward pass would store them: ĝ with |ĝ| in [0.1, 1) times the loss scale,
// rounded to float once.
inline std::vector<std::vector<float>> make_grads(const std::vector<ParamSpec>& params, uint64_t seed, uint64_t step,
                                                  double loss_scale) {
  std::vector<std::vector<float>> g(params.size());
  for (size_t id = 0; id < params.size(); ++id) {
    g[id].resize(static_cast<size_t>(params[id].numel()));
    for (size_t i = 0; i < g[id].size(); ++i) {
      const double unscaled = element_sign(id, i) * (0.1 + 0.9 * hash_unit(seed, 2 + step, id, i));
      g[id][i] = static_cast<float>(unscaled * loss_scale);
    }
  }
  return g;
}

// The whole per-element state of a task: W, M, V per tensor and N per weight-group tensor.
struct TaskState {
  std::vector<std::vector<float>> w, m, v;
  std::vector<float> n;  // one per param; only weight-group params of LARS kinds are read
  int64_t step_count = 0;
};

inline TaskState read_state(Task& task) {
  TaskState s;
  const OptimizerKind k = task.config().kind;
  const size_t np = task.num_params();
  s.w.resize(np);
  s.m.resize(np);
  s.v.resize(np);
  s.n.assign(np, 0.0f);
  for (size_t id = 0; id < np; ++id) {
    const size_t n = static_cast<size_t>(task.param(id).numel());
    s.w[id].resize(n);
    task.read(Family::kW, id, s.w[id].data());
    if (has_m(k)) {
      s.m[id].resize(n);
      task.read(Family::kM, id, s.m[id].data());
    }
    if (has_v(k)) {
      s.v[id].resize(n);
      task.read(Family::kV, id, s.v[id].data());
    }
    if (is_lars(k) && group_of(task.param(id).role) == Group::kWeight) task.read(Family::kN, id, &s.n[id]);
  }
  s.step_count = task.step_count();
  return s;
}

// Bitwise equality of two whole states, naming the first tensor that differs.
inline ::testing::AssertionResult same_state(const TaskState& a, const TaskState& b) {
  if (a.step_count != b.step_count) {
    return ::testing::AssertionFailure() << "step count " << a.step_count << " vs " << b.step_count;
  }
  for (size_t id = 0; id < a.w.size(); ++id) {
    const struct {
      const char* family;
      const std::vector<float>& x;
      const std::vector<float>& y;
    } pairs[] = {{"W", a.w[id], b.w[id]}, {"M", a.m[id], b.m[id]}, {"V", a.v[id], b.v[id]}};
    for (const auto& p : pairs) {
      ::testing::AssertionResult r = same_bits(p.x, p.y);
      if (!r) return ::testing::AssertionFailure() << p.family << " of param " << id << ": " << r.message();
    }
  }
  ::testing::AssertionResult r = same_bits(a.n, b.n);
  if (!r) return ::testing::AssertionFailure() << "N (trust ratios, indexed by param id): " << r.message();
  return ::testing::AssertionSuccess();
}

inline void set_all_weights(Task& task, const std::vector<std::vector<float>>& w) {
  for (size_t id = 0; id < w.size(); ++id) task.set_weight(id, w[id].data());
}
inline void set_all_grads(Task& task, const std::vector<std::vector<float>>& g) {
  for (size_t id = 0; id < g.size(); ++id) task.set_grad(id, g[id].data());
}

// `task` with the weights make_weights(params, seed) in every tensor.
inline std::unique_ptr<Task> with_made_weights(std::unique_ptr<Task> task, const std::vector<ParamSpec>& params,
                                               uint64_t seed) {
  set_all_weights(*task, make_weights(params, seed));
  return task;
}
// Step s of `task` on the gradients make_grads(params, seed, s, 1.0) (no loss scale).
inline void step_on_made_grads(Task& task, const std::vector<ParamSpec>& params, uint64_t seed, int s) {
  set_all_grads(task, make_grads(params, seed, static_cast<uint64_t>(s), 1.0));
  task.step();
}

// Hyperparameter group h's configuration for the group tests (test_hyper_groups.cc,
// test_tensor_mask.cc, ...): the conformance cells' recipe (audit/matrix.h).
using conformance::shifted_group_config;

}  // namespace testing_util
}  // namespace renaissance
