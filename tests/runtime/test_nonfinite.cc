// Non-finite gradients (docs/math.md): NaN, +Inf or -Inf anywhere in G skips the whole step.
// W, M, V, N and the step count stay bit-for-bit unchanged, skipped_steps()/last_step_skipped()
// report it, and the next clean step is bit-identical to a run that never saw the bad batch
// (so the device-side t and bias corrections were not advanced either). All kinds, all backends.
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "renaissance/task.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::KindCase;
using testing_util::TaskState;

// The first tensor (id 0, bn_bias: the first span of the G region) and the last one (deep_conv:
// the last span) sit at the two ends of the check's range; the middle one is in the weight group
// and spans several 16384-element chunks. Sizes are odd so the bad element often falls in a SIMD
// remainder.
std::vector<ParamSpec> layout() {
  return {{"first", {7}, Role::kBnBias},        {"b1", {1023}, Role::kFcBias},
          {"w1", {17}, Role::kFcWeight},        {"b2", {4097}, Role::kBnWeight},
          {"middle", {40001}, Role::kFcWeight}, {"w2", {16}, Role::kFirstConv},
          {"b3", {3}, Role::kBnBias},           {"w3", {0}, Role::kDeepConv},
          {"last", {20003}, Role::kDeepConv}};
}

constexpr double kScale = 1024.0;

class NonFiniteTest : public ::testing::TestWithParam<std::tuple<BackendKind, KindCase>> {
 protected:
  std::unique_ptr<Task> make_task(const std::vector<ParamSpec>& params) {
    TaskOptions options;
    options.backend = std::get<0>(GetParam());
    auto task = std::make_unique<Task>(params, options);
    task->optimizer(std::get<1>(GetParam()).config);
    task->compile();
    task->set_loss_scale(kScale);
    testing_util::set_all_weights(*task, testing_util::make_weights(params, 3));
    return task;
  }
  // The layout, the clean run and the run under test.
  struct Runs {
    std::vector<ParamSpec> params;
    std::unique_ptr<Task> clean, task;
  };
  Runs clean_and_tested() {
    Runs r{layout(), nullptr, nullptr};
    r.clean = make_task(r.params);
    r.task = make_task(r.params);
    return r;
  }
  static void clean_step(Task& task, const std::vector<ParamSpec>& params, uint64_t s) {
    testing_util::set_all_grads(task, testing_util::make_grads(params, 11, s, kScale));
    task.step();
  }
};

TEST_P(NonFiniteTest, SkipsTheWholeStepAndResumesAsIfItNeverHappened) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const std::vector<ParamSpec> params = layout();
  const size_t first = 0, middle = 4, last = params.size() - 1;

  // The run that never sees a bad batch: three clean steps.
  std::unique_ptr<Task> clean = make_task(params);
  for (uint64_t s = 0; s < 3; ++s) clean_step(*clean, params, s);
  const TaskState want = testing_util::read_state(*clean);
  ASSERT_EQ(want.step_count, 3);

  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  const struct {
    const char* name;
    float value;
  } values[] = {{"NaN", kNaN}, {"+Inf", kInf}, {"-Inf", -kInf}};
  // Where the bad element goes: the first element of the first tensor, the middle of a middle
  // tensor, the very last element of the G region.
  const struct {
    const char* name;
    size_t id;
    size_t element;
  } places[] = {{"first tensor, element 0", first, 0},
                {"middle tensor, middle element", middle, 20000},
                {"last tensor, last element", last, 20002}};

  for (const auto& value : values) {
    for (const auto& place : places) {
      SCOPED_TRACE(std::string(value.name) + " in the " + place.name);
      std::unique_ptr<Task> task = make_task(params);
      // Two clean steps first, so M, V, N and t hold non-trivial values worth protecting.
      clean_step(*task, params, 0);
      clean_step(*task, params, 1);
      const TaskState before = testing_util::read_state(*task);
      ASSERT_EQ(before.step_count, 2);
      ASSERT_EQ(task->skipped_steps(), 0);
      ASSERT_FALSE(task->last_step_skipped());

      // The bad batch: step 2's gradients with one element replaced.
      std::vector<std::vector<float>> bad = testing_util::make_grads(params, 11, 2, kScale);
      bad[place.id][place.element] = value.value;
      testing_util::set_all_grads(*task, bad);
      task->step();
      EXPECT_TRUE(task->last_step_skipped());
      EXPECT_EQ(task->skipped_steps(), 1);
      EXPECT_TRUE(testing_util::same_state(testing_util::read_state(*task), before))
          << "the skipped step changed the state";

      // The same step's clean gradients: must land exactly where the clean run is.
      clean_step(*task, params, 2);
      EXPECT_FALSE(task->last_step_skipped());
      EXPECT_EQ(task->skipped_steps(), 1);
      EXPECT_TRUE(testing_util::same_state(testing_util::read_state(*task), want))
          << "the step after a skipped one differs from a run that never saw the bad batch";
      if (HasFailure()) return;
    }
  }
}

// Several bad batches in a row, then clean ones: the skip counter counts each, t none of them.
// A step the caller skips without running it (a loss scaler's verdict): counted, and nothing
// else of the state moves; the next step is the clean run's.
TEST_P(NonFiniteTest, CallerSkippedStepIsCountedAndLeavesNoTrace) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  auto [params, clean, task] = clean_and_tested();
  for (uint64_t s = 0; s < 2; ++s) {
    clean_step(*clean, params, s);
    clean_step(*task, params, s);
  }
  const TaskState before = testing_util::read_state(*task);
  task->count_skipped_step();
  task->count_skipped_step();
  EXPECT_EQ(task->skipped_steps(), 2);
  EXPECT_FALSE(task->last_step_skipped());
  EXPECT_TRUE(testing_util::same_state(testing_util::read_state(*task), before));
  clean_step(*clean, params, 2);
  clean_step(*task, params, 2);
  EXPECT_EQ(task->skipped_steps(), 2);
  EXPECT_EQ(task->fingerprint(), clean->fingerprint());
}

TEST_P(NonFiniteTest, ConsecutiveSkipsAreCountedAndLeaveNoTrace) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  auto [params, clean, task] = clean_and_tested();
  for (uint64_t s = 0; s < 4; ++s) {
    clean_step(*clean, params, s);
    if (s == 1) {
      for (int k = 0; k < 3; ++k) {
        std::vector<std::vector<float>> bad = testing_util::make_grads(params, 11, s, kScale);
        bad[k][0] = std::numeric_limits<float>::quiet_NaN();  // tensors 0, 1, 2 in turn
        testing_util::set_all_grads(*task, bad);
        task->step();
        ASSERT_TRUE(task->last_step_skipped());
      }
    }
    clean_step(*task, params, s);
    ASSERT_FALSE(task->last_step_skipped());
  }
  EXPECT_EQ(task->skipped_steps(), 3);
  EXPECT_EQ(clean->skipped_steps(), 0);
  EXPECT_TRUE(testing_util::same_state(testing_util::read_state(*task), testing_util::read_state(*clean)));
}

INSTANTIATE_TEST_SUITE_P(AllKinds, NonFiniteTest,
                         testing_util::backend_kind_tuples(), testing_util::backend_kind_tuple_name);

}  // namespace
}  // namespace renaissance
