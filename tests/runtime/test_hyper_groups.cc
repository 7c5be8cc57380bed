// Hyperparameter groups in one Task (Task::optimizer_groups): for every kind of the
// kind table and every backend of the build (CUDA skips without a device),
// - H groups with equal configurations give the fingerprint of H = 1 (an element's update reads
//   only its own block, and the task-wide scalars, loss scale and clip coefficient, reach every
//   block);
// - H groups with different lr, weight decay, momentum, betas, eps and trust coefficient give,
//   tensor by tensor, the bits of H separate one-group tasks, also after set_lr(h) and
//   set_group_hyper(h) between steps (no re-capture);
// - the plan keeps each (role, group) run aligned, the node count does not depend on H, a
//   checkpoint of an H-group task resumes bit for bit, and mismatched groups are refused.
// Expected values always come from independent one-group tasks, never from the grouped task.
// (CUDA against the CPU with groups: the conformance suite's groups cells, every kind case.)
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/task.h"
#include "support/mask_test_util.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::KindCase;
using testing_util::same_bits;
using testing_util::task_options;

constexpr int kGroups = 3;

// Bias-like and weight tensors of odd sizes, one over kHyperItemElements (several work items)
// and over the norm tile (several tiles), a scalar and an empty tensor. Groups interleave in
// declaration order so that the grouped layout differs from the declaration order.
std::vector<ParamSpec> grouped_params() {
  std::vector<ParamSpec> p = {
      {"conv1", {7, 3, 5, 5}, Role::kFirstConv},  {"bn1.w", {37}, Role::kBnWeight},
      {"bn1.b", {37}, Role::kBnBias},             {"conv2", {41000}, Role::kDeepConv},
      {"conv3", {33, 65}, Role::kDeepConv},       {"fc.w", {10, 129}, Role::kFcWeight},
      {"fc.b", {10}, Role::kFcBias},              {"conv4", {5000}, Role::kDeepConv},
      {"bn2.w", {}, Role::kBnWeight},             {"empty", {0}, Role::kDeepConv},
      {"fc2.w", {3, 17}, Role::kFcWeight},        {"bn2.b", {129}, Role::kBnBias},
  };
  for (size_t i = 0; i < p.size(); ++i) p[i].hyper_group = static_cast<int>(i % kGroups);
  return p;
}

std::vector<float> values(uint32_t seed, int64_t n, float a) { return testing_util::lcg_values(seed, n, a); }

OptimizerConfig group_config(const OptimizerConfig& base, int h) { return testing_util::shifted_group_config(base, h); }


// Weights of parameter `name` (seeded by name, so every task of a comparison gets the same).
using testing_util::name_seed;

void init_weights(Task& task) {
  for (size_t id = 0; id < task.num_params(); ++id) {
    const ParamSpec& p = task.param(id);
    task.set_weight(id, values(name_seed(p.name), p.numel(), 0.5f).data());
  }
}

void set_grads(Task& task, int step) {
  for (size_t id = 0; id < task.num_params(); ++id) {
    const ParamSpec& p = task.param(id);
    task.set_grad(id, values(name_seed(p.name) + 1000u * static_cast<uint32_t>(step + 1), p.numel(), 4.0f).data());
  }
}

using GroupCase = testing_util::KindBackendCase;

class HyperGroupsTest : public ::testing::TestWithParam<GroupCase> {};

// Equal configurations in H blocks: the fingerprint of one group, with a loss scale and (second
// run) gradient-norm clipping active, both task-wide scalars that every block must see. The
// clipping norm is summed over G in arena order, which interleaved groups change (its last bits
// may then differ): the clipping run gives each role one group, so the layout is H = 1's.
TEST_P(HyperGroupsTest, EqualConfigsGiveTheFingerprintOfOneGroup) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  for (double clip : {0.0, 3.0}) {
    std::vector<ParamSpec> params = grouped_params();
    if (clip > 0.0) {
      for (ParamSpec& p : params) p.hyper_group = static_cast<int>(p.role) % kGroups;
    }
    OptimizerConfig config = GetParam().kind.config;
    config.max_grad_norm = clip;
    std::vector<ParamSpec> one = grouped_params();
    for (ParamSpec& p : one) p.hyper_group = 0;
    Task single(one, task_options(GetParam().backend));
    single.optimizer(config);
    single.compile();
    Task grouped(params, task_options(GetParam().backend));
    grouped.optimizer_groups(std::vector<OptimizerConfig>(kGroups, config));
    grouped.compile();
    ASSERT_EQ(grouped.hyper_groups(), kGroups);
    for (Task* t : {&single, &grouped}) {
      init_weights(*t);
      t->set_loss_scale(8.0);
    }
    for (int step = 0; step < 4; ++step) {
      for (Task* t : {&single, &grouped}) {
        set_grads(*t, step);
        t->step();
      }
    }
    EXPECT_EQ(grouped.step_count(), 4);
    EXPECT_EQ(grouped.fingerprint(), single.fingerprint()) << "max_grad_norm " << clip;
    if (clip > 0.0) {
      EXPECT_GT(single.last_grad_norm(), clip) << "the run must clip for the test to mean something";
      EXPECT_EQ(grouped.last_grad_norm(), single.last_grad_norm());
    }
  }
}

// Different configurations: each tensor's W, M, V equal those of a one-group task holding only
// its group, including an lr change and a full hyperparameter change between steps.
TEST_P(HyperGroupsTest, DifferentGroupsMatchSeparateTasksBitForBit) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  const OptimizerConfig base = GetParam().kind.config;
  std::vector<OptimizerConfig> configs;
  for (int h = 0; h < kGroups; ++h) configs.push_back(group_config(base, h));
  const std::vector<ParamSpec> params = grouped_params();
  Task grouped(params, task_options(GetParam().backend));
  grouped.optimizer_groups(configs);
  grouped.compile();
  init_weights(grouped);
  grouped.set_loss_scale(4.0);
  std::vector<std::unique_ptr<Task>> separate;
  std::vector<std::vector<size_t>> ids(kGroups);  // grouped id of each separate task's params
  for (int h = 0; h < kGroups; ++h) {
    const std::vector<ParamSpec> mine = testing_util::group_alone(params, h, &ids[h]);
    separate.push_back(std::make_unique<Task>(mine, task_options(GetParam().backend)));
    separate[h]->optimizer(configs[h]);
    separate[h]->compile();
    init_weights(*separate[h]);
    separate[h]->set_loss_scale(4.0);
  }
  for (int step = 0; step < 5; ++step) {
    if (step == 2) {
      // lr of group 1 alone; every scalar of group 2 (betas too: the bias corrections follow).
      grouped.set_lr(1, configs[1].lr * 0.25);
      separate[1]->set_lr(configs[1].lr * 0.25);
      const OptimizerConfig changed = group_config(base, 4);
      grouped.set_group_hyper(2, changed);
      separate[2]->optimizer(changed);
      EXPECT_EQ(grouped.lr(1), configs[1].lr * 0.25);
      EXPECT_EQ(grouped.lr(0), configs[0].lr);
    }
    set_grads(grouped, step);
    grouped.step();
    for (auto& t : separate) {
      set_grads(*t, step);
      t->step();
    }
  }
  testing_util::expect_groups_match_separate(grouped, ids, separate);
}

// A checkpoint of an H-group task (every block's scalars) resumes bit for bit.
TEST_P(HyperGroupsTest, CheckpointResumesBitForBit) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  std::vector<OptimizerConfig> configs;
  for (int h = 0; h < kGroups; ++h) configs.push_back(group_config(GetParam().kind.config, h));
  const std::string path = testing_util::unique_temp_path(std::string("hyper_groups_") + GetParam().kind.name + ".ckpt");
  Task a(grouped_params(), task_options(GetParam().backend));
  a.optimizer_groups(configs);
  a.compile();
  init_weights(a);
  for (int step = 0; step < 2; ++step) {
    set_grads(a, step);
    a.step();
  }
  a.save(path);
  for (int step = 2; step < 4; ++step) {
    set_grads(a, step);
    a.step();
  }
  Task b(grouped_params(), task_options(GetParam().backend));
  b.optimizer_groups(configs);
  b.compile();
  b.load(path);
  for (int step = 2; step < 4; ++step) {
    set_grads(b, step);
    b.step();
  }
  EXPECT_EQ(b.fingerprint(), a.fingerprint());
  // A one-group task has one block of slots: the file is refused, naming the groups.
  std::vector<ParamSpec> one = grouped_params();
  for (ParamSpec& p : one) p.hyper_group = 0;
  Task c(one, task_options(GetParam().backend));
  c.optimizer(configs[0]);
  c.compile();
  try {
    c.load(path);
    ADD_FAILURE() << "an H-group checkpoint loaded into a one-group task";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hyperparameter groups"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(AllKinds, HyperGroupsTest, ::testing::ValuesIn(testing_util::kind_backend_cases()),
                         testing_util::kind_backend_case_name);

// Each (role, group) run starts on the 64-element alignment, work items tile the runs exactly,
// and the step has as many nodes as with one group.
TEST(HyperGroups, PlanRunsAreAlignedAndNodesDoNotGrow) {
  for (const KindCase& k : testing_util::all_kind_cases()) {
    PlanConfig pc = plan_config_from_optimizer(k.config.kind);
    pc.hyper_groups = kGroups;
    const std::vector<ParamSpec> params = grouped_params();
    MemoryPlan plan(params, pc);
    std::vector<bool> first_of_run(params.size(), false);
    for (size_t id = 0; id < params.size(); ++id) {
      bool first = true;
      for (size_t j = 0; j < id; ++j) {
        if (params[j].role == params[id].role && params[j].hyper_group == params[id].hyper_group) first = false;
      }
      if (first) {
        EXPECT_EQ(plan.tensor(id).offset_in_family % 64, 0u) << params[id].name;
      }
    }
    for (Group g : {Group::kBiasLike, Group::kWeight}) {
      uint64_t covered = 0;
      const Span span = plan.hyper_item_span(g);
      const HyperItem* items = plan.hyper_items().data() + (g == Group::kWeight ? plan.hyper_item_span(Group::kBiasLike).count : 0);
      for (uint64_t i = 0; i < span.count; ++i) {
        EXPECT_EQ(items[i].start % 64, 0) << k.name;
        EXPECT_EQ(items[i].count % 64, 0) << k.name;
        EXPECT_LE(items[i].count, kHyperItemElements);
        EXPECT_EQ(static_cast<uint64_t>(items[i].start), covered) << "items must tile the group span in order";
        covered += static_cast<uint64_t>(items[i].count);
      }
      EXPECT_EQ(covered, plan.group_span(Family::kW, g).count) << k.name;
    }
    // Every tensor's items carry its group's block.
    for (size_t id = 0; id < params.size(); ++id) {
      const Group g = group_of(params[id].role);
      const uint64_t begin = plan.tensor(id).offset_in_group;
      const Span span = plan.hyper_item_span(g);
      const HyperItem* items = plan.hyper_items().data() + (g == Group::kWeight ? plan.hyper_item_span(Group::kBiasLike).count : 0);
      for (uint64_t i = 0; i < span.count; ++i) {
        const uint64_t s = static_cast<uint64_t>(items[i].start), e = s + static_cast<uint64_t>(items[i].count);
        if (begin + static_cast<uint64_t>(params[id].numel()) > s && begin < e) {
          EXPECT_EQ(items[i].block, params[id].hyper_group) << params[id].name;
        }
      }
    }
    std::vector<ParamSpec> one = params;
    for (ParamSpec& p : one) p.hyper_group = 0;
    const MemoryPlan plan1(one, plan_config_from_optimizer(k.config.kind));
    EXPECT_TRUE(plan1.hyper_items().empty());
    EXPECT_FALSE(plan1.region(T_HYPER_ITEMS).allocated);
    EXPECT_EQ(plan1.region(S_SCALAR_FP32).count, static_cast<uint64_t>(kNumScalarF32));
    EXPECT_EQ(plan.region(S_SCALAR_FP32).count, static_cast<uint64_t>(kGroups * kNumScalarF32));
    EXPECT_EQ(compile_step(plan, k.config, true).node_count(), compile_step(plan1, k.config, true).node_count());
  }
}

// Groups that differ in what shapes the graph are refused, naming the field; so are group
// indices outside [0, H) and out-of-range group arguments.
TEST(HyperGroups, MismatchedGroupsAreRefusedNamingTheField) {
  auto refused = [](const std::vector<OptimizerConfig>& configs, const char* field) {
    Task t(grouped_params(), task_options(BackendKind::kCpu));
    try {
      t.optimizer_groups(configs);
      ADD_FAILURE() << "accepted groups that differ in " << field;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  const OptimizerConfig adamw = reference_config(OptimizerKind::kAdamW);
  refused({adamw, reference_config(OptimizerKind::kAdam), adamw}, "kind");
  OptimizerConfig sgd = reference_config(OptimizerKind::kSgdMomentum), l2 = sgd;
  l2.weight_decay_mode = WeightDecayMode::kL2;
  refused({sgd, l2, sgd}, "weight_decay_mode");
  OptimizerConfig clipped = adamw;
  clipped.max_grad_norm = 1.0;
  refused({adamw, adamw, clipped}, "max_grad_norm");
  refused({}, "at least one");

  // A parameter of group 2 in a task with two groups: compile() says so.
  Task t(grouped_params(), task_options(BackendKind::kCpu));
  t.optimizer_groups({adamw, adamw});
  EXPECT_THROW(t.compile(), Error);
  Task ok(grouped_params(), task_options(BackendKind::kCpu));
  ok.optimizer_groups({adamw, adamw, adamw});
  ok.compile();
  EXPECT_THROW(ok.set_lr(3, 1e-3), Error);
  EXPECT_THROW(ok.set_group_hyper(-1, adamw), Error);
  EXPECT_THROW(ok.set_group_hyper(1, reference_config(OptimizerKind::kAdam)), Error);
  EXPECT_THROW(ok.optimizer(adamw), Error);  // one configuration for a task compiled with three
  EXPECT_THROW(ok.optimizer_groups({adamw, adamw}), Error);
}

}  // namespace
}  // namespace renaissance
