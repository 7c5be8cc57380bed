// OptimizerConfig::maximize (torch's maximize), for every kind of the kind table and every backend
// of the build (CUDA skips without a device):
// - a maximizing task stepping on G leaves W, M, V bit for bit where a minimizing task stepping on
//   -G leaves them, with and without a loss scale (a power of two and not), with and without
//   gradient-norm clipping, with and without the per-tensor mask, and the same last gradient
//   norm: the expected values come from an independent minimizing task fed the negated
//   gradients, never from the maximizing task;
// - in a two-group task where only one group maximizes, each group equals a separate one-group
//   task (the maximizing one on -G), also after set_group_hyper flips maximize between steps;
// - a checkpoint carries group 0's maximize: a task built minimizing resumes a maximizing run bit
//   for bit, and read_checkpoint_info reports it; the builders set it.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/task.h"
#include "support/mask_test_util.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::read_family;
using testing_util::same_bits;
using testing_util::task_options;

// Bias-like and weight tensors of odd sizes, one over the norm tile, a scalar and an empty one.
std::vector<ParamSpec> test_params(int groups) {
  return testing_util::round_robin_groups(
      {
          {"conv1", {7, 3, 5, 5}, Role::kFirstConv}, {"bn1.w", {37}, Role::kBnWeight},
          {"bn1.b", {37}, Role::kBnBias},            {"conv2", {5000}, Role::kDeepConv},
          {"fc.w", {10, 129}, Role::kFcWeight},      {"fc.b", {10}, Role::kFcBias},
          {"bn2.w", {}, Role::kBnWeight},            {"empty", {0}, Role::kDeepConv},
      },
      groups);
}

std::vector<float> weights_of(const ParamSpec& p) {
  return testing_util::lcg_values(testing_util::name_seed(p.name), p.numel(), 0.5f);
}

// The gradient of parameter p at `step`, negated when `negate` (sign flip: exact).
std::vector<float> grad_of(const ParamSpec& p, int step, bool negate) {
  std::vector<float> g =
      testing_util::lcg_values(testing_util::name_seed(p.name) + 1000u * static_cast<uint32_t>(step + 1), p.numel(), 4.0f);
  if (negate) {
    for (float& x : g) x = -x;
  }
  return g;
}

using Case = testing_util::KindBackendCase;

class MaximizeTest : public ::testing::TestWithParam<Case> {};

// maximize on G == minimize on -G, bit for bit, across scales, clipping and the mask.
TEST_P(MaximizeTest, MaximizeOnGIsMinimizeOnNegatedG) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  const std::vector<ParamSpec> params = test_params(1);
  for (bool mask : {false, true}) {
    for (double clip : {0.0, 3.0}) {
      for (double scale : {1.0, 8.0, 3.0}) {
        SCOPED_TRACE("mask " + std::to_string(mask) + " clip " + std::to_string(clip) + " scale " +
                     std::to_string(scale));
        OptimizerConfig up = GetParam().kind.config;
        up.max_grad_norm = clip;
        up.maximize = true;
        OptimizerConfig down = up;
        down.maximize = false;
        Task maximizing(params, task_options(GetParam().backend, mask));
        maximizing.optimizer(up);
        maximizing.compile();
        Task negated(params, task_options(GetParam().backend, mask));
        negated.optimizer(down);
        negated.compile();
        for (Task* t : {&maximizing, &negated}) {
          for (size_t id = 0; id < params.size(); ++id) t->set_weight(id, weights_of(params[id]).data());
          t->set_loss_scale(scale);  // after compile: the per-block writer
        }
        for (int step = 0; step < 4; ++step) {
          for (size_t id = 0; id < params.size(); ++id) {
            maximizing.set_grad(id, grad_of(params[id], step, false).data());
            negated.set_grad(id, grad_of(params[id], step, true).data());
          }
          maximizing.step();
          negated.step();
        }
        EXPECT_EQ(maximizing.step_count(), 4);
        for (size_t id = 0; id < params.size(); ++id) {
          for (Family f : {Family::kW, Family::kM, Family::kV}) {
            if (!maximizing.plan().has_family(f)) continue;
            EXPECT_TRUE(same_bits(read_family(maximizing, f, id), read_family(negated, f, id)))
                << params[id].name << " family " << family_name(f);
          }
        }
        EXPECT_EQ(maximizing.fingerprint(), negated.fingerprint());
        if (clip > 0.0) {
          EXPECT_GT(negated.last_grad_norm(), clip) << "the run must clip for the case to mean something";
          EXPECT_EQ(maximizing.last_grad_norm(), negated.last_grad_norm());
        }
      }
    }
  }
}

// Maximizing really ascends: the weights differ from a minimizing run on the same G (else the
// equality above could hold with a flag that does nothing and gradients that cancel).
TEST_P(MaximizeTest, MaximizeChangesTheRun) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  const std::vector<ParamSpec> params = test_params(1);
  OptimizerConfig up = GetParam().kind.config;
  up.maximize = true;
  Task a(params, task_options(GetParam().backend, false));
  a.optimizer(up);
  a.compile();
  Task b(params, task_options(GetParam().backend, false));
  b.optimizer(GetParam().kind.config);
  b.compile();
  for (Task* t : {&a, &b}) {
    for (size_t id = 0; id < params.size(); ++id) {
      t->set_weight(id, weights_of(params[id]).data());
      t->set_grad(id, grad_of(params[id], 0, false).data());
    }
    t->step();
  }
  EXPECT_NE(a.fingerprint(), b.fingerprint());
}

// Two groups, only group 0 maximizes: each group is bit for bit a task of its own (group 0's on
// -G). At step 2 set_group_hyper makes group 1 maximize and group 0 minimize.
TEST_P(MaximizeTest, OnlyOneGroupMaximizes) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  for (bool mask : {false, true}) {
    SCOPED_TRACE("mask " + std::to_string(mask));
    const std::vector<ParamSpec> params = test_params(2);
    std::vector<OptimizerConfig> configs = {testing_util::shifted_group_config(GetParam().kind.config, 0),
                                            testing_util::shifted_group_config(GetParam().kind.config, 1)};
    configs[0].maximize = true;
    Task grouped(params, task_options(GetParam().backend, mask));
    grouped.optimizer_groups(configs);
    grouped.compile();
    grouped.set_loss_scale(4.0);
    std::vector<std::unique_ptr<Task>> separate;
    std::vector<std::vector<size_t>> ids(2);
    for (int h = 0; h < 2; ++h) {
      const std::vector<ParamSpec> mine = testing_util::group_alone(params, h, &ids[h]);
      OptimizerConfig c = configs[h];
      c.maximize = false;  // the separate tasks minimize, on -G where the group maximizes
      separate.push_back(std::make_unique<Task>(mine, task_options(GetParam().backend, false)));
      separate[h]->optimizer(c);
      separate[h]->compile();
      separate[h]->set_loss_scale(4.0);
    }
    for (size_t id = 0; id < params.size(); ++id) grouped.set_weight(id, weights_of(params[id]).data());
    for (int h = 0; h < 2; ++h) {
      for (size_t k = 0; k < ids[h].size(); ++k) separate[h]->set_weight(k, weights_of(params[ids[h][k]]).data());
    }
    bool up[2] = {true, false};
    for (int step = 0; step < 5; ++step) {
      if (step == 2) {
        OptimizerConfig c0 = configs[0], c1 = configs[1];
        c0.maximize = false;
        c1.maximize = true;
        grouped.set_group_hyper(0, c0);
        grouped.set_group_hyper(1, c1);
        up[0] = false;
        up[1] = true;
      }
      for (size_t id = 0; id < params.size(); ++id) grouped.set_grad(id, grad_of(params[id], step, false).data());
      grouped.step();
      for (int h = 0; h < 2; ++h) {
        for (size_t k = 0; k < ids[h].size(); ++k) {
          separate[h]->set_grad(k, grad_of(params[ids[h][k]], step, up[h]).data());
        }
        separate[h]->step();
      }
    }
    testing_util::expect_groups_match_separate(grouped, ids, separate);
  }
}

// A checkpoint of a maximizing run resumes as one, into a task configured to minimize.
TEST_P(MaximizeTest, CheckpointCarriesMaximize) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  const std::vector<ParamSpec> params = test_params(1);
  OptimizerConfig up = GetParam().kind.config;
  up.maximize = true;
  const std::string path = testing_util::unique_temp_path(std::string("maximize_") + GetParam().kind.name + ".ckpt");
  auto run = [&](Task& t, int from, int to) {
    for (int step = from; step < to; ++step) {
      for (size_t id = 0; id < params.size(); ++id) t.set_grad(id, grad_of(params[id], step, false).data());
      t.step();
    }
  };
  Task whole(params, task_options(GetParam().backend, false));
  whole.optimizer(up);
  whole.compile();
  for (size_t id = 0; id < params.size(); ++id) whole.set_weight(id, weights_of(params[id]).data());
  run(whole, 0, 2);
  whole.save(path);
  run(whole, 2, 4);
  EXPECT_TRUE(read_checkpoint_info(path).config.maximize);

  Task resumed(params, task_options(GetParam().backend, false));
  resumed.optimizer(GetParam().kind.config);  // minimizing until the load
  resumed.compile();
  resumed.load(path);
  EXPECT_TRUE(resumed.config().maximize);
  run(resumed, 2, 4);
  EXPECT_EQ(resumed.fingerprint(), whole.fingerprint());
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Kinds, MaximizeTest, ::testing::ValuesIn(testing_util::kind_backend_cases()),
                         testing_util::kind_backend_case_name);

// Every builder sets maximize; the default is false.
TEST(MaximizeBuilders, EveryBuilderSetsIt) {
  EXPECT_FALSE(SGD().config().maximize);
  EXPECT_TRUE(SGD().momentum(0.9).maximize(true).config().maximize);
  EXPECT_TRUE(Adam().maximize(true).config().maximize);
  EXPECT_TRUE(AdamW().maximize(true).config().maximize);
  EXPECT_TRUE(LARS().maximize(true).config().maximize);
  EXPECT_TRUE(Lion().maximize(true).config().maximize);
  EXPECT_TRUE(LAMB().maximize(true).config().maximize);
  EXPECT_FALSE(LAMB().maximize(true).maximize(false).config().maximize);
}

}  // namespace
}  // namespace renaissance
