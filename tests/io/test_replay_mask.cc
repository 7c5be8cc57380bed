// Replay format 2 with steps in which some parameters had no gradient (no_grad_per_step) and
// per-tensor step counts (initial_tensor_steps, expected_tensor_steps): the None gradients
// of renaissance.torch. The reference never goes through the replay: each parameter alone in a
// Task of the plain API, stepped only at the steps where it had a gradient and starting from its
// own count, must end with the bits the masked replay gives it (a masked step is no step for that
// tensor: W, M, V and its count stay). The case's fingerprint is rebuilt from those bits, the
// Task-wide count and the per-tensor counts (which it holds where they differ from the Task's).
// The loader's refusals name case.json / grads.safetensors and the key.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
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

std::vector<float> values(uint32_t seed, int64_t n, float a) { return testing_util::lcg_values(seed, n, a, 4099u); }

// Two AdamW groups (one Task in the replay: same structure and initial_step 3), four tensors.
struct Param {
  ParamSpec spec;
  size_t group;
};
const std::vector<Param> kParams = {{{"g0.w", {6, 5}, Role::kDeepConv}, 0},
                                    {{"g0.b", {5}, Role::kBnBias}, 0},
                                    {{"g1.w", {4, 7}, Role::kFcWeight}, 1},
                                    {{"g1.b", {7}, Role::kFcBias}, 1}};
constexpr int kSteps = 6;
constexpr int64_t kInitialStep = 3;
// g1.w was masked in 2 of the 3 steps before the recording: its own count is 1.
const std::vector<int64_t> kInitialCounts = {3, 3, 1, 3};
// Per step, the masked parameter ids: step 4 has a NaN in g0.w (skipped for the whole Task), and
// at step 5 no parameter has a gradient (the Task is not stepped).
const std::vector<std::set<size_t>> kMasked = {{}, {2}, {1}, {2}, {}, {0, 1, 2, 3}};
constexpr int kNanStep = 4;
const std::vector<double> kScale = {1.0, 1024.0, 1.0, 8.0, 1.0, 1.0};

OptimizerConfig config(size_t g) {
  OptimizerConfig c = default_config(OptimizerKind::kAdamW);
  c.lr = g == 0 ? 2e-3 : 1e-2;
  c.weight_decay = g == 0 ? 0.05 : 0.0;
  return c;
}
double lr_at(size_t g, int t) { return config(g).lr * (1.0 - 0.1 * t); }
std::vector<float> grad_at(size_t id, int t) {
  std::vector<float> g = values(static_cast<uint32_t>(100 * id + t), kParams[id].spec.numel(), 2.0f);
  for (float& x : g) x *= static_cast<float>(kScale[static_cast<size_t>(t)]);  // as the backward wrote it
  if (t == kNanStep && id == 0) g[3] = std::nanf("");
  return g;
}
std::vector<float> init_w(size_t id) { return values(static_cast<uint32_t>(7 + id), kParams[id].spec.numel(), 1.0f); }
std::vector<float> init_m(size_t id) { return values(static_cast<uint32_t>(70 + id), kParams[id].spec.numel(), 0.1f); }
std::vector<float> init_v(size_t id) {
  std::vector<float> v = values(static_cast<uint32_t>(700 + id), kParams[id].spec.numel(), 0.01f);
  for (float& x : v) x = x * x;  // V is a mean of squares
  return v;
}

// Parameter id alone, through the API: its own initial count, stepped only where it had a
// gradient and the Task's step was not skipped. Returns W, M, V.
std::vector<std::vector<float>> reference(size_t id) {
  Task task({kParams[id].spec}, testing_util::cpu_task_options());
  task.optimizer(config(kParams[id].group));
  task.compile();
  task.set_weight(0, init_w(id).data());
  task.write(Family::kM, 0, init_m(id).data());
  task.write(Family::kV, 0, init_v(id).data());
  task.set_step_count(kInitialCounts[id]);
  for (int t = 0; t < kSteps; ++t) {
    if (kMasked[static_cast<size_t>(t)].count(id) || t == kNanStep) continue;
    task.set_loss_scale(kScale[static_cast<size_t>(t)]);
    task.set_lr(lr_at(kParams[id].group, t));
    task.set_grad(0, grad_at(id, t).data());
    task.step();
  }
  const int64_t n = kParams[id].spec.numel();
  std::vector<std::vector<float>> out(3, std::vector<float>(static_cast<size_t>(n)));
  task.read(Family::kW, 0, out[0].data());
  task.read(Family::kM, 0, out[1].data());
  task.read(Family::kV, 0, out[2].data());
  return out;
}

// The case. `edit` changes case.json before it is written; `grads_edit` the gradient list.
void write_case(const std::string& dir, const std::string& expected_fp, const std::vector<int64_t>& expected_counts,
                const std::function<void(nlohmann::json&)>& edit = nullptr,
                const std::function<void(std::vector<std::pair<int, size_t>>&)>& grads_edit = nullptr) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::vector<float>> keep;
  keep.reserve(128);
  std::vector<StTensorView> init, grads;
  for (size_t id = 0; id < kParams.size(); ++id) {
    const ParamSpec& p = kParams[id].spec;
    for (const auto& [prefix, data] : {std::make_pair("", init_w(id)), std::make_pair("m/", init_m(id)),
                                       std::make_pair("v/", init_v(id))}) {
      keep.push_back(data);
      init.push_back({prefix + p.name, StDtype::kF32, p.shape, keep.back().data()});
    }
  }
  std::vector<std::pair<int, size_t>> present;  // (step, id) of each gradient in the file
  for (int t = 0; t < kSteps; ++t) {
    for (size_t id = 0; id < kParams.size(); ++id) {
      if (!kMasked[static_cast<size_t>(t)].count(id)) present.emplace_back(t, id);
    }
  }
  if (grads_edit) grads_edit(present);
  for (const auto& [t, id] : present) {
    keep.push_back(grad_at(id, t));
    grads.push_back({ReplayCase::grad_name(t, kParams[id].spec.name), StDtype::kF32, kParams[id].spec.shape, keep.back().data()});
  }
  nlohmann::json groups = nlohmann::json::array(), no_grad = nlohmann::json::array();
  for (size_t g = 0; g < 2; ++g) {
    nlohmann::json params = nlohmann::json::array(), lrs = nlohmann::json::array(), initial = nlohmann::json::array(),
                   counts = nlohmann::json::array();
    for (size_t id = 0; id < kParams.size(); ++id) {
      if (kParams[id].group != g) continue;
      params.push_back({{"name", kParams[id].spec.name}, {"shape", kParams[id].spec.shape}, {"role", role_name(kParams[id].spec.role)}});
      initial.push_back(kInitialCounts[id]);
      counts.push_back(expected_counts[id]);
    }
    for (int t = 0; t < kSteps; ++t) lrs.push_back(lr_at(g, t));
    const OptimizerConfig c = config(g);
    groups.push_back({{"optimizer", {{"kind", "adamw"}, {"lr", c.lr}, {"weight_decay", c.weight_decay}}},
                      {"params", params},
                      {"lr_per_step", lrs},
                      {"expected_tensor_steps", counts}});
    if (g == 1) groups.back()["initial_tensor_steps"] = initial;  // group 0's equal initial_step
  }
  for (const std::set<size_t>& m : kMasked) {
    no_grad.push_back(nlohmann::json::array());
    for (size_t id : m) no_grad.back().push_back(kParams[id].spec.name);
  }
  nlohmann::json j = {{"format", kReplayFormat2},  {"steps", kSteps},           {"initial_step", kInitialStep},
                      {"loss_scale_per_step", kScale}, {"expected_fingerprint", expected_fp}, {"groups", groups},
                      {"no_grad_per_step", no_grad}};
  if (edit) edit(j);
  write_safetensors(dir + "/init.safetensors", init, {});
  write_safetensors(dir + "/grads.safetensors", grads, {});
  std::ofstream(dir + "/case.json") << j.dump(1);
}

// Counted by hand from kMasked (steps 0-3 applied, 4 skipped, 5 not stepped).
const std::vector<int64_t> kFinalCounts = {3 + 4, 3 + 3, 1 + 2, 3 + 4};
constexpr int64_t kFinalTaskCount = kInitialStep + 4;

// The case's fingerprint from the reference bits: a Task of all four tensors (two hyperparameter
// groups) holding them, the Task-wide count and the hand-counted per-tensor counts, hashed per
// group and combined.
std::string expected_fingerprint() {
  std::vector<ParamSpec> specs;
  for (const Param& p : kParams) {
    specs.push_back(p.spec);
    specs.back().hyper_group = static_cast<int>(p.group);
  }
  TaskOptions options = testing_util::cpu_task_options();
  options.tensor_mask = true;
  Task task(specs, options);
  task.optimizer_groups({config(0), config(1)});
  task.compile();
  for (size_t id = 0; id < kParams.size(); ++id) {
    const std::vector<std::vector<float>> r = reference(id);
    task.set_weight(id, r[0].data());
    task.write(Family::kM, id, r[1].data());
    task.write(Family::kV, id, r[2].data());
  }
  task.set_step_count(kFinalTaskCount);
  task.set_tensor_steps(kFinalCounts);
  return combine_fingerprints({task.fingerprint({0, 1}), task.fingerprint({2, 3})});
}

std::string case_dir(const char* name) { return testing_util::unique_temp_path(std::string("replay-mask-") + name); }

TEST(ReplayMask, MaskedStepsLeaveEachTensorAsIfItHadNotStepped) {
  const std::string dir = case_dir("run");
  const std::string fp = expected_fingerprint();
  write_case(dir, fp, kFinalCounts);
  const ReplayCase rc = load_replay_case(dir);
  EXPECT_TRUE(rc.masked(1, 2) && rc.masked(5, 0) && !rc.masked(0, 2));
  EXPECT_EQ(replay_tasks(rc), (std::vector<std::vector<size_t>>{{0, 1}}));
  const ReplayResult r = run_replay(rc, testing_util::cpu_task_options());
  EXPECT_EQ(r.group_masked, (std::vector<bool>{true, true}));
  for (size_t id = 0; id < kParams.size(); ++id) {
    const std::vector<std::vector<float>> ref = reference(id);
    EXPECT_TRUE(testing_util::same_bits(r.w[id], ref[0])) << kParams[id].spec.name << " W";
    EXPECT_TRUE(testing_util::same_bits(r.m[id], ref[1])) << kParams[id].spec.name << " M";
    EXPECT_TRUE(testing_util::same_bits(r.v[id], ref[2])) << kParams[id].spec.name << " V";
  }
  EXPECT_EQ(r.tensor_steps, kFinalCounts);
  EXPECT_EQ(r.group_step_counts, (std::vector<int64_t>{kFinalTaskCount, kFinalTaskCount}));
  EXPECT_EQ(r.fingerprint, fp);
  EXPECT_TRUE(fingerprint_matches(rc, r));
  EXPECT_TRUE(tensor_step_mismatches(rc, r).empty());
  fs::remove_all(dir);
}

TEST(ReplayMask, AWrongExpectedTensorCountIsReported) {
  const std::string dir = case_dir("counts");
  std::vector<int64_t> wrong = kFinalCounts;
  wrong[2] += 1;
  write_case(dir, expected_fingerprint(), wrong);
  const ReplayCase rc = load_replay_case(dir);
  const ReplayResult r = run_replay(rc, testing_util::cpu_task_options());
  EXPECT_EQ(tensor_step_mismatches(rc, r), (std::vector<std::string>{"g1.w: expected 4, got 3"}));
  fs::remove_all(dir);
}

TEST(ReplayMask, TheLoaderRefusesWhatTheMaskCannotMean) {
  const std::string dir = case_dir("bad");
  const auto rejected = [&](const std::function<void(nlohmann::json&)>& edit, const std::vector<std::string>& words,
                            const std::function<void(std::vector<std::pair<int, size_t>>&)>& grads_edit = nullptr) {
    write_case(dir, "0123456789abcdef", kFinalCounts, edit, grads_edit);
    testing_util::expect_replay_rejected(dir, words);
  };
  // A gradient for a masked parameter, and none for one that was not masked.
  rejected(nullptr, {"grads.safetensors", "step1/g1.w", "no_grad_per_step[1]"},
           [](std::vector<std::pair<int, size_t>>& g) { g.emplace_back(1, 2); });
  rejected(nullptr, {"grads.safetensors", "missing tensor", "step0/g0.b"},
           [](std::vector<std::pair<int, size_t>>& g) { g.erase(g.begin() + 1); });
  rejected([](nlohmann::json& j) { j["no_grad_per_step"][1] = {"g1.w", "nope"}; },
           {"case.json", "no_grad_per_step[1]", "\"nope\" is not a parameter"});
  rejected([](nlohmann::json& j) { j["no_grad_per_step"][1] = {"g1.w", "g1.w"}; }, {"no_grad_per_step[1]", "twice"});
  rejected([](nlohmann::json& j) { j["no_grad_per_step"].erase(5); }, {"no_grad_per_step", "6 arrays"});
  rejected([](nlohmann::json& j) { j["groups"][1]["initial_tensor_steps"] = {1}; },
           {"groups[1].initial_tensor_steps", "2 integers"});
  rejected([](nlohmann::json& j) { j["groups"][1]["expected_tensor_steps"] = {1, -2}; },
           {"groups[1].expected_tensor_steps[1]", "non-negative"});
  // The core's mask combines with clipping and with LAMB: those cases load.
  write_case(dir, "0123456789abcdef", kFinalCounts, [](nlohmann::json& j) { j["groups"][1]["optimizer"]["max_grad_norm"] = 1.0; });
  EXPECT_NO_THROW(load_replay_case(dir));
  write_case(dir, "0123456789abcdef", kFinalCounts, [](nlohmann::json& j) { j["groups"][0]["optimizer"] = {{"kind", "lamb"}}; });
  EXPECT_NO_THROW(load_replay_case(dir));
  rejected([](nlohmann::json& j) {
    j["format"] = kReplayFormat;
  }, {"case.json", "no_grad_per_step"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace renaissance
