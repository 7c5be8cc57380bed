// Tests of replay format 2 (docs/replay-format.md): several parameter groups, an initial
// optimizer state with its step count, and an expected fingerprint checked bitwise. The expected
// values come from Tasks driven directly through the API for the whole run (never from the
// replay reader), and the multi-group fingerprint is recomputed here from its definition with
// xxHash; Task::set_step_count is checked bit for bit against a run that took those steps. Also
// the committed case that renaissance.torch.Recorder wrote (testdata/recorded/).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "renaissance/error.h"
#include "renaissance/fingerprint.h"
#include "renaissance/replay.h"
#include "support/replay_test_util.h"
#include "renaissance/safetensors.h"
#include "renaissance/task.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

namespace fs = std::filesystem;

std::vector<float> values(uint32_t seed, int64_t n, float a) { return testing_util::lcg_values(seed, n, a); }

// The multi-group fingerprint from its definition (fingerprint.h), written separately here.
std::string combined_by_definition(const std::vector<std::string>& fps) {
  if (fps.size() == 1) return fps[0];
  std::string joined;
  for (size_t i = 0; i < fps.size(); ++i) joined += (i ? "\n" : "") + fps[i];
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(XXH3_64bits(joined.data(), joined.size())));
  return text;
}

using GroupDef = testing_util::CaseGroup;

// Two groups of different kinds (adamw: M, V and bias corrections; sgd_nesterov: M only).
std::vector<GroupDef> two_groups() {
  OptimizerConfig adamw = default_config(OptimizerKind::kAdamW);
  adamw.lr = 2e-3;
  adamw.weight_decay = 0.05;
  OptimizerConfig nesterov = default_config(OptimizerKind::kSgdNesterov);
  nesterov.lr = 0.1;
  nesterov.momentum = 0.9;
  nesterov.weight_decay = 1e-4;
  return {{adamw, {{"g0.w", {6, 5}, Role::kDeepConv}, {"g0.b", {5}, Role::kBnBias}}},
          {nesterov, {{"g1.w", {4, 7}, Role::kFcWeight}, {"g1.z", {0}, Role::kFcBias}, {"g1.b", {7}, Role::kFcBias}}}};
}

constexpr int kPrefix = 3;  // steps taken before the recorded state
constexpr int kSteps = 5;   // steps in the case

double lr_at(size_t g, int t) { return (g == 0 ? 2e-3 : 0.1) * (1.0 - 0.1 * t); }
double scale_at(int t) { return t == 1 ? 512.0 : 1024.0; }
std::vector<float> grad_at(size_t g, size_t k, int t, int64_t n) {
  std::vector<float> v = values(static_cast<uint32_t>(1000 * g + 100 * k + t), n, 300.0f);
  // Group 1 holds a non-finite gradient in case step 2: that group skips it, group 0 does not.
  if (g == 1 && k == 0 && t == kPrefix + 2 && n > 3) v[3] = std::numeric_limits<float>::infinity();
  return v;
}

// Writes a format-2 case into `dir`: the state of the reference tasks after kPrefix steps, then
// kSteps steps; returns the reference tasks' combined fingerprint after all kPrefix + kSteps.
std::string write_two_group_case(const std::string& dir) {
  const std::vector<GroupDef> groups = two_groups();
  std::vector<std::unique_ptr<Task>> tasks;
  for (size_t g = 0; g < groups.size(); ++g) {
    tasks.push_back(std::make_unique<Task>(groups[g].params, testing_util::cpu_task_options()));
    tasks[g]->optimizer(groups[g].config);
    tasks[g]->compile();
    for (size_t k = 0; k < groups[g].params.size(); ++k) {
      const std::vector<float> w = values(static_cast<uint32_t>(77 + 10 * g + k), groups[g].params[k].numel(), 1.0f);
      tasks[g]->set_weight(k, w.data());
    }
  }
  std::vector<std::vector<float>> keep;  // owns the data the views point to
  keep.reserve(1000);
  std::vector<StTensorView> init, grads;
  nlohmann::json gj = nlohmann::json::array();
  nlohmann::json scales = nlohmann::json::array();
  for (int t = 0; t < kPrefix + kSteps; ++t) {
    if (t == kPrefix) {  // the recorded initial state
      for (size_t g = 0; g < groups.size(); ++g) {
        nlohmann::json params = nlohmann::json::array();
        for (size_t k = 0; k < groups[g].params.size(); ++k) {
          const ParamSpec& p = groups[g].params[k];
          params.push_back({{"name", p.name}, {"shape", p.shape}, {"role", role_name(p.role)}});
          for (Family f : {Family::kW, Family::kM, Family::kV}) {
            if (!tasks[g]->plan().has_family(f)) continue;
            keep.emplace_back(static_cast<size_t>(p.numel()));
            tasks[g]->read(f, k, keep.back().data());
            const std::string prefix = f == Family::kW ? "" : f == Family::kM ? "m/" : "v/";
            init.push_back({prefix + p.name, StDtype::kF32, p.shape, keep.back().data()});
          }
        }
        const OptimizerConfig& c = groups[g].config;
        nlohmann::json lrs = nlohmann::json::array();
        for (int s = 0; s < kSteps; ++s) lrs.push_back(lr_at(g, kPrefix + s));
        gj.push_back({{"optimizer", {{"kind", optimizer_kind_name(c.kind)}, {"lr", c.lr}, {"weight_decay", c.weight_decay},
                                     {"momentum", c.momentum}, {"beta1", c.beta1}, {"beta2", c.beta2}, {"eps", c.eps}}},
                      {"params", params}, {"lr_per_step", lrs}});
        EXPECT_EQ(tasks[g]->step_count(), kPrefix);
      }
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      tasks[g]->set_lr(lr_at(g, t));
      tasks[g]->set_loss_scale(scale_at(t));
      for (size_t k = 0; k < groups[g].params.size(); ++k) {
        const ParamSpec& p = groups[g].params[k];
        keep.push_back(grad_at(g, k, t, p.numel()));
        tasks[g]->set_grad(k, keep.back().data());
        if (t >= kPrefix) grads.push_back({ReplayCase::grad_name(t - kPrefix, p.name), StDtype::kF32, p.shape, keep.back().data()});
      }
      tasks[g]->step();
    }
    if (t >= kPrefix) scales.push_back(scale_at(t));
  }
  EXPECT_EQ(tasks[0]->step_count(), kPrefix + kSteps);
  EXPECT_EQ(tasks[1]->step_count(), kPrefix + kSteps - 1);  // the Inf step
  fs::create_directories(dir);
  write_safetensors(dir + "/init.safetensors", init);
  write_safetensors(dir + "/grads.safetensors", grads);
  const std::string expected = combined_by_definition({tasks[0]->fingerprint(), tasks[1]->fingerprint()});
  nlohmann::json j = {{"format", "renaissance-replay/2"}, {"name", "two_groups"}, {"steps", kSteps},
                      {"loss_scale_per_step", scales}, {"initial_step", kPrefix},
                      {"expected_fingerprint", expected}, {"groups", gj}};
  std::ofstream(dir + "/case.json") << j.dump(1);
  return expected;
}

class ReplayGroups : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::make_temp_dir("/tmp/rn-replay2-XXXXXX");
    ASSERT_FALSE(dir_.empty());
    expected_ = write_two_group_case(dir_);
    std::ifstream in(dir_ + "/case.json");
    original_ = nlohmann::json::parse(in);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // The case.json the fixture wrote (each edit below starts from it).
  nlohmann::json case_json() const { return original_; }
  void set_case_json(const nlohmann::json& j) const { std::ofstream(dir_ + "/case.json", std::ios::trunc) << j.dump(); }
  // Rewrites init.safetensors with `edit` applied to its tensors (name -> shape, data).
  template <typename F>
  void edit_init(F&& edit) const {
    const SafetensorsReader in(dir_ + "/init.safetensors");
    std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> t;
    for (const auto& kv : in.tensors()) t[kv.first] = {kv.second.shape, in.read_f32(kv.first)};
    edit(t);
    std::vector<StTensorView> views;
    for (const auto& kv : t) views.push_back({kv.first, StDtype::kF32, kv.second.first, kv.second.second.data()});
    write_safetensors(dir_ + "/init.safetensors", views);
  }
  void expect_rejected(const std::vector<std::string>& words) const {
    testing_util::expect_replay_rejected(dir_, words);
  }
  // case.json changed by edit(j) must fail to load with a message containing every word.
  template <typename F>
  void expect_edit_rejected(F&& edit, const std::vector<std::string>& words) const {
    testing_util::expect_case_edit_rejected(dir_, case_json(), edit, words);
  }
  std::string dir_, expected_;
  nlohmann::json original_;
};

TEST(CombineFingerprints, OneGroupIsItselfSeveralAreTheDefinition) {
  EXPECT_EQ(combine_fingerprints({"0123456789abcdef"}), "0123456789abcdef");
  const std::vector<std::string> two = {"0123456789abcdef", "fedcba9876543210"};
  EXPECT_EQ(combine_fingerprints(two), combined_by_definition(two));
  // Order matters: groups are not interchangeable.
  EXPECT_NE(combine_fingerprints(two), combine_fingerprints({two[1], two[0]}));
  EXPECT_THROW(combine_fingerprints({}), Error);
  EXPECT_THROW(combine_fingerprints({"0123456789ABCDEF"}), Error);
  EXPECT_THROW(combine_fingerprints({"0123456789abcde"}), Error);
}

// t steps taken, or the state after t steps written in with set_step_count(t): the saved
// checkpoints (every scalar slot, the bias corrections included) are byte-identical at once and
// after more steps, which give the same bits. Without set_step_count the run differs.
TEST(SetStepCount, EqualsARunThatTookThoseSteps) {
  const std::vector<ParamSpec> params = {{"w", {9, 4}, Role::kDeepConv}, {"b", {4}, Role::kBnBias}};
  OptimizerConfig c = default_config(OptimizerKind::kAdamW);
  c.lr = 1e-2;
  Task ran(params, testing_util::cpu_task_options()), resumed(params, testing_util::cpu_task_options()), unstepped(params, testing_util::cpu_task_options());
  for (Task* t : {&ran, &resumed, &unstepped}) {
    t->optimizer(c);
    t->compile();
  }
  auto feed = [&](Task& t, int step) {
    for (size_t k = 0; k < params.size(); ++k) {
      const std::vector<float> g = values(static_cast<uint32_t>(50 + 7 * step + k), params[k].numel(), 0.5f);
      t.set_grad(k, g.data());
    }
  };
  for (size_t k = 0; k < params.size(); ++k) {
    const std::vector<float> w = values(static_cast<uint32_t>(3 + k), params[k].numel(), 1.0f);
    ran.set_weight(k, w.data());
  }
  for (int s = 0; s < 4; ++s) {
    feed(ran, s);
    ran.step();
  }
  for (size_t k = 0; k < params.size(); ++k) {
    std::vector<float> buf(static_cast<size_t>(params[k].numel()));
    for (Family f : {Family::kW, Family::kM, Family::kV, Family::kG}) {
      ran.read(f, k, buf.data());
      resumed.write(f, k, buf.data());
      unstepped.write(f, k, buf.data());
    }
  }
  resumed.set_step_count(4);
  EXPECT_EQ(resumed.step_count(), 4);
  EXPECT_EQ(resumed.fingerprint(), ran.fingerprint());
  const std::string a = testing_util::unique_temp_path("setstep-a.ckpt"), b = testing_util::unique_temp_path("setstep-b.ckpt");
  auto bytes = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  ran.save(a);
  resumed.save(b);
  EXPECT_TRUE(bytes(a) == bytes(b)) << "checkpoints differ right after set_step_count";
  for (int s = 4; s < 7; ++s) {
    for (Task* t : {&ran, &resumed, &unstepped}) {
      feed(*t, s);
      t->step();
    }
  }
  EXPECT_EQ(resumed.fingerprint(), ran.fingerprint());
  EXPECT_NE(unstepped.fingerprint(), ran.fingerprint());
  ran.save(a);
  resumed.save(b);
  EXPECT_TRUE(bytes(a) == bytes(b)) << "checkpoints differ after more steps";
  fs::remove(a);
  fs::remove(b);
  EXPECT_THROW(resumed.set_step_count(-1), Error);
  EXPECT_THROW(resumed.set_step_count(int64_t{1} << 31), Error);
}

TEST_F(ReplayGroups, ReplaysToTheUninterruptedRunsFingerprint) {
  const ReplayCase rc = load_replay_case(dir_);
  ASSERT_EQ(rc.format, 2);
  ASSERT_EQ(rc.groups.size(), 2u);
  EXPECT_EQ(rc.expected_fingerprint, expected_);
  const ReplayResult r = run_replay(rc, testing_util::cpu_task_options());
  EXPECT_EQ(r.fingerprint, expected_);
  EXPECT_TRUE(fingerprint_matches(rc, r));
  EXPECT_EQ(r.group_step_counts, (std::vector<int64_t>{kPrefix + kSteps, kPrefix + kSteps - 1}));
  EXPECT_EQ(r.steps_applied, 2 * kSteps - 1);
  EXPECT_EQ(r.steps_skipped, 1);
  EXPECT_EQ(combined_by_definition(r.group_fingerprints), r.fingerprint);
}

TEST_F(ReplayGroups, OnEveryBackendTheSameBits) {
  const ReplayCase rc = load_replay_case(dir_);
  bool missing_backend = false;
  for (BackendKind b : testing_util::backends_under_test()) {
    if (!backend_available(b)) {  // a CUDA build on a machine without a GPU (CI): CPU only
      missing_backend = true;
      continue;
    }
    TaskOptions o;
    o.backend = b;
    EXPECT_EQ(run_replay(rc, o).fingerprint, expected_) << backend_kind_name(b);
  }
  if (missing_backend) GTEST_SKIP() << "the CPU matched; backend cuda is not available on this machine";
}

TEST_F(ReplayGroups, AWrongFingerprintDoesNotMatch) {
  nlohmann::json j = case_json();
  std::string f = expected_;
  f[15] = f[15] == '0' ? '1' : '0';
  j["expected_fingerprint"] = f;
  set_case_json(j);
  const ReplayCase rc = load_replay_case(dir_);
  EXPECT_FALSE(fingerprint_matches(rc, run_replay(rc, testing_util::cpu_task_options())));
}

TEST_F(ReplayGroups, WithoutTheInitialStateOrStepTheBitsDiffer) {
  // Each part of the initial state matters: dropping it changes the result.
  nlohmann::json j = case_json();
  j.erase("initial_step");
  set_case_json(j);
  EXPECT_NE(run_replay(load_replay_case(dir_), testing_util::cpu_task_options()).fingerprint, expected_);
  j["initial_step"] = kPrefix;
  set_case_json(j);
  edit_init([](auto& t) { t.erase("v/g0.w"); t.erase("v/g0.b"); });
  EXPECT_NE(run_replay(load_replay_case(dir_), testing_util::cpu_task_options()).fingerprint, expected_);
}

TEST_F(ReplayGroups, ATamperedGradientChangesTheFingerprint) {
  const SafetensorsReader in(dir_ + "/grads.safetensors");
  std::vector<std::vector<float>> data;
  std::vector<StTensorView> views;
  data.reserve(in.tensors().size());
  for (const auto& kv : in.tensors()) {
    data.push_back(in.read_f32(kv.first));
    if (kv.first == "step4/g1.b") {  // one byte of one element: mantissa bits 16..23
      unsigned char bytes[4];
      std::memcpy(bytes, &data.back()[0], 4);
      bytes[2] ^= 0x01;
      std::memcpy(&data.back()[0], bytes, 4);
    }
    views.push_back({kv.first, StDtype::kF32, kv.second.shape, data.back().data()});
  }
  write_safetensors(dir_ + "/grads.safetensors", views);
  const ReplayCase rc = load_replay_case(dir_);
  EXPECT_FALSE(fingerprint_matches(rc, run_replay(rc, testing_util::cpu_task_options())));
}

// ---- every new validation error names the file and the key ----

TEST_F(ReplayGroups, Format1RejectsFormat2Keys) {
  expect_edit_rejected([](nlohmann::json& j) { j["format"] = "renaissance-replay/1"; },
                       {"case.json", "'expected_fingerprint'", "renaissance-replay/2"});
}

TEST_F(ReplayGroups, Format2RejectsTopLevelOptimizer) {
  expect_edit_rejected([](nlohmann::json& j) { j["optimizer"] = {{"kind", "adamw"}}; },
                       {"case.json", "'optimizer'", "groups"});
}

TEST_F(ReplayGroups, UnknownFormat) {
  expect_edit_rejected([](nlohmann::json& j) { j["format"] = "renaissance-replay/3"; },
                       {"case.json", "format", "renaissance-replay/3"});
}

TEST_F(ReplayGroups, GroupsMissingEmptyOrNotObjects) {
  nlohmann::json j = case_json();
  j.erase("groups");
  set_case_json(j);
  expect_rejected({"case.json", "missing key 'groups'"});
  j["groups"] = nlohmann::json::array();
  set_case_json(j);
  expect_rejected({"case.json", "groups", "non-empty"});
  j["groups"] = {1};
  set_case_json(j);
  expect_rejected({"case.json", "groups[0]", "object"});
}

TEST_F(ReplayGroups, GroupKeys) {
  nlohmann::json j = case_json();
  j["groups"][1]["betas"] = 1;
  set_case_json(j);
  expect_rejected({"case.json", "groups[1]", "'betas'"});
  j = case_json();
  j["groups"][1].erase("optimizer");
  set_case_json(j);
  expect_rejected({"case.json", "groups[1]", "'optimizer'"});
  j = case_json();
  j["groups"][0].erase("params");
  set_case_json(j);
  expect_rejected({"case.json", "groups[0]", "'params'"});
  j = case_json();
  j["groups"][1]["optimizer"]["momentum"] = -1;
  set_case_json(j);
  expect_rejected({"case.json", "groups[1].optimizer", "momentum"});
  j = case_json();
  j["groups"][1]["params"][0]["role"] = "nope";
  set_case_json(j);
  expect_rejected({"case.json", "groups[1]", "'g1.w'", "role"});
}

// A key the group's kind does not read is refused off the kind's default, naming the group, the
// kind and the key; at the default it loads (the fixture writes momentum 0 on adamw and betas and
// eps on sgd_nesterov, as a recorded case writes every number).
TEST_F(ReplayGroups, AKeyTheKindDoesNotReadIsRefusedOffItsDefault) {
  ASSERT_EQ(case_json()["groups"][0]["optimizer"]["kind"], "adamw");
  ASSERT_EQ(case_json()["groups"][1]["optimizer"]["kind"], "sgd_nesterov");
  ASSERT_EQ(case_json()["groups"][0]["optimizer"]["momentum"], 0.0);
  ASSERT_EQ(case_json()["groups"][1]["optimizer"]["beta1"], 0.9);
  EXPECT_NO_THROW(load_replay_case(dir_));
  expect_edit_rejected([](nlohmann::json& j) { j["groups"][0]["optimizer"]["momentum"] = 0.9; },
                       {"case.json", "groups[0].optimizer", "adamw does not take momentum (0.9 given"});
  expect_edit_rejected([](nlohmann::json& j) { j["groups"][1]["optimizer"]["beta1"] = 0.8; },
                       {"case.json", "groups[1].optimizer", "sgd_nesterov does not take beta1 (0.8 given"});
  expect_edit_rejected([](nlohmann::json& j) { j["groups"][0]["optimizer"]["trust_coefficient"] = 0.02; },
                       {"case.json", "groups[0].optimizer", "adamw does not take trust_coefficient"});
  expect_edit_rejected([](nlohmann::json& j) { j["groups"][1]["optimizer"]["aux_lr"] = 0.01; },
                       {"case.json", "groups[1].optimizer", "sgd_nesterov does not take aux_lr", "muon"});
  // The kind's default written out: sgd_nesterov's trust_coefficient, adamw's aux_lr.
  nlohmann::json j = case_json();
  j["groups"][1]["optimizer"]["trust_coefficient"] = 0.001;
  j["groups"][0]["optimizer"]["aux_lr"] = 3e-4;
  set_case_json(j);
  EXPECT_NO_THROW(load_replay_case(dir_));
}

TEST_F(ReplayGroups, GroupScheduleWrongLengthOrValue) {
  nlohmann::json j = case_json();
  j["groups"][1]["lr_per_step"] = {0.1};
  set_case_json(j);
  expect_rejected({"case.json", "groups[1].lr_per_step", "1 entries", "steps is 5"});
  j["groups"][1]["lr_per_step"] = {0.1, 0.1, -0.1, 0.1, 0.1};
  set_case_json(j);
  expect_rejected({"case.json", "groups[1].lr_per_step[2]"});
}

TEST_F(ReplayGroups, NameInTwoGroups) {
  expect_edit_rejected([](nlohmann::json& j) { j["groups"][1]["params"][1]["name"] = "g0.b"; },
                       {"case.json", "groups[1]", "'g0.b'", "groups[0]", "unique"});
}

TEST_F(ReplayGroups, BadInitialStep) {
  for (const nlohmann::json& bad : {nlohmann::json(-1), nlohmann::json(1.5), nlohmann::json("3"),
                                    nlohmann::json(int64_t{1} << 31)}) {
    nlohmann::json j = case_json();
    j["initial_step"] = bad;
    set_case_json(j);
    expect_rejected({"case.json", "initial_step", bad.dump()});
    j = case_json();
    j["groups"][0]["initial_step"] = bad;
    set_case_json(j);
    expect_rejected({"case.json", "groups[0].initial_step", bad.dump()});
  }
}

TEST_F(ReplayGroups, BadExpectedFingerprint) {
  for (const nlohmann::json& bad : {nlohmann::json("0123456789ABCDEF"), nlohmann::json("0123"), nlohmann::json(12)}) {
    nlohmann::json j = case_json();
    j["expected_fingerprint"] = bad;
    set_case_json(j);
    expect_rejected({"case.json", "expected_fingerprint", bad.dump()});
  }
}

TEST_F(ReplayGroups, StateForAKindWithoutIt) {
  edit_init([](auto& t) { t["v/g1.w"] = {{4, 7}, std::vector<float>(28, 0.0f)}; });
  expect_rejected({"init.safetensors", "v/", "groups[1]", "sgd_nesterov", "keeps no V"});
}

TEST_F(ReplayGroups, StateForPartOfAGroup) {
  edit_init([](auto& t) { t.erase("m/g0.b"); });
  expect_rejected({"init.safetensors", "m/", "1 of the 2", "groups[0]"});
}

TEST_F(ReplayGroups, StateOfWrongShapeOrUnknownParameter) {
  edit_init([](auto& t) { t["m/g0.b"] = {{1, 5}, std::vector<float>(5, 0.0f)}; });
  expect_rejected({"init.safetensors", "'m/g0.b'", "[1, 5]"});
  edit_init([](auto& t) {
    t["m/g0.b"] = {{5}, std::vector<float>(5, 0.0f)};
    t["m/nobody"] = {{1}, std::vector<float>(1, 0.0f)};
  });
  expect_rejected({"init.safetensors", "'m/nobody'"});
}

TEST_F(ReplayGroups, ExpectedStateForAGroupWithoutIt) {
  // expected.safetensors is checked per group: v/ of the sgd_nesterov group is an error.
  std::vector<float> w0(30), b0(5), w1(28), b1(7), v(28);
  write_safetensors(dir_ + "/expected.safetensors",
                    {{"g0.w", StDtype::kF32, {6, 5}, w0.data()}, {"g0.b", StDtype::kF32, {5}, b0.data()},
                     {"g1.w", StDtype::kF32, {4, 7}, w1.data()}, {"g1.z", StDtype::kF32, {0}, b1.data()},
                     {"g1.b", StDtype::kF32, {7}, b1.data()}, {"v/g1.w", StDtype::kF32, {4, 7}, v.data()}});
  expect_rejected({"expected.safetensors", "'v/g1.w'", "sgd_nesterov"});
}

// The case renaissance.torch.Recorder recorded (scripts/record_torch_case.py): its replay on
// this machine has the recorded run's fingerprint, bit for bit.
TEST(RecordedCases, ReplayToTheirRecordedFingerprint) {
  const std::string root = testing_util::testdata_dir() + "/recorded";
  ASSERT_TRUE(fs::is_directory(root)) << root << " is missing from the repository";
  int count = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory()) continue;
    const ReplayCase rc = load_replay_case(e.path().string());
    ASSERT_EQ(rc.expected_fingerprint.size(), 16u) << e.path();
    EXPECT_EQ(run_replay(rc, testing_util::cpu_task_options()).fingerprint, rc.expected_fingerprint) << e.path();
    ++count;
  }
  EXPECT_GE(count, 1);
}

}  // namespace
}  // namespace renaissance
