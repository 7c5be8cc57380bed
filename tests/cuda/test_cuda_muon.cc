// Muon on the CUDA backend against the CPU backend (docs/reproducibility.md): the captured step's
// launches with the Newton–Schulz batched by shape class or one matrix after another, a change of
// ns_steps between steps, the batches' bits against the CPU's, and the per-phase timer
// (cuda::phase_times) running the step's own kernels. Without a CUDA device every test skips with
// the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "renaissance/backend.h"
#include "renaissance/error.h"
#include "renaissance/task.h"
#include "support/test_util.h"
#include "cuda/cuda_scenario.h"
#if RENAISSANCE_WITH_CUDA
#include "backend_cuda/cuda_backend.h"
#endif

namespace renaissance {
namespace {

using namespace cuda_scenario;

// The nodes of the captured step on CUDA of Muon's reference configuration for `params`, the
// Newton–Schulz of a shape class batched or not (BackendOptions::cuda_muon_batches).
int muon_launches_per_step(const std::vector<ParamSpec>& params, bool batches) {
  TaskOptions options;
  options.backend = BackendKind::kCuda;
  options.backend_options.cuda_muon_batches = batches;
  Task task(params, options);
  task.optimizer(reference_config(OptimizerKind::kMuon));
  task.compile();
  return task.backend().launches_per_step();
}

// ---- tests ----

// Muon's step with cuda_muon_batches off captures the Newton–Schulz launches of each non-empty
// matrix: one more matrix, more nodes; a change of ns_steps is captured again (more steps,
// more nodes) and the step still runs.
TEST(CudaBackend, MuonLaunchesGrowWithTheMatrices) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  std::vector<ParamSpec> params = {{"a", {8, 12}, Role::kFcWeight}, {"b", {12}, Role::kFcBias}};
  const int one = muon_launches_per_step(params, false);
  params.push_back({"c", {6, 4}, Role::kDeepConv});
  EXPECT_GT(muon_launches_per_step(params, false), one);
}

// ns_steps is the number of Newton–Schulz launches in the captured graph: setting it between
// steps captures the step again (fewer nodes for fewer steps) and keeps CPU == CUDA bit for bit,
// with and without CUDA graphs.
TEST(CudaBackend, MuonNsStepsChangeBetweenSteps) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  Scenario sc;
  sc.params = odd_params();
  sc.config = reference_config(OptimizerKind::kMuon);
  sc.steps = 4;
  sc.hook = [](Task& task, int step) {
    if (step != 2) return;
    OptimizerConfig c = task.config();
    c.ns_steps = 2;
    const int before = task.backend().launches_per_step();
    task.set_group_hyper(0, c);
    task.step();  // captured again with 2 steps, then run
    if (task.backend().kind() == BackendKind::kCuda && before > 0) {
      EXPECT_LT(task.backend().launches_per_step(), before);
    }
  };
  const Snapshot cpu = run(BackendKind::kCpu, sc);
  expect_same(cpu, run(BackendKind::kCuda, sc));
  BackendOptions no_graph;
  no_graph.cuda_graph = false;
  expect_same(cpu, run(BackendKind::kCuda, sc, no_graph));
}

// BackendOptions::cuda_muon_batches (the default): the Newton–Schulz of each shape class (both
// orientations, several matrices, a second class, hyperparameter groups that split a class) runs
// as cuBLASLt batches and gives the CPU's bits, with and without CUDA graphs, as does the path of
// one matrix after another; the captured step's node count then depends on the classes, not on
// the number of matrices in them.
TEST(CudaBackend, MuonBatchesGiveTheCpuBits) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  Scenario sc;
  sc.params = {{"a", {16, 48}, Role::kFcWeight}, {"b", {48, 16}, Role::kFcWeight}, {"bias", {48}, Role::kFcBias},
               {"c", {16, 48}, Role::kFcWeight}, {"d", {24, 24}, Role::kDeepConv}, {"e", {8, 3, 2, 2}, Role::kDeepConv},
               {"f", {24, 24}, Role::kFcWeight}};
  sc.config = reference_config(OptimizerKind::kMuon);
  sc.steps = 3;
  const Snapshot cpu = run(BackendKind::kCpu, sc);
  BackendOptions batches;
  batches.cuda_muon_batches = true;
  expect_same(cpu, run(BackendKind::kCuda, sc, batches));
  batches.cuda_graph = false;
  expect_same(cpu, run(BackendKind::kCuda, sc, batches));
  BackendOptions one_by_one;
  one_by_one.cuda_muon_batches = false;
  expect_same(cpu, run(BackendKind::kCuda, sc, one_by_one));
  // Hyperparameter groups: "c" in group 1 is a class of its own (its block's coefficients).
  sc.params[3].hyper_group = 1;
  OptimizerConfig other = sc.config;
  other.ns_a = 2.0;
  other.ns_b = -1.5;
  other.ns_c = 0.5;
  other.ns_steps = 3;
  sc.groups = {sc.config, other};
  const Snapshot cpu_groups = run(BackendKind::kCpu, sc);
  batches.cuda_graph = true;
  expect_same(cpu_groups, run(BackendKind::kCuda, sc, batches));
}

TEST(CudaBackend, MuonBatchLaunchesDoNotGrowWithMatricesOfOneClass) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  auto nodes_for = [](int matrices) {
    std::vector<ParamSpec> params = {{"bias", {12}, Role::kFcBias}};
    for (int i = 0; i < matrices; ++i) {
      params.push_back({"m" + std::to_string(i), i % 2 ? std::vector<int64_t>{32, 8} : std::vector<int64_t>{8, 32},
                        Role::kFcWeight});
    }
    return muon_launches_per_step(params, true);
  };
  const int two = nodes_for(2);
  EXPECT_GT(two, 0);
  EXPECT_EQ(nodes_for(7), two);
}

// cuda::phase_times (bench_step --muon-phases) runs the step's own kernels node by node on one
// stream, outside the graph: two steps profiled leave the bits of two steps launched as the graph,
// and the table has a row per node and per Newton–Schulz phase of each shape class, in the order
// they run, each a finite time >= 0. Every class is batched, so each ends in "store + update" (the
// update applied as X leaves the scratch) and UPDATE_MUON's row, after them, launches nothing.
TEST(CudaBackend, MuonPhaseTimesRunTheStepsKernelsAndNameEveryPhase) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  const std::vector<ParamSpec> params = {{"a", {16, 48}, Role::kFcWeight}, {"b", {48, 16}, Role::kFcWeight},
                                         {"bias", {48}, Role::kFcBias}, {"d", {24, 24}, Role::kDeepConv}};
  auto prepared = [&](Task& task) {
    task.optimizer(reference_config(OptimizerKind::kMuon));
    task.compile();
    init_weights(task);
    task.synthesize_gradients(2024, 0, 0.05f);
    task.step();  // prepares the program step_program() names
  };
  TaskOptions options;
  options.backend = BackendKind::kCuda;
  options.backend_options.cuda_muon_batches = true;
  Task graph(params, options), profiled(params, options);
  prepared(graph);
  prepared(profiled);
  (void)graph.backend().timed_steps(graph.step_program(), 2);
  const std::vector<cuda::PhaseTime> phases = cuda::phase_times(profiled.backend(), profiled.step_program(), 2, 0.0);
  expect_same(snapshot(graph), snapshot(profiled));

  std::vector<std::string> names;
  for (const cuda::PhaseTime& p : phases) {
    names.push_back(p.name);
    EXPECT_TRUE(std::isfinite(p.ms) && p.ms >= 0.0) << p.name << ": " << p.ms;
  }
  auto at = [&](const std::string& name) {
    const auto it = std::find(names.begin(), names.end(), name);
    EXPECT_NE(it, names.end()) << "no row " << name;
    return it - names.begin();
  };
  EXPECT_EQ(std::count(names.begin(), names.end(), "MUON_MOMENTUM [weight]"), 1);
  const auto momentum = at("MUON_MOMENTUM [weight]");
  const auto lr = at("MUON_ORTHOGONALIZE: adjusted lr");
  const auto update = at("UPDATE_MUON [weight]");
  EXPECT_LT(momentum, lr);
  // B's operand O is formed by A's combine, so B has no conversion of its own.
  const std::vector<std::string> exact = {"normalise",        "A: scales+digits", "A: int8 products",
                                          "A: combine",       "B: int8 products", "B: combine",
                                          "Q: scales+digits", "Q: int8 products", "Q: combine",
                                          "store + update"};
  for (const std::string& cls : {std::string("ns 16x48 (2): "), std::string("ns 24x24 (1): ")}) {
    auto previous = lr;
    for (const std::string& phase : exact) {
      const auto here = at(cls + phase);
      EXPECT_GT(here, previous) << cls + phase;
      EXPECT_LT(here, update) << cls + phase;
      previous = here;
    }
  }
  // The auxiliary AdamW of the bias-like tensor has a row of its own.
  EXPECT_NE(std::find_if(names.begin(), names.end(),
                         [](const std::string& n) { return n.find("bias-like") != std::string::npos; }),
            names.end());
  EXPECT_THROW(cuda::phase_times(profiled.backend(), profiled.step_program(), 0), Error);
#endif
}

}  // namespace
}  // namespace renaissance
