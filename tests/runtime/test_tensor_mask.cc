// The per-tensor mask (TaskOptions::tensor_mask: torch's `.grad is None`), for every
// kind the mask supports and every backend of the build (CUDA skips without a device):
// - over a mask pattern that varies per step (with two hyperparameter groups, a loss scale, a
//   NaN gradient in every masked tensor), each tensor's W, M, V equal those of a one-tensor task
//   without the flag that took only the steps where the tensor was unmasked: torch's semantics
//   (a skipped parameter's state and its own step count stay as they were). The expected values
//   come from those independent tasks, never from the masked task;
// - a masked tensor is bit for bit unchanged (W, M, V, bf16 model copy) by the step that masks it;
// - with nothing masked the task gives the fingerprint of the flagless task (fp32 and bf16 with
//   stochastic rounding, whose key then uses t_i = t);
// - a NaN in an unmasked tensor still skips the step; the unsupported combinations are refused.
// (CUDA against the CPU under a mask pattern, the norm kinds' ratios of masked tensors included:
// the conformance suite's mask cells, audit/matrix.cc.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/task.h"
#include "support/mask_test_util.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::same_bits;
using testing_util::read_family;
using testing_util::task_options;

// Both groups, tensors over several work items and norm tiles, a scalar tensor.
std::vector<ParamSpec> mask_params() {
  std::vector<ParamSpec> p = {
      {"conv1", {7, 3, 5, 5}, Role::kFirstConv}, {"bn1.w", {37}, Role::kBnWeight},
      {"bn1.b", {37}, Role::kBnBias},            {"conv2", {41000}, Role::kDeepConv},
      {"fc.w", {10, 129}, Role::kFcWeight},      {"fc.b", {10}, Role::kFcBias},
      {"bn2.w", {}, Role::kBnWeight},            {"fc2.w", {3, 17}, Role::kFcWeight},
  };
  for (size_t i = 0; i < p.size(); ++i) p[i].hyper_group = static_cast<int>(i % 2);
  return p;
}
std::vector<ParamSpec> one_group_params() {
  std::vector<ParamSpec> p = mask_params();
  for (ParamSpec& each : p) each.hyper_group = 0;
  return p;
}

// Tensor id masked at `step`: a pattern where every tensor is skipped at some steps and taken
// at others, tensor 3 is masked for the first three steps, and step 4 masks everything.
bool masked(size_t id, int step) {
  if (step == 4) return true;
  if (id == 3) return step < 3;
  return (id * 5 + static_cast<size_t>(step) * 3) % 4 == 0;
}
constexpr int kSteps = 7;

using testing_util::name_seed;
std::vector<float> weights_of(const ParamSpec& p) { return testing_util::named_weights(p); }
std::vector<float> grads_of(const ParamSpec& p, int step) { return testing_util::named_grads(p, step); }
OptimizerConfig group_config(const OptimizerConfig& base, int h) { return testing_util::shifted_group_config(base, h); }
using MaskCase = testing_util::KindBackendCase;

class TensorMaskTest : public ::testing::TestWithParam<MaskCase> {};

TEST_P(TensorMaskTest, MaskPatternMatchesOneTensorTasksTakingOnlyUnmaskedSteps) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  const BackendKind backend = GetParam().backend;
  const OptimizerConfig base = GetParam().kind.config;
  const std::vector<ParamSpec> params = mask_params();
  const std::vector<OptimizerConfig> configs = {group_config(base, 0), group_config(base, 1)};
  Task task(params, task_options(backend, true));
  task.optimizer_groups(configs);
  task.compile();
  task.set_loss_scale(4.0);
  std::vector<std::unique_ptr<Task>> alone;
  for (size_t id = 0; id < params.size(); ++id) {
    task.set_weight(id, weights_of(params[id]).data());
    ParamSpec p = params[id];
    p.hyper_group = 0;
    alone.push_back(std::make_unique<Task>(std::vector<ParamSpec>{p}, task_options(backend, false)));
    alone[id]->optimizer(configs[params[id].hyper_group]);
    alone[id]->compile();
    alone[id]->set_loss_scale(4.0);
    alone[id]->set_weight(0, weights_of(params[id]).data());
  }
  const Family families[] = {Family::kW, Family::kM, Family::kV};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<int64_t> taken(params.size(), 0);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int32_t> mask(params.size());
    std::vector<std::vector<std::vector<float>>> before(params.size());
    for (size_t id = 0; id < params.size(); ++id) {
      mask[id] = masked(id, step) ? 1 : 0;
      std::vector<float> g = grads_of(params[id], step);
      if (mask[id]) {
        g.assign(g.size(), nan);  // a masked gradient is never looked at (no skipped step)
        for (Family f : families) {
          if (task.plan().has_family(f)) before[id].push_back(read_family(task, f, id));
        }
      } else {
        alone[id]->set_grad(0, grads_of(params[id], step).data());
        alone[id]->step();
        ++taken[id];
      }
      task.set_grad(id, g.data());
    }
    task.set_tensor_mask(mask);
    task.step();
    ASSERT_FALSE(task.last_step_skipped()) << "step " << step;
    for (size_t id = 0; id < params.size(); ++id) {
      if (!mask[id]) continue;
      size_t k = 0;
      for (Family f : families) {
        if (!task.plan().has_family(f)) continue;
        EXPECT_TRUE(same_bits(read_family(task, f, id), before[id][k++]))
            << "masked " << params[id].name << " changed in " << family_name(f) << " at step " << step;
      }
    }
  }
  EXPECT_EQ(task.step_count(), kSteps);
  EXPECT_EQ(task.tensor_steps(), taken);
  for (size_t id = 0; id < params.size(); ++id) {
    EXPECT_EQ(alone[id]->step_count(), taken[id]);
    for (Family f : families) {
      if (!task.plan().has_family(f)) continue;
      EXPECT_TRUE(same_bits(read_family(task, f, id), read_family(*alone[id], f, 0)))
          << params[id].name << " " << family_name(f) << " after " << taken[id] << " of " << kSteps << " steps";
    }
  }
}

// Nothing masked: the fingerprint (W, M, V, model copy, t) of the flagless task, also with a
// bf16 copy rounded stochastically (the key's t is each tensor's count, here t). Then one tensor
// masked: its copy keeps its bits while the others' copies move.
TEST_P(TensorMaskTest, NothingMaskedIsTheFlaglessRunAndMaskedCopiesKeepTheirBits) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  for (Precision precision : {Precision::kFp32, Precision::kBf16}) {
    const std::vector<ParamSpec> params = mask_params();
    std::unique_ptr<Task> tasks[2];
    for (int flag = 0; flag < 2; ++flag) {
      TaskOptions o = task_options(GetParam().backend, flag == 1);
      o.precision.precision = precision;
      if (precision != Precision::kFp32) o.precision.rounding = Rounding::kStochastic;
      o.precision.seed = 99;
      tasks[flag] = std::make_unique<Task>(params, o);
      tasks[flag]->optimizer_groups({group_config(GetParam().kind.config, 0), group_config(GetParam().kind.config, 1)});
      tasks[flag]->compile();
      for (size_t id = 0; id < params.size(); ++id) tasks[flag]->set_weight(id, weights_of(params[id]).data());
    }
    tasks[1]->set_tensor_mask(std::vector<int32_t>(params.size(), 0));
    for (int step = 0; step < 3; ++step) {
      for (auto& t : tasks) {
        for (size_t id = 0; id < params.size(); ++id) t->set_grad(id, grads_of(params[id], step).data());
        t->step();
      }
    }
    EXPECT_EQ(tasks[1]->fingerprint(), tasks[0]->fingerprint()) << precision_name(precision);
    EXPECT_EQ(tasks[1]->tensor_steps(), std::vector<int64_t>(params.size(), 3));
    if (precision == Precision::kFp32) continue;
    Task& task = *tasks[1];
    std::vector<int32_t> mask(params.size(), 0);
    mask[3] = 1;
    task.set_tensor_mask(mask);
    std::vector<std::vector<uint16_t>> copy(params.size());
    for (size_t id = 0; id < params.size(); ++id) {
      copy[id].resize(static_cast<size_t>(params[id].numel()));
      task.read_model_copy(id, copy[id].data());
      task.set_grad(id, grads_of(params[id], 9).data());
    }
    task.step();
    for (size_t id = 0; id < params.size(); ++id) {
      std::vector<uint16_t> now(copy[id].size());
      task.read_model_copy(id, now.data());
      if (id == 3) {
        EXPECT_EQ(now, copy[id]) << "the masked tensor's bf16 copy changed";
      } else {
        EXPECT_NE(now, copy[id]) << params[id].name << "'s copy did not move (the test would mean nothing)";
      }
    }
  }
}

// A NaN in an unmasked tensor skips the whole step: no tensor's count advances.
TEST_P(TensorMaskTest, NonFiniteInAnUnmaskedTensorStillSkipsTheStep) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  const std::vector<ParamSpec> params = one_group_params();
  Task task(params, task_options(GetParam().backend, true));
  task.optimizer(GetParam().kind.config);
  task.compile();
  for (size_t id = 0; id < params.size(); ++id) task.set_grad(id, grads_of(params[id], 0).data());
  std::vector<int32_t> mask(params.size(), 0);
  mask[1] = 1;
  task.set_tensor_mask(mask);
  task.poison_gradient(3, 40999, std::numeric_limits<float>::infinity());
  const std::string before = task.fingerprint();
  task.step();
  EXPECT_TRUE(task.last_step_skipped());
  EXPECT_EQ(task.fingerprint(), before);
  EXPECT_EQ(task.tensor_steps(), std::vector<int64_t>(params.size(), 0));
  EXPECT_EQ(task.skipped_steps(), 1);
}

// Hyperparameter writes with per-tensor blocks: set_group_lrs (one copy for every block), set_lr
// per group and set_group_hyper reach every tensor of the group: the bits of a task built with
// those values from the start (its blocks written by compile()).
TEST_P(TensorMaskTest, HyperparameterWritesReachEveryBlockOfTheGroup) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  const OptimizerConfig base = GetParam().kind.config;
  const std::vector<ParamSpec> params = mask_params();
  std::vector<OptimizerConfig> final_configs = {group_config(base, 2), group_config(base, 3)};
  final_configs[0].lr = base.lr * 0.3;
  final_configs[1].lr = base.lr * 0.7;
  std::unique_ptr<Task> tasks[4];
  for (int k = 0; k < 4; ++k) {
    tasks[k] = std::make_unique<Task>(params, task_options(GetParam().backend, k != 3));
    tasks[k]->optimizer_groups(k == 0 ? final_configs : std::vector<OptimizerConfig>{group_config(base, 0), group_config(base, 1)});
    tasks[k]->compile();
  }
  for (int k = 1; k < 4; ++k) {
    OptimizerConfig c0 = final_configs[0], c1 = final_configs[1];
    c0.lr = c1.lr = base.lr;  // the lrs arrive below, each task another way
    tasks[k]->set_group_hyper(0, c0);
    tasks[k]->set_group_hyper(1, c1);
  }
  tasks[1]->set_group_lrs({final_configs[0].lr, final_configs[1].lr});
  tasks[2]->set_lr(0, final_configs[0].lr);
  tasks[2]->set_lr(1, final_configs[1].lr);
  tasks[3]->set_group_lrs({final_configs[0].lr, final_configs[1].lr});  // flagless, H = 2
  for (int step = 0; step < 3; ++step) {
    for (auto& t : tasks) {
      if (step == 0) {
        for (size_t id = 0; id < params.size(); ++id) t->set_weight(id, weights_of(params[id]).data());
      }
      for (size_t id = 0; id < params.size(); ++id) t->set_grad(id, grads_of(params[id], step).data());
      t->step();
    }
  }
  for (int k = 1; k < 4; ++k) EXPECT_EQ(tasks[k]->fingerprint(), tasks[0]->fingerprint()) << "task " << k;
  EXPECT_EQ(tasks[1]->lr(1), final_configs[1].lr);
  EXPECT_THROW(tasks[1]->set_group_lrs({1e-3}), Error);
}

INSTANTIATE_TEST_SUITE_P(Kinds, TensorMaskTest, ::testing::ValuesIn(testing_util::kind_backend_cases()),
                         testing_util::kind_backend_case_name);

// The flagless layout is untouched, and what the mask does not support yet is refused by name.
TEST(TensorMask, FlaglessPlanIsUnchangedAndUnsupportedUsesAreRefused) {
  const std::vector<ParamSpec> params = mask_params();
  PlanConfig plain = plan_config_from_optimizer(OptimizerKind::kAdamW);
  plain.hyper_groups = 2;
  PlanConfig with = plain;
  with.tensor_mask = true;
  const MemoryPlan a(params, plain), b(params, with);
  EXPECT_FALSE(a.region(S_TENSOR_INT32).allocated);
  EXPECT_EQ(a.scalar_blocks(), 2);
  EXPECT_EQ(b.region(S_TENSOR_INT32).count, 2 * params.size());
  EXPECT_EQ(b.scalar_blocks(), static_cast<int>(params.size()));
  for (const HyperItem& item : b.hyper_items()) EXPECT_EQ(item.start % 64, 0);
  // One work item per tensor (each under kHyperItemElements but conv2's 41000 = 3 items).
  EXPECT_EQ(b.hyper_items().size(), params.size() + 2);

  const std::vector<ParamSpec> one = one_group_params();
  Task plain_task(one, task_options(BackendKind::kCpu, false));
  plain_task.optimizer(AdamW().lr(1e-3));
  plain_task.compile();
  EXPECT_THROW(plain_task.tensor_mask(), Error);
  EXPECT_THROW(plain_task.set_tensor_mask(std::vector<int32_t>(one.size(), 0)), Error);

  Task clipped(one, task_options(BackendKind::kCpu, true));
  clipped.optimizer(AdamW().lr(1e-3).max_grad_norm(1.0));
  EXPECT_NO_THROW(clipped.compile());  // clipping with the mask: test_tensor_mask_clip.cc
  TaskOptions sliced = task_options(BackendKind::kCpu, true);
  sliced.state_shard.world_size = 2;
  Task shard(one, sliced);
  shard.optimizer(AdamW().lr(1e-3));
  // A rank's slice of M and V with the mask compiles (its sharded step: tests/comm/sharded_mask.cc);
  // the task alone cannot step (its whole step leaves the slice).
  EXPECT_NO_THROW(shard.compile());
  EXPECT_THROW(shard.step(), Error);
  Task masked_task(one, task_options(BackendKind::kCpu, true));
  masked_task.optimizer(AdamW().lr(1e-3));
  masked_task.compile();
  EXPECT_THROW(masked_task.set_tensor_mask(std::vector<int32_t>(one.size() + 1, 0)), Error);
}

// A checkpoint of a masked task keeps each tensor's step count: save after a mask pattern, go on
// with more masked steps, and a fresh task that loads the file and takes the same steps ends
// with the same bits and counts. A task without the mask refuses the file (and vice versa).
TEST(TensorMask, CheckpointResumesPerTensorStepsBitForBit) {
  const std::vector<ParamSpec> params = one_group_params();
  auto make = [&](bool mask) {
    auto t = std::make_unique<Task>(params, task_options(BackendKind::kCpu, mask));
    t->optimizer(AdamW().lr(1e-2).weight_decay(0.1));
    t->compile();
    return t;
  };
  auto run = [&](Task& t, int from, int to) {
    for (int step = from; step < to; ++step) {
      std::vector<int32_t> mask(params.size());
      for (size_t id = 0; id < params.size(); ++id) {
        mask[id] = masked(id, step) ? 1 : 0;
        t.set_grad(id, grads_of(params[id], step).data());
      }
      t.set_tensor_mask(mask);
      t.step();
    }
  };
  std::unique_ptr<Task> first = make(true);
  for (size_t id = 0; id < params.size(); ++id) first->set_weight(id, weights_of(params[id]).data());
  run(*first, 0, 4);
  const std::vector<int64_t> saved_steps = first->tensor_steps();
  ASSERT_NE(saved_steps, std::vector<int64_t>(params.size(), saved_steps[0])) << "the steps must differ for the test to mean something";
  const std::string path = testing_util::unique_temp_path("tensor_mask.ckpt");
  first->save(path);
  run(*first, 4, kSteps);
  std::unique_ptr<Task> second = make(true);
  second->load(path);
  EXPECT_EQ(second->tensor_steps(), saved_steps);
  run(*second, 4, kSteps);
  EXPECT_EQ(second->tensor_steps(), first->tensor_steps());
  EXPECT_EQ(second->fingerprint(), first->fingerprint());
  std::unique_ptr<Task> plain = make(false);
  EXPECT_THROW(plain->load(path), Error);
  const std::string plain_path = testing_util::unique_temp_path("tensor_mask_plain.ckpt");
  plain->save(plain_path);
  EXPECT_THROW(second->load(plain_path), Error);
  std::remove(path.c_str());
  std::remove(plain_path.c_str());
}

}  // namespace
}  // namespace renaissance
