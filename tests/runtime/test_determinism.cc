// The reproducibility contract on the CPU (docs/reproducibility.md): W, M, V, N and t are bit-identical
// for 1, 2 and 7 OpenMP threads and for every Highway target that is both compiled in and
// supported by this machine, for every optimizer kind. The layout spans several 16384-element
// chunks (the OpenMP work item) and several 4096-element LARS tiles, with odd sizes so that
// chunk, tile and SIMD remainders all occur. (CUDA reproducing the CPU's bits: every cell of the
// conformance suite, conformance/README.md.)
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "renaissance/task.h"
#include "support/optimizer_cases.h"
#include "support/simd_targets.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::KindCase;
using testing_util::TaskState;

std::vector<ParamSpec> layout() {
  // 16384*3+5 spans four chunks; 4096*5+1 spans six LARS tiles (the last one element long).
  return {{"a", {3}, Role::kBnBias},           {"b", {16384 * 3 + 5}, Role::kDeepConv},
          {"c", {1023}, Role::kBnWeight},      {"d", {4096 * 5 + 1}, Role::kFcWeight},
          {"e", {17}, Role::kFirstConv},       {"f", {0}, Role::kFcWeight},
          {"g", {16385}, Role::kFcBias},       {"h", {4095}, Role::kDeepConv},
          {"i", {1}, Role::kFirstConv},        {"j", {12289}, Role::kFirstConv}};
}

// Runs four steps (lr schedule, loss scale with an inexact inverse) and returns the state.
TaskState run(const KindCase& kc, BackendKind backend, int threads, std::string* described = nullptr) {
  const std::vector<ParamSpec> params = layout();
  TaskOptions options;
  options.backend = backend;
  options.backend_options.threads = threads;
  Task task(params, options);
  task.optimizer(kc.config);
  task.compile();
  if (described != nullptr) *described = task.backend().describe();
  testing_util::set_all_weights(task, testing_util::make_weights(params, 21));
  const double lr_factor[] = {1.0, 0.7, 1.3, 0.4};
  for (int s = 0; s < 4; ++s) {
    task.set_lr(kc.config.lr * lr_factor[s]);
    task.set_loss_scale(1000.0);
    testing_util::set_all_grads(task, testing_util::make_grads(params, 23, static_cast<uint64_t>(s), 1000.0));
    task.step();
  }
  return testing_util::read_state(task);
}

class DeterminismTest : public ::testing::TestWithParam<KindCase> {};

TEST_P(DeterminismTest, ThreadCountsAreBitIdentical) {
  const TaskState one = run(GetParam(), BackendKind::kCpu, 1);
  ASSERT_EQ(one.step_count, 4);
  for (int threads : {2, 7}) {
    EXPECT_TRUE(testing_util::same_state(run(GetParam(), BackendKind::kCpu, threads), one))
        << threads << " threads vs 1 thread";
  }
}

TEST_P(DeterminismTest, HighwayTargetsAreBitIdentical) {
  const TaskState reference = run(GetParam(), BackendKind::kCpu, 1);
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  std::ostringstream exercised;
  for (int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    // Restrict dispatch to this one target; every HWY_DYNAMIC_DISPATCH then picks it.
    std::string described;
    TaskState got;
    {
      const testing_util::OnlySimdTarget only(target);
      got = run(GetParam(), BackendKind::kCpu, 2, &described);
    }
    // The backend reports the target its dispatcher picked: proof that the mock took effect.
    EXPECT_NE(described.find(hwy::TargetName(target)), std::string::npos) << "backend says: " << described;
    EXPECT_TRUE(testing_util::same_state(got, reference)) << hwy::TargetName(target) << " vs the default target";
    exercised << (exercised.tellp() > 0 ? " " : "") << hwy::TargetName(target);
  }
  RecordProperty("highway_targets", exercised.str());
  std::cout << "[determinism] " << GetParam().name << ": Highway targets exercised: " << exercised.str() << std::endl;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, DeterminismTest, ::testing::ValuesIn(testing_util::all_kind_cases()),
                         [](const ::testing::TestParamInfo<KindCase>& info) { return info.param.name; });

}  // namespace
}  // namespace renaissance
