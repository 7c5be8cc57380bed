// TaskOptions::tensor_mask's two programs (task.h, graph.h: compile_unmasked_step): while no
// tensor was ever masked a mask task runs the program of a task without the mask, and switches
// to the masked program on the first step whose mask may be set. Checked here, for every kind
// the mask supports and every backend of the build (CUDA skips without a device):
// - the unmasked program has the masked program's bits on a mask of zeros (fp32 and a bf16 copy
//   rounded stochastically, one and two hyperparameter groups): the reference is a task forced
//   onto the masked program, itself checked against one-tensor tasks in test_tensor_mask.cc;
// - switching after unmasked steps keeps every tensor's count and bias corrections right, and the
//   task returns to the unmasked program when the counts are set equal again;
// - a checkpoint saved on either program resumes on the right one with the same bits;
// - the fingerprint covers the per-tensor counts where they differ from the task's count;
// - the unmasked program's nodes are the flagless ones (what makes it fast).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/task.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {


// Both groups, tensors over several work items and norm tiles, a scalar tensor.
std::vector<ParamSpec> program_params(int groups) {
  return testing_util::round_robin_groups(
      {
          {"conv1", {7, 3, 5, 5}, Role::kFirstConv}, {"bn1.w", {37}, Role::kBnWeight},
          {"bn1.b", {37}, Role::kBnBias},            {"conv2", {41000}, Role::kDeepConv},
          {"fc.w", {10, 129}, Role::kFcWeight},      {"fc.b", {10}, Role::kFcBias},
          {"bn2.w", {}, Role::kBnWeight},            {"fc2.w", {3, 17}, Role::kFcWeight},
      },
      groups);
}

std::vector<float> values_of(const ParamSpec& p, uint32_t salt, float a) {
  uint32_t h = 2166136261u;
  for (char ch : p.name) h = (h ^ static_cast<uint8_t>(ch)) * 16777619u;
  return testing_util::lcg_values(h + salt, p.numel(), a);
}

using ProgramCase = testing_util::KindBackendCase;

class TensorMaskProgramTest : public ::testing::TestWithParam<ProgramCase> {
 protected:
  std::unique_ptr<Task> make(int groups, Precision precision) const {
    TaskOptions o;
    o.backend = GetParam().backend;
    o.backend_options.threads = 2;
    o.tensor_mask = true;
    o.precision.precision = precision;
    if (precision != Precision::kFp32) o.precision.rounding = Rounding::kStochastic;
    o.precision.seed = 7;
    const std::vector<ParamSpec> params = program_params(groups);
    auto task = std::make_unique<Task>(params, o);
    std::vector<OptimizerConfig> configs;
    for (int h = 0; h < groups; ++h) configs.push_back(testing_util::shifted_group_config(GetParam().kind.config, h));
    task->optimizer_groups(configs);
    task->compile();
    task->set_loss_scale(4.0);
    for (size_t id = 0; id < params.size(); ++id) task->set_weight(id, values_of(params[id], 0, 0.5f).data());
    return task;
  }
  // The masked program from the first step on, with a mask of zeros: the task is told a mask
  // may be set.
  std::unique_ptr<Task> make_forced(int groups, Precision precision) const {
    auto task = make(groups, precision);
    task->tensor_mask_written(true);
    return task;
  }
  static void step(Task& task, int s, const std::vector<int32_t>* mask = nullptr) {
    for (size_t id = 0; id < task.num_params(); ++id) {
      task.set_grad(id, values_of(task.param(id), 1000u * static_cast<uint32_t>(s + 1), 4.0f).data());
    }
    if (mask != nullptr) task.set_tensor_mask(*mask);
    task.step();
  }
};

TEST_P(TensorMaskProgramTest, UnmaskedProgramHasTheMaskedProgramsBits) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  for (int groups : {1, 2}) {
    for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
      SCOPED_TRACE(std::to_string(groups) + " group(s), " + precision_name(precision));
      auto fast = make(groups, precision);
      auto forced = make_forced(groups, precision);
      for (int s = 0; s < 3; ++s) {
        EXPECT_FALSE(fast->masked_program_next());
        EXPECT_TRUE(forced->masked_program_next());
        step(*fast, s);
        step(*forced, s);
      }
      EXPECT_EQ(fast->fingerprint(), forced->fingerprint());
      EXPECT_EQ(fast->tensor_steps(), std::vector<int64_t>(fast->num_params(), 3));
      EXPECT_EQ(forced->tensor_steps(), fast->tensor_steps());
    }
  }
}

// Three unmasked steps, then a mask (tensor 3 and 5 skip a step), then none again: the counts and
// corrections the unmasked program kept advancing are what the masked program needs. The
// reference took every step on the masked program. Equal counts again bring back the unmasked
// program, with the same bits as the reference.
TEST_P(TensorMaskProgramTest, SwitchingProgramsKeepsCountsAndBits) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  for (int groups : {1, 2}) {
    const Precision precision = groups == 1 ? Precision::kBf16 : Precision::kFp32;
    SCOPED_TRACE(std::to_string(groups) + " group(s), " + precision_name(precision));
    auto fast = make(groups, precision);
    auto forced = make_forced(groups, precision);
    const size_t n = fast->num_params();
    std::vector<int32_t> none(n, 0), some(n, 0);
    some[3] = some[5] = 1;
    for (int s = 0; s < 3; ++s) {
      step(*fast, s, &none);  // a mask of zeros written: still the unmasked program
      step(*forced, s);
    }
    EXPECT_FALSE(fast->masked_program_next());
    step(*fast, 3, &some);
    step(*forced, 3, &some);
    EXPECT_TRUE(fast->masked_program_next()) << "tensors 3 and 5 are a step behind";
    for (int s = 4; s < 6; ++s) {
      step(*fast, s, &none);
      step(*forced, s, &none);
      EXPECT_TRUE(fast->masked_program_next());
    }
    std::vector<int64_t> want(n, 6);
    want[3] = want[5] = 5;
    EXPECT_EQ(fast->tensor_steps(), want);
    EXPECT_EQ(forced->tensor_steps(), want);
    EXPECT_EQ(fast->fingerprint(), forced->fingerprint());
    fast->set_step_count(6);
    forced->set_step_count(6);
    EXPECT_FALSE(fast->masked_program_next()) << "every count is the task's again";
    for (int s = 6; s < 8; ++s) {
      step(*fast, s);
      step(*forced, s);
    }
    EXPECT_EQ(fast->tensor_steps(), std::vector<int64_t>(n, 8));
    EXPECT_EQ(fast->fingerprint(), forced->fingerprint());
    // The raw array handed out: the task can no longer know the mask is clear.
    (void)fast->tensor_mask();
    EXPECT_TRUE(fast->masked_program_next());
    fast->tensor_mask_written(false);
    EXPECT_FALSE(fast->masked_program_next());
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, TensorMaskProgramTest, ::testing::ValuesIn(testing_util::kind_backend_cases()),
                         testing_util::kind_backend_case_name);

TaskOptions cpu_mask_options(bool mask) {
  TaskOptions o;
  o.backend = BackendKind::kCpu;
  o.backend_options.threads = 2;
  o.tensor_mask = mask;
  return o;
}

std::unique_ptr<Task> adamw_task(bool mask) {
  const std::vector<ParamSpec> params = program_params(1);
  auto task = std::make_unique<Task>(params, cpu_mask_options(mask));
  task->optimizer(AdamW().lr(1e-2).weight_decay(0.1));
  task->compile();
  for (size_t id = 0; id < params.size(); ++id) task->set_weight(id, values_of(params[id], 0, 0.5f).data());
  return task;
}

void grads_for(Task& task, int s) {
  for (size_t id = 0; id < task.num_params(); ++id) {
    task.set_grad(id, values_of(task.param(id), 1000u * static_cast<uint32_t>(s + 1), 4.0f).data());
  }
}

// A checkpoint saved while the counts are equal resumes on the unmasked program, one saved after
// a masked step on the masked program; both continue with the bits of the run that went on.
TEST(TensorMaskProgram, CheckpointResumesOnTheRightProgram) {
  auto run = adamw_task(true);
  const size_t n = run->num_params();
  const std::string equal_path = testing_util::unique_temp_path("mask_program_equal.ckpt");
  const std::string behind_path = testing_util::unique_temp_path("mask_program_behind.ckpt");
  for (int s = 0; s < 2; ++s) {
    grads_for(*run, s);
    run->step();
  }
  run->save(equal_path);
  std::vector<int32_t> mask(n, 0);
  mask[1] = 1;
  grads_for(*run, 2);
  run->set_tensor_mask(mask);
  run->step();
  run->save(behind_path);
  run->set_tensor_mask(std::vector<int32_t>(n, 0));
  grads_for(*run, 3);
  run->step();
  const std::string want = run->fingerprint();

  auto from_equal = adamw_task(true);
  from_equal->load(equal_path);
  EXPECT_FALSE(from_equal->masked_program_next());
  grads_for(*from_equal, 2);
  from_equal->set_tensor_mask(mask);
  from_equal->step();
  EXPECT_TRUE(from_equal->masked_program_next());
  from_equal->set_tensor_mask(std::vector<int32_t>(n, 0));
  grads_for(*from_equal, 3);
  from_equal->step();
  EXPECT_EQ(from_equal->fingerprint(), want);

  auto from_behind = adamw_task(true);
  from_behind->load(behind_path);
  EXPECT_TRUE(from_behind->masked_program_next()) << "tensor 1 is a step behind";
  grads_for(*from_behind, 3);
  from_behind->step();
  EXPECT_EQ(from_behind->fingerprint(), want);
  // Back to the equal checkpoint: the unmasked program again.
  from_behind->load(equal_path);
  EXPECT_FALSE(from_behind->masked_program_next());
  std::remove(equal_path.c_str());
  std::remove(behind_path.c_str());
}

// Counts that all equal the task's add nothing (the flagless task's fingerprint); counts that
// differ are hashed: two tasks whose W, M, V and t agree but not their per-tensor counts differ.
TEST(TensorMaskProgram, FingerprintCoversPerTensorCountsThatDiffer) {
  auto flagless = adamw_task(false);
  auto a = adamw_task(true);
  auto b = adamw_task(true);
  EXPECT_EQ(a->fingerprint(), flagless->fingerprint());
  const size_t n = a->num_params();
  std::vector<int64_t> steps(n, 0);
  steps[2] = 5;
  a->set_tensor_steps(steps);
  steps[2] = 6;
  b->set_tensor_steps(steps);
  EXPECT_NE(a->fingerprint(), b->fingerprint());
  EXPECT_NE(a->fingerprint(), flagless->fingerprint());
  EXPECT_NE(a->fingerprint({2}), b->fingerprint({2}));
  // The ids without a differing count print what the flagless task prints for them.
  EXPECT_EQ(a->fingerprint({0, 1}), flagless->fingerprint({0, 1}));
  EXPECT_EQ(a->fingerprint({0, 1}), b->fingerprint({0, 1}));
}

// What makes the unmasked program fast: its check and updates are the flagless nodes (no mask
// read; with one group no per-tensor work items either), and ADVANCE_STEP still keeps the counts.
TEST(TensorMaskProgram, UnmaskedProgramHasTheFlaglessNodes) {
  for (int groups : {1, 2}) {
    PlanConfig with = plan_config_from_optimizer(OptimizerKind::kLars);
    with.hyper_groups = groups;
    with.tensor_mask = true;
    const MemoryPlan plan(program_params(groups), with);
    const OptimizerConfig config = LARS().lr(0.1).momentum(0.9).config();
    const CompiledStep masked = compile_step(plan, config, true);
    const CompiledStep unmasked = compile_unmasked_step(plan, config, true);
    ASSERT_EQ(unmasked.node_count(), masked.node_count());
    for (int g = 0; g < kNumGraphs; ++g) {
      for (size_t k = 0; k < unmasked.graphs[g].size(); ++k) {
        const GraphNode& node = unmasked.graphs[g][k];
        const bool advance = node.kind == NodeKind::kCompute && node.compute_op == ComputeOp::ADVANCE_STEP;
        EXPECT_EQ(node.work.tensor_state.count, advance ? masked.graphs[g][k].work.tensor_state.count : 0u) << g << "/" << k;
        EXPECT_EQ(node.work.hyper_items.count != 0, groups > 1 && masked.graphs[g][k].work.hyper_items.count != 0) << g << "/" << k;
        EXPECT_EQ(node.work.tensor_blocks.count != 0, groups > 1 && masked.graphs[g][k].work.tensor_blocks.count != 0);
        EXPECT_EQ(node.work.group_items[0].count + node.work.group_items[1].count, 0u);
      }
    }
    PlanConfig without = with;
    without.tensor_mask = false;
    EXPECT_THROW(compile_unmasked_step(MemoryPlan(program_params(groups), without), config, true), Error);
  }
}

}  // namespace
}  // namespace renaissance
