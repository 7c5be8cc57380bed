// Tests of replay cases (docs/replay-format.md): the repository's own cases (testdata/replay,
// written by scripts/make_testdata.py from docs/math.md, one or more per kind and weight-decay
// mode) match their float64 reference per tensor (W, and M, V where the kind keeps them) within
// 1e-6, the muon cases' matrices within the case's own tolerance, on every backend, agree bit for
// bit across backends, a NaN step is skipped as if it never happened, a broken Muon fails its
// case's tolerance, and every broken input of the list is rejected at load time (before
// anything runs) with a message naming the file, tensor or key. A missing case is a failure, not
// a skip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/replay.h"
#include "support/replay_test_util.h"
#include "renaissance/safetensors.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

namespace fs = std::filesystem;

const char* const kCases[] = {"sgd_decoupled",          "sgd_l2",          "sgd_nowd",
                              "sgd_momentum_decoupled", "sgd_momentum_l2", "sgd_momentum_nowd",
                              "sgd_nesterov_decoupled", "sgd_nesterov_l2", "sgd_nesterov_nowd",
                              "adam",                   "adamw",           "lars",
                              "lars_nesterov",          "lion",            "lamb",
                              "adamw_clip",             "muon",            "muon_match_rms"};

std::string case_dir(const std::string& name) { return testing_util::testdata_dir() + "/replay/" + name; }

TaskOptions on(BackendKind kind) {
  TaskOptions o;
  o.backend = kind;
  return o;
}

// ---- the shared cases on every backend ----

// The folder holds exactly the cases above, each with its reference, and every kind is covered:
// a case added to testdata/ but not here, or a kind without a case, fails.
TEST(ReplayTestdata, EveryCaseIsListedAndEveryKindCovered) {
  std::set<std::string> listed(std::begin(kCases), std::end(kCases));
  std::set<std::string> on_disk;
  ASSERT_TRUE(fs::is_directory(case_dir(""))) << case_dir("") << " is missing from the repository";
  for (const auto& e : fs::directory_iterator(case_dir(""))) {
    if (e.is_directory()) on_disk.insert(e.path().filename().string());
  }
  EXPECT_EQ(on_disk, listed);
  std::set<OptimizerKind> kinds;
  for (const char* name : kCases) {
    ASSERT_TRUE(fs::exists(case_dir(name) + "/expected.safetensors")) << name;
    kinds.insert(load_replay_case(case_dir(name)).groups.front().config.kind);
  }
  EXPECT_EQ(kinds.size(), static_cast<size_t>(kNumOptimizerKinds));
}

// Whether tensor `name` of the comparison is the weight of a Muon matrix: the only tensors whose
// float64 reference went through a float64 Newton–Schulz, which the exact mode meets within the
// case's tolerance only (docs/math.md, "Muon: the kind"). Everything else is element-wise.
bool muon_matrix_weight(const ReplayCase& rc, const std::string& name) {
  if (rc.groups.front().config.kind != OptimizerKind::kMuon) return false;
  for (const ParamSpec& p : rc.params) {
    if (p.name == name) return group_of(p.role) == Group::kWeight;
  }
  return false;
}

class ReplayCases : public ::testing::TestWithParam<BackendKind> {};

TEST_P(ReplayCases, MatchFloat64ReferenceWithinTolerance) {
  RN_SKIP_IF_UNAVAILABLE(GetParam());
  for (const char* name : kCases) {
    const ReplayCase rc = load_replay_case(case_dir(name));
    ASSERT_TRUE(rc.has_expected) << name;
    const ReplayResult r = run_replay(rc, on(GetParam()));
    // Every case has one step with a non-finite gradient (docs/replay-format.md).
    EXPECT_EQ(r.steps_skipped, 1) << name;
    EXPECT_EQ(r.steps_applied + r.steps_skipped, rc.steps) << name;
    const std::vector<TensorComparison> cmp = compare_replay(rc, r);
    // W always, M and V wherever the kind keeps them: the references hold all three.
    const size_t families = 1 + (r.has_m ? 1 : 0) + (r.has_v ? 1 : 0);
    EXPECT_EQ(cmp.size(), rc.params.size() * families) << name;
    // Only the muon cases carry a tolerance of their own, and only their matrices use it.
    EXPECT_EQ(rc.tolerance > 0.0, rc.groups.front().config.kind == OptimizerKind::kMuon) << name;
    for (const TensorComparison& c : cmp) {
      EXPECT_TRUE(c.finite) << name << " " << c.name;
      EXPECT_LE(c.rel_l2, muon_matrix_weight(rc, c.name) ? rc.tolerance : 1e-6) << name << " " << c.name;
    }
  }
}

// The muon cases' tolerance tells a right Muon from a broken one: the same case run with Nesterov
// flipped, one Newton–Schulz step fewer, or the other lr adjustment puts some matrix above it.
TEST(ReplayMuonCase, ToleranceCatchesABrokenMuon) {
  for (const char* name : {"muon", "muon_match_rms"}) {
    const ReplayCase good = load_replay_case(case_dir(name));
    ASSERT_GT(good.tolerance, 0.0) << name;
    const std::vector<std::function<void(OptimizerConfig&)>> breaks = {
        [](OptimizerConfig& c) { c.nesterov = !c.nesterov; },
        [](OptimizerConfig& c) { c.ns_steps -= 1; },
        [](OptimizerConfig& c) { c.adjust_lr = 1.0 - c.adjust_lr; },
    };
    for (size_t b = 0; b < breaks.size(); ++b) {
      ReplayCase broken = good;
      breaks[b](broken.groups.front().config);
      double worst = 0.0;
      for (const TensorComparison& c : compare_replay(broken, run_replay(broken, on(BackendKind::kCpu)))) {
        worst = std::max(worst, c.rel_l2);
      }
      EXPECT_GT(worst, good.tolerance) << name << ": break " << b << " passes the case";
    }
  }
}

TEST_P(ReplayCases, BitIdenticalToCpu) {
  RN_SKIP_IF_UNAVAILABLE(GetParam());
  for (const char* name : kCases) {
    const ReplayCase rc = load_replay_case(case_dir(name));
    const ReplayResult cpu = run_replay(rc, on(BackendKind::kCpu));
    const ReplayResult other = run_replay(rc, on(GetParam()));
    EXPECT_EQ(cpu.fingerprint, other.fingerprint) << name;
    for (size_t i = 0; i < rc.params.size(); ++i) EXPECT_TRUE(testing_util::same_bits(cpu.w[i], other.w[i])) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ReplayCases, ::testing::ValuesIn(testing_util::backends_under_test()),
                         testing_util::backend_param_name);

// ---- broken inputs: each on a copy of a good case ----

class ReplayBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::make_temp_dir("/tmp/rn-replay-XXXXXX");
    ASSERT_FALSE(dir_.empty());
    for (const auto& e : fs::directory_iterator(case_dir("adamw"))) {
      fs::copy_file(e.path(), dir_ + "/" + e.path().filename().string());
      fs::permissions(dir_ + "/" + e.path().filename().string(), fs::perms::owner_read | fs::perms::owner_write);
    }
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::string file(const std::string& name) const { return dir_ + "/" + name; }
  std::string read(const std::string& name) const {
    std::ifstream in(file(name), std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream out(file(name), std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  nlohmann::json case_json() const { return nlohmann::json::parse(read("case.json")); }
  void set_case_json(const nlohmann::json& j) const { write("case.json", j.dump()); }
  // Rewrites a safetensors header (keeping the data bytes) after `edit` changed it.
  template <typename F>
  void edit_header(const std::string& name, F&& edit) const {
    const std::string b = read(name);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[i]);
    nlohmann::json h = nlohmann::json::parse(b.substr(8, n));
    edit(h);
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(text.size()) >> (8 * i));
    write(name, out + text + b.substr(8 + n));
  }
  // The load must fail with a message containing every word.
  void expect_rejected(const std::vector<std::string>& words) const {
    testing_util::expect_replay_rejected(dir_, words);
  }
  // case.json changed by edit(j) must fail to load with a message containing every word.
  template <typename F>
  void expect_edit_rejected(F&& edit, const std::vector<std::string>& words) const {
    testing_util::expect_case_edit_rejected(dir_, case_json(), edit, words);
  }

  std::string dir_;
};

TEST_F(ReplayBadInput, GoodCopyLoads) { EXPECT_NO_THROW(load_replay_case(dir_)); }

TEST_F(ReplayBadInput, TruncatedFile) {
  const std::string b = read("grads.safetensors");
  write("grads.safetensors", b.substr(0, b.size() / 2));
  expect_rejected({"grads.safetensors", "past the end"});
}

TEST_F(ReplayBadInput, HeaderLengthPastEnd) {
  std::string b = read("init.safetensors");
  b[4] = 1;  // 2^32 + n header bytes
  write("init.safetensors", b);
  expect_rejected({"init.safetensors", "header length"});
}

TEST_F(ReplayBadInput, InvalidJsonHeader) {
  std::string b = read("init.safetensors");
  b.replace(8, 9, "{not json");
  write("init.safetensors", b);
  expect_rejected({"init.safetensors", "JSON"});
}

TEST_F(ReplayBadInput, OffsetsOutsideData) {
  edit_header("init.safetensors", [](nlohmann::json& h) { h["bn1.bias"]["data_offsets"] = {0, 1u << 30}; });
  expect_rejected({"init.safetensors", "'bn1.bias'", "data_offsets"});
}

TEST_F(ReplayBadInput, UnsupportedDtype) {
  edit_header("init.safetensors", [](nlohmann::json& h) { h["bn1.bias"]["dtype"] = "I32"; });
  expect_rejected({"init.safetensors", "'bn1.bias'", "I32"});
}

TEST_F(ReplayBadInput, ShapeMismatchWithCaseJson) {
  // Same byte count, different shape: only the comparison with case.json can catch it.
  edit_header("init.safetensors", [](nlohmann::json& h) { h["conv1.weight"]["shape"] = {216}; });
  expect_rejected({"init.safetensors", "'conv1.weight'", "[216]", "case.json"});
}

TEST_F(ReplayBadInput, MissingGradTensor) {
  edit_header("grads.safetensors", [](nlohmann::json& h) { h.erase("step3/fc.bias"); });
  expect_rejected({"grads.safetensors", "missing", "'step3/fc.bias'"});
}

TEST_F(ReplayBadInput, MissingInitTensor) {
  edit_header("init.safetensors", [](nlohmann::json& h) { h.erase("fc.weight"); });
  expect_rejected({"init.safetensors", "missing", "'fc.weight'"});
}

TEST_F(ReplayBadInput, ExtraTensor) {
  edit_header("init.safetensors", [](nlohmann::json& h) { h["extra"] = {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {0, 0}}}; });
  expect_rejected({"init.safetensors", "'extra'"});
}

TEST_F(ReplayBadInput, EmptyCaseJson) {
  write("case.json", "");
  expect_rejected({"case.json", "empty"});
}

TEST_F(ReplayBadInput, UnknownTopLevelKey) {
  expect_edit_rejected([](nlohmann::json& j) { j["stepz"] = 5; }, {"case.json", "'stepz'"});
}

// case.json's tolerance: a finite number > 0, kept as given; the caller's own one wins.
TEST_F(ReplayBadInput, CaseTolerance) {
  nlohmann::json j = case_json();
  j["tolerance"] = 2.5e-4;
  set_case_json(j);
  const ReplayCase rc = load_replay_case(dir_);
  EXPECT_EQ(rc.tolerance, 2.5e-4);
  EXPECT_EQ(replay_tolerance(rc, -1.0), 2.5e-4);
  EXPECT_EQ(replay_tolerance(rc, 1e-9), 1e-9);
  EXPECT_EQ(replay_tolerance(rc, 0.0), 0.0);
  j.erase("tolerance");
  set_case_json(j);
  EXPECT_EQ(load_replay_case(dir_).tolerance, 0.0);
  EXPECT_EQ(replay_tolerance(load_replay_case(dir_), -1.0), kReplayDefaultTolerance);
  EXPECT_EQ(kReplayDefaultTolerance, 1e-6);
}

TEST_F(ReplayBadInput, InvalidCaseTolerance) {
  for (const nlohmann::json& bad : {nlohmann::json(0.0), nlohmann::json(-1e-3), nlohmann::json("1e-3"),
                                    nlohmann::json(true), nlohmann::json(nullptr), nlohmann::json::array({1e-3})}) {
    expect_edit_rejected([&](nlohmann::json& j) { j["tolerance"] = bad; },
                         {"case.json", "tolerance must be a finite number > 0", bad.dump()});
  }
}

// Format 2 takes the same key, with the same check.
TEST(ReplayCaseTolerance, Format2) {
  std::ifstream in(std::string(RENAISSANCE_SOURCE_DIR) + "/fuzz/corpus/fuzz_replay_case/no_grad_format2.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json j = nlohmann::json::parse(text);
  ASSERT_EQ(j["format"], "renaissance-replay/2");
  EXPECT_EQ(parse_replay_case_json(j.dump(), "f2").tolerance, 0.0);
  j["tolerance"] = 1e-4;
  EXPECT_EQ(parse_replay_case_json(j.dump(), "f2").tolerance, 1e-4);
  j["tolerance"] = -1e-4;
  try {
    parse_replay_case_json(j.dump(), "f2");
    ADD_FAILURE() << "a negative tolerance loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("f2/case.json: tolerance must be a finite number > 0, got -0.0001"), std::string::npos)
        << e.what();
  }
}

TEST_F(ReplayBadInput, UnknownOptimizerKey) {
  expect_edit_rejected([](nlohmann::json& j) { j["optimizer"]["betas"] = {0.9, 0.99}; }, {"case.json", "'betas'"});
}

TEST_F(ReplayBadInput, UnknownOptimizerKind) {
  expect_edit_rejected([](nlohmann::json& j) { j["optimizer"]["kind"] = "adamax"; }, {"case.json", "kind", "'adamax'"});
}

TEST_F(ReplayBadInput, UnknownRole) {
  expect_edit_rejected([](nlohmann::json& j) { j["params"][2]["role"] = "conv_weird"; },
                       {"case.json", "'bn1.bias'", "role", "'conv_weird'"});
}

TEST_F(ReplayBadInput, NegativeLr) {
  expect_edit_rejected([](nlohmann::json& j) { j["optimizer"]["lr"] = -0.1; }, {"case.json", "lr", "-0.1"});
}

TEST_F(ReplayBadInput, BetaOneIsRejected) {
  expect_edit_rejected([](nlohmann::json& j) { j["optimizer"]["beta1"] = 1.0; }, {"case.json", "beta1", "1"});
}

TEST_F(ReplayBadInput, NegativeLrInSchedule) {
  expect_edit_rejected([](nlohmann::json& j) { j["lr_per_step"] = {0.001, 0.001, -1.0, 0.001, 0.001, 0.001}; },
                       {"case.json", "lr_per_step[2]"});
}

TEST_F(ReplayBadInput, LrPerStepWrongLength) {
  expect_edit_rejected([](nlohmann::json& j) { j["lr_per_step"] = {0.1}; },
                       {"case.json", "lr_per_step", "1 entries", "steps is 6"});
}

TEST_F(ReplayBadInput, LossScalePerStepWrongLength) {
  expect_edit_rejected([](nlohmann::json& j) { j["loss_scale_per_step"] = {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}; },
                       {"case.json", "loss_scale_per_step", "7 entries"});
}

TEST_F(ReplayBadInput, NonPositiveLossScale) {
  for (double s : {0.0, -2.0}) {
    nlohmann::json j = case_json();
    j["loss_scale_per_step"] = {1.0, 1.0, s, 1.0, 1.0, 1.0};
    set_case_json(j);
    expect_rejected({"case.json", "loss_scale_per_step[2]", "loss scale"});
  }
}

TEST_F(ReplayBadInput, MoreStepsThanGradients) {
  expect_edit_rejected(
      [](nlohmann::json& j) {
        j["steps"] = 7;
        j.erase("lr_per_step");
        j.erase("loss_scale_per_step");
      },
      {"grads.safetensors", "missing", "step6/"});
}

TEST_F(ReplayBadInput, WrongFormatTag) {
  expect_edit_rejected([](nlohmann::json& j) { j["format"] = "renaissance-replay/9"; },
                       {"case.json", "format", "renaissance-replay/9"});
}

TEST_F(ReplayBadInput, MissingCaseDirectory) {
  try {
    load_replay_case(dir_ + "/nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(ErrorKind::kIo));
    EXPECT_NE(std::string(e.what()).find("case.json"), std::string::npos);
  }
}

// A step whose gradients hold a NaN is skipped as a whole: the result equals the same case with
// that step (and its learning rate) removed, bit for bit.
TEST_F(ReplayBadInput, NanStepIsSkippedAsIfItNeverHappened) {
  const ReplayCase rc = load_replay_case(dir_);
  const ReplayResult base = run_replay(rc, on(BackendKind::kCpu));  // before the files change
  const SafetensorsReader grads(file("grads.safetensors"));
  std::vector<std::vector<float>> keep;  // owns the data the views point to
  std::vector<StTensorView> with_nan, without;
  keep.reserve(static_cast<size_t>(rc.steps) * rc.params.size() * 2);
  for (int64_t t = 0; t < rc.steps; ++t) {
    for (const ParamSpec& p : rc.params) {
      keep.push_back(grads.read_f32(ReplayCase::grad_name(t, p.name)));
      if (t == 2 && p.name == "layer1.conv.weight") keep.back()[5] = std::numeric_limits<float>::quiet_NaN();
      with_nan.push_back({ReplayCase::grad_name(t, p.name), StDtype::kF32, p.shape, keep.back().data()});
      if (t != 2) without.push_back({ReplayCase::grad_name(t < 2 ? t : t - 1, p.name), StDtype::kF32, p.shape, keep.back().data()});
    }
  }
  // Step 2 gets its own learning rate and scale, so that applying it by mistake shows.
  nlohmann::json j = case_json();
  nlohmann::json lrs = nlohmann::json::array(), scales = nlohmann::json::array();
  nlohmann::json lrs_without = nlohmann::json::array(), scales_without = nlohmann::json::array();
  for (int64_t t = 0; t < rc.steps; ++t) {
    lrs.push_back(t == 2 ? 0.0042 : 0.001 - 0.0001 * static_cast<double>(t));
    scales.push_back(t == 2 ? 8.0 : 4.0);
    if (t != 2) {
      lrs_without.push_back(lrs.back());
      scales_without.push_back(scales.back());
    }
  }
  j["lr_per_step"] = lrs;
  j["loss_scale_per_step"] = scales;
  set_case_json(j);
  write_safetensors(file("grads.safetensors"), with_nan);
  const ReplayResult skipped = run_replay(load_replay_case(dir_), on(BackendKind::kCpu));
  EXPECT_EQ(skipped.steps_applied, base.steps_applied - 1);
  EXPECT_EQ(skipped.steps_skipped, base.steps_skipped + 1);

  j["steps"] = rc.steps - 1;
  j["lr_per_step"] = lrs_without;
  j["loss_scale_per_step"] = scales_without;
  set_case_json(j);
  write_safetensors(file("grads.safetensors"), without);
  const ReplayResult clean = run_replay(load_replay_case(dir_), on(BackendKind::kCpu));
  EXPECT_EQ(clean.steps_applied, skipped.steps_applied);
  EXPECT_EQ(clean.steps_skipped, base.steps_skipped);
  EXPECT_EQ(clean.fingerprint, skipped.fingerprint);
  for (size_t i = 0; i < rc.params.size(); ++i) EXPECT_TRUE(testing_util::same_bits(clean.w[i], skipped.w[i]));
}

// --out: weights plus m/ and v/ by name, F32, readable back; comparison is symmetric with it.
TEST_F(ReplayBadInput, WriteResultRoundTrips) {
  const ReplayCase rc = load_replay_case(dir_);
  const ReplayResult r = run_replay(rc, on(BackendKind::kCpu));
  write_replay_result(file("out.safetensors"), rc, r);
  const SafetensorsReader out(file("out.safetensors"));
  EXPECT_EQ(out.tensors().size(), rc.params.size() * 3);  // adamw: W, m, v
  for (size_t i = 0; i < rc.params.size(); ++i) {
    EXPECT_TRUE(testing_util::same_bits(out.read_f32(rc.params[i].name), r.w[i]));
    EXPECT_TRUE(testing_util::same_bits(out.read_f32("m/" + rc.params[i].name), r.m[i]));
    EXPECT_TRUE(testing_util::same_bits(out.read_f32("v/" + rc.params[i].name), r.v[i]));
  }
  EXPECT_EQ(out.metadata().at("fingerprint"), r.fingerprint);
}

}  // namespace
}  // namespace renaissance
