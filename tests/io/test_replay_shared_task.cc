// Replay format 2 runs the groups of one structure (kind, weight-decay mode, max_grad_norm,
// initial_step) in ONE Task, as renaissance.torch does, so global clipping spans the
// groups it spanned in the recording. The expected fingerprint comes from Tasks driven directly
// through the API (a shared Task with optimizer_groups, never the replay reader); a control shows
// that one Task per group clips differently, so a replay that split the groups would fail.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "renaissance/fingerprint.h"
#include "renaissance/replay.h"
#include "renaissance/safetensors.h"
#include "renaissance/task.h"
#include "support/replay_test_util.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

namespace fs = std::filesystem;

std::vector<float> values(uint32_t seed, int64_t n, float a) { return testing_util::lcg_values(seed, n, a, 977u); }

using Group = testing_util::CaseGroup;

// Two AdamW groups that clip at 0.5 (gradients of amplitude 3: the norm is far above it, so every
// step clips) and an SGD-Nesterov group without clipping: two structures.
std::vector<Group> groups() {
  OptimizerConfig a0 = default_config(OptimizerKind::kAdamW);
  a0.lr = 2e-3;
  a0.weight_decay = 0.05;
  a0.max_grad_norm = 0.5;
  OptimizerConfig a1 = a0;
  a1.lr = 1e-2;
  a1.weight_decay = 0.0;
  OptimizerConfig n = default_config(OptimizerKind::kSgdNesterov);
  n.lr = 0.1;
  n.momentum = 0.9;
  return {{a0, {{"g0.w", {6, 5}, Role::kDeepConv}, {"g0.b", {5}, Role::kBnBias}}},
          {a1, {{"g1.w", {4, 7}, Role::kFcWeight}, {"g1.b", {7}, Role::kFcBias}}},
          {n, {{"g2.w", {3, 3}, Role::kFcWeight}}}};
}

constexpr int kSteps = 4;
double lr_at(size_t g, int t) { return groups()[g].config.lr * (1.0 - 0.2 * t); }
std::vector<float> grad_at(size_t g, size_t k, int t, int64_t n) {
  return values(static_cast<uint32_t>(1000 * g + 100 * k + t), n, 3.0f);
}
std::vector<float> init_at(size_t g, size_t k, int64_t n) { return values(static_cast<uint32_t>(7 + 10 * g + k), n, 1.0f); }

// The run through the API: `shared` puts groups 0 and 1 in one Task (hyperparameter groups 0, 1),
// otherwise every group has its own Task. Returns the groups' fingerprints combined.
std::string reference(bool shared) {
  const std::vector<Group> gs = groups();
  std::vector<std::vector<size_t>> members = shared ? std::vector<std::vector<size_t>>{{0, 1}, {2}}
                                                    : std::vector<std::vector<size_t>>{{0}, {1}, {2}};
  std::vector<std::unique_ptr<Task>> tasks;
  std::vector<std::vector<std::pair<size_t, size_t>>> ids;  // per task: (group, k) of each id
  for (const std::vector<size_t>& m : members) {
    std::vector<ParamSpec> specs;
    std::vector<OptimizerConfig> configs;
    ids.emplace_back();
    for (size_t h = 0; h < m.size(); ++h) {
      for (size_t k = 0; k < gs[m[h]].params.size(); ++k) {
        specs.push_back(gs[m[h]].params[k]);
        specs.back().hyper_group = static_cast<int>(h);
        ids.back().emplace_back(m[h], k);
      }
      configs.push_back(gs[m[h]].config);
    }
    tasks.push_back(std::make_unique<Task>(specs, testing_util::cpu_task_options()));
    tasks.back()->optimizer_groups(configs);
    tasks.back()->compile();
    for (size_t id = 0; id < specs.size(); ++id) {
      tasks.back()->set_weight(id, init_at(ids.back()[id].first, ids.back()[id].second, specs[id].numel()).data());
    }
  }
  for (int t = 0; t < kSteps; ++t) {
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      for (size_t h = 0; h < members[ti].size(); ++h) tasks[ti]->set_lr(static_cast<int>(h), lr_at(members[ti][h], t));
      for (size_t id = 0; id < ids[ti].size(); ++id) {
        const auto [g, k] = ids[ti][id];
        tasks[ti]->set_grad(id, grad_at(g, k, t, tasks[ti]->param(id).numel()).data());
      }
      tasks[ti]->step();
    }
  }
  std::vector<std::string> fps(gs.size());
  for (size_t ti = 0; ti < tasks.size(); ++ti) {
    for (size_t g : members[ti]) {
      std::vector<size_t> of_group;
      for (size_t id = 0; id < ids[ti].size(); ++id) {
        if (ids[ti][id].first == g) of_group.push_back(id);
      }
      fps[g] = tasks[ti]->fingerprint(of_group);
    }
  }
  return combine_fingerprints(fps);
}

// Writes the case (initial weights, gradients, per-group lr) with `expected` as its fingerprint.
void write_case(const std::string& dir, const std::string& expected) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::vector<Group> gs = groups();
  std::vector<std::vector<float>> keep;
  keep.reserve(64);
  std::vector<StTensorView> init, grads;
  nlohmann::json gj = nlohmann::json::array();
  for (size_t g = 0; g < gs.size(); ++g) {
    nlohmann::json params = nlohmann::json::array(), lrs = nlohmann::json::array();
    for (size_t k = 0; k < gs[g].params.size(); ++k) {
      const ParamSpec& p = gs[g].params[k];
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"role", role_name(p.role)}});
      keep.push_back(init_at(g, k, p.numel()));
      init.push_back({p.name, StDtype::kF32, p.shape, keep.back().data()});
      for (int t = 0; t < kSteps; ++t) {
        keep.push_back(grad_at(g, k, t, p.numel()));
        grads.push_back({ReplayCase::grad_name(t, p.name), StDtype::kF32, p.shape, keep.back().data()});
      }
    }
    for (int t = 0; t < kSteps; ++t) lrs.push_back(lr_at(g, t));
    const OptimizerConfig& c = gs[g].config;
    gj.push_back({{"optimizer", {{"kind", optimizer_kind_name(c.kind)}, {"lr", c.lr}, {"weight_decay", c.weight_decay},
                                 {"momentum", c.momentum}, {"max_grad_norm", c.max_grad_norm}}},
                  {"params", params},
                  {"lr_per_step", lrs}});
  }
  write_safetensors(dir + "/init.safetensors", init, {});
  write_safetensors(dir + "/grads.safetensors", grads, {});
  const nlohmann::json j = {{"format", kReplayFormat2}, {"steps", kSteps}, {"expected_fingerprint", expected}, {"groups", gj}};
  std::ofstream(dir + "/case.json") << j.dump(1);
}

TEST(ReplaySharedTask, ClippingOverGroupsReplaysToTheSharedTasksBits) {
  const std::string shared = reference(true), separate = reference(false);
  // The control: clipping each group alone ends elsewhere, so this case tells the two apart.
  ASSERT_NE(shared, separate);
  const std::string dir = testing_util::unique_temp_path("replay-shared-task");
  write_case(dir, shared);
  const ReplayCase rc = load_replay_case(dir);
  EXPECT_EQ(replay_tasks(rc), (std::vector<std::vector<size_t>>{{0, 1}, {2}}));
  const ReplayResult r = run_replay(rc, testing_util::cpu_task_options());
  EXPECT_EQ(r.num_tasks, 2u);
  EXPECT_EQ(r.group_task, (std::vector<size_t>{0, 0, 1}));
  EXPECT_EQ(r.fingerprint, shared);
  EXPECT_TRUE(fingerprint_matches(rc, r));
  fs::remove_all(dir);
}

// Which groups share a Task, from case.json alone.
std::vector<std::vector<size_t>> tasks_of(const nlohmann::json& group_list, const nlohmann::json& extra = {}) {
  nlohmann::json j = {{"format", kReplayFormat2}, {"steps", 1}, {"groups", group_list}};
  for (auto it = extra.begin(); extra.is_object() && it != extra.end(); ++it) j[it.key()] = it.value();
  return replay_tasks(parse_replay_case_json(j.dump(), "case"));
}

nlohmann::json group(const std::string& name, nlohmann::json optimizer, int64_t initial_step = 0) {
  nlohmann::json g = {{"optimizer", optimizer}, {"params", {{{"name", name}, {"shape", {2}}, {"role", "fc_weight"}}}}};
  if (initial_step) g["initial_step"] = initial_step;
  return g;
}

TEST(ReplaySharedTask, GroupsOfAnotherStructureOrStepCountGetTheirOwnTask) {
  const nlohmann::json adamw = {{"kind", "adamw"}, {"lr", 1e-3}};
  nlohmann::json clipped = adamw;
  clipped["max_grad_norm"] = 1.0;
  nlohmann::json other_lr = adamw;
  other_lr["lr"] = 5e-2;
  other_lr["weight_decay"] = 0.0;
  using Tasks = std::vector<std::vector<size_t>>;
  // Scalars may differ within one Task; kind, clipping and the step count may not.
  EXPECT_EQ(tasks_of({group("a", adamw), group("b", other_lr), group("c", clipped), group("d", adamw)}),
            (Tasks{{0, 1, 3}, {2}}));
  EXPECT_EQ(tasks_of({group("a", adamw), group("b", {{"kind", "lamb"}, {"lr", 1e-3}})}), (Tasks{{0}, {1}}));
  EXPECT_EQ(tasks_of({group("a", adamw, 3), group("b", adamw, 4), group("c", adamw, 3)}), (Tasks{{0, 2}, {1}}));
  const nlohmann::json sgd = {{"kind", "sgd"}, {"lr", 0.1}, {"weight_decay", 1e-4}};
  nlohmann::json sgd_l2 = sgd;
  sgd_l2["weight_decay_mode"] = "l2";
  EXPECT_EQ(tasks_of({group("a", sgd), group("b", sgd_l2)}), (Tasks{{0}, {1}}));
  // Stochastic rounding keys by the parameter's index within its group: one Task per group.
  EXPECT_EQ(tasks_of({group("a", adamw), group("b", adamw)}, {{"precision", "bf16"}, {"rounding", "stochastic"}}),
            (Tasks{{0}, {1}}));
  EXPECT_EQ(tasks_of({group("a", adamw), group("b", adamw)}, {{"precision", "bf16"}}), (Tasks{{0, 1}}));
}

}  // namespace
}  // namespace renaissance
