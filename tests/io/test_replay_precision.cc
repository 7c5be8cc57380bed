// Replay cases with a bf16/fp16 model copy (docs/replay-format.md, format 2's keys
// precision, rounding, seed): gradients stored in the model dtype are widened exactly, the copy is
// compared bit for bit with expected.safetensors' c/NAME, --out writes the masters as F32 and the
// copy in its dtype, and the wrong dtypes and keys are refused naming the file and the tensor or
// key. The expected masters come from a Task driven through the API; the expected copy is
// computed here from math/precision.h's scalar definition (key: seed, the applied step, the
// parameter's index in its group, the element index).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "renaissance/math/precision.h"
#include "renaissance/replay.h"
#include "renaissance/safetensors.h"
#include "renaissance/task.h"
#include "support/replay_test_util.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

namespace fs = std::filesystem;
using testing_util::expect_replay_rejected;

constexpr uint64_t kSeed = 0xfeedf00d12345ull;
constexpr int64_t kSteps = 3;

const std::vector<ParamSpec>& params() {
  static const std::vector<ParamSpec> p = {{"a", {7, 9}, Role::kDeepConv}, {"b", {5}, Role::kBnBias}};
  return p;
}

// Gradient element i of parameter id at step t: q / 64 with |q| <= 30, exact in bf16 and fp16.
float grad_value(int64_t t, size_t id, size_t i) {
  const uint32_t k = static_cast<uint32_t>(t * 131 + static_cast<int64_t>(id) * 17 + static_cast<int64_t>(i) * 7);
  return static_cast<float>(static_cast<int32_t>(k % 61) - 30) / 64.0f;
}

// Its encoding, from the formats' definitions: bf16 is the upper half of the float32 (exact: at
// most 5 significant bits); fp16 of |q| * 2^-6 with 2^e <= |q| < 2^(e+1): exponent e - 6 + 15,
// fraction (|q| - 2^e) << (10 - e).
uint16_t grad_bits(Precision p, float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (p == Precision::kBf16) return static_cast<uint16_t>(u >> 16);
  const uint16_t sign = x < 0 ? 0x8000u : 0u;
  const uint32_t q = static_cast<uint32_t>(std::fabs(x) * 64.0f);
  if (q == 0) return sign;
  uint32_t e = 0;
  while ((q >> (e + 1)) != 0) ++e;
  return static_cast<uint16_t>(sign | ((e + 9u) << 10) | ((q - (1u << e)) << (10u - e)));
}

StDtype dtype_of(Precision p) { return p == Precision::kBf16 ? StDtype::kBF16 : StDtype::kF16; }

struct Expected {
  std::vector<std::vector<float>> w;
  std::vector<std::vector<uint16_t>> c;
  std::string fingerprint;
};

// The run through the Task API: the masters and the fingerprint; the copy from the definition.
Expected direct_run(const PrecisionOptions& prec, const OptimizerConfig& config) {
  TaskOptions o;
  o.backend = BackendKind::kCpu;
  o.precision = prec;
  Task task(params(), o);
  task.optimizer(config);
  task.compile();
  for (size_t id = 0; id < params().size(); ++id) {
    std::vector<float> w(static_cast<size_t>(params()[id].numel()));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(static_cast<int>(i % 13) - 6);
    task.set_weight(id, w.data());
  }
  for (int64_t t = 0; t < kSteps; ++t) {
    for (size_t id = 0; id < params().size(); ++id) {
      std::vector<float> g(static_cast<size_t>(params()[id].numel()));
      for (size_t i = 0; i < g.size(); ++i) g[i] = grad_value(t, id, i);
      task.set_grad(id, g.data());
    }
    task.step();
  }
  Expected e;
  e.fingerprint = task.fingerprint();
  for (size_t id = 0; id < params().size(); ++id) {
    std::vector<float> w(static_cast<size_t>(params()[id].numel()));
    task.get_weight(id, w.data());
    std::vector<uint16_t> c(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      const bool bf16 = prec.precision == Precision::kBf16;
      if (prec.rounding == Rounding::kNearest) {
        c[i] = bf16 ? math::f32_to_bf16_rne(w[i]) : math::f32_to_f16_rne(w[i]);
      } else {
        const uint32_t r = math::sr_random_word(prec.seed, kSteps, static_cast<uint32_t>(id), i);
        c[i] = bf16 ? math::f32_to_bf16_sr(w[i], r) : math::f32_to_f16_sr(w[i], r);
      }
    }
    e.w.push_back(w);
    e.c.push_back(c);
  }
  return e;
}

class ReplayPrecision : public ::testing::TestWithParam<PrecisionOptions> {
 protected:
  void SetUp() override {
    dir_ = testing_util::make_temp_dir("/tmp/rn_replay_precision_XXXXXX");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes the case: gradients of "a" in the model dtype, of "b" as F32; expected masters (F32)
  // and the copy (c/NAME in the model dtype).
  void write_case(const PrecisionOptions& prec) {
    config_ = default_config(OptimizerKind::kAdamW);
    config_.lr = 0.05;
    expected_ = direct_run(prec, config_);
    std::vector<std::vector<float>> init(params().size()), f32(params().size() * kSteps);
    std::vector<std::vector<uint16_t>> half(params().size() * kSteps);
    std::vector<StTensorView> init_views, grad_views, expected_views;
    nlohmann::json plist = nlohmann::json::array();
    for (size_t id = 0; id < params().size(); ++id) {
      const ParamSpec& p = params()[id];
      init[id].resize(static_cast<size_t>(p.numel()));
      for (size_t i = 0; i < init[id].size(); ++i) init[id][i] = 0.01f * static_cast<float>(static_cast<int>(i % 13) - 6);
      init_views.push_back({p.name, StDtype::kF32, p.shape, init[id].data()});
      plist.push_back({{"name", p.name}, {"shape", p.shape}, {"role", id == 0 ? "deep_conv" : "bn_bias"}});
      for (int64_t t = 0; t < kSteps; ++t) {
        const size_t k = static_cast<size_t>(t) * params().size() + id;
        for (size_t i = 0; i < init[id].size(); ++i) {
          f32[k].push_back(grad_value(t, id, i));
          half[k].push_back(grad_bits(prec.precision == Precision::kFp32 ? Precision::kBf16 : prec.precision,
                                      grad_value(t, id, i)));
        }
        const std::string name = ReplayCase::grad_name(t, p.name);
        if (id == 0 && prec.precision != Precision::kFp32) grad_views.push_back({name, dtype_of(prec.precision), p.shape, half[k].data()});
        else grad_views.push_back({name, StDtype::kF32, p.shape, f32[k].data()});
      }
      expected_views.push_back({p.name, StDtype::kF32, p.shape, expected_.w[id].data()});
      if (prec.precision != Precision::kFp32) {
        expected_views.push_back({"c/" + p.name, dtype_of(prec.precision), p.shape, expected_.c[id].data()});
      }
    }
    write_safetensors(dir_ + "/init.safetensors", init_views);
    write_safetensors(dir_ + "/grads.safetensors", grad_views);
    write_safetensors(dir_ + "/expected.safetensors", expected_views);
    case_ = {{"format", kReplayFormat2},
             {"steps", kSteps},
             {"precision", precision_name(prec.precision)},
             {"rounding", rounding_name(prec.rounding)},
             {"seed", prec.seed},
             {"groups", {{{"optimizer", {{"kind", "adamw"}, {"lr", config_.lr}}}, {"params", plist}}}}};
    if (prec.precision == Precision::kFp32) {  // a plain format-2 case
      case_.erase("precision");
      case_.erase("rounding");
      case_.erase("seed");
    }
    set_case(case_);
  }
  void set_case(const nlohmann::json& j) const { std::ofstream(dir_ + "/case.json", std::ios::trunc) << j.dump(); }

  std::string dir_;
  OptimizerConfig config_;
  Expected expected_;
  nlohmann::json case_;
};

TEST_P(ReplayPrecision, ModelDtypeGradientsAndTheCopyReplayBitForBit) {
  const PrecisionOptions prec = GetParam();
  write_case(prec);
  const ReplayCase rc = load_replay_case(dir_);
  EXPECT_EQ(rc.precision.precision, prec.precision);
  EXPECT_EQ(rc.precision.rounding, prec.rounding);
  EXPECT_EQ(rc.precision.seed, prec.seed);
  TaskOptions o;
  o.backend = BackendKind::kCpu;
  const ReplayResult r = run_replay(rc, o);
  EXPECT_EQ(r.fingerprint, expected_.fingerprint);
  ASSERT_EQ(r.c.size(), params().size());
  for (size_t id = 0; id < params().size(); ++id) {
    EXPECT_EQ(r.w[id], expected_.w[id]) << params()[id].name;
    EXPECT_EQ(r.c[id], expected_.c[id]) << params()[id].name;
  }
  const std::vector<TensorComparison> cmp = compare_replay(rc, r);
  int copies = 0;
  for (const TensorComparison& c : cmp) {
    EXPECT_EQ(c.rel_l2, 0.0) << c.name;
    if (c.bitwise) {
      ++copies;
      EXPECT_EQ(c.name.substr(0, 2), "c/");
      EXPECT_EQ(c.mismatched, 0) << c.name;
    }
  }
  EXPECT_EQ(copies, 2);

  // --out: the masters as F32, the copy in its dtype, with the result's bits.
  write_replay_result(dir_ + "/out.safetensors", rc, r);
  const SafetensorsReader out(dir_ + "/out.safetensors");
  for (size_t id = 0; id < params().size(); ++id) {
    const std::string name = params()[id].name;
    EXPECT_EQ(out.info(name).dtype, StDtype::kF32);
    EXPECT_EQ(out.read_f32(name), expected_.w[id]);
    EXPECT_EQ(out.info("c/" + name).dtype, dtype_of(prec.precision));
    EXPECT_EQ(out.read_encodings("c/" + name, prec.precision), expected_.c[id]);
  }

  // One flipped bit of the expected copy fails the comparison, whatever the tolerance.
  std::vector<StTensorView> views;
  std::vector<uint16_t> flipped = expected_.c[0];
  flipped[5] ^= 1u;
  for (size_t id = 0; id < params().size(); ++id) {
    views.push_back({params()[id].name, StDtype::kF32, params()[id].shape, expected_.w[id].data()});
    views.push_back({"c/" + params()[id].name, dtype_of(prec.precision), params()[id].shape,
                     id == 0 ? flipped.data() : expected_.c[id].data()});
  }
  write_safetensors(dir_ + "/expected.safetensors", views);
  const ReplayCase bad = load_replay_case(dir_);
  bool caught = false;
  for (const TensorComparison& c : compare_replay(bad, run_replay(bad, o))) {
    if (c.name == "c/a") {
      caught = true;
      EXPECT_EQ(c.mismatched, 1);
      EXPECT_FALSE(c.rel_l2 <= 1e30);
    }
  }
  EXPECT_TRUE(caught);
}

INSTANTIATE_TEST_SUITE_P(Cells, ReplayPrecision,
                         ::testing::Values(PrecisionOptions{Precision::kBf16, Rounding::kStochastic, kSeed},
                                           PrecisionOptions{Precision::kFp16, Rounding::kNearest, 0},
                                           PrecisionOptions{Precision::kFp16, Rounding::kStochastic, 3}),
                         [](const ::testing::TestParamInfo<PrecisionOptions>& info) {
                           return std::string(precision_name(info.param.precision)) + "_" + rounding_name(info.param.rounding);
                         });

class ReplayPrecisionRefusals : public ReplayPrecision {};

TEST_F(ReplayPrecisionRefusals, WrongDtypesAndKeysAreRefused) {
  write_case({Precision::kBf16, Rounding::kStochastic, kSeed});
  nlohmann::json j = case_;
  j["precision"] = "fp16";  // the gradients of "a" are BF16, the expected copy too
  set_case(j);
  expect_replay_rejected(dir_, {"grads.safetensors", "'step0/a'", "BF16", "F32 or F16", "fp16"});
  j = case_;
  j.erase("precision");
  j.erase("rounding");
  set_case(j);
  expect_replay_rejected(dir_, {"grads.safetensors", "'step0/a'", "BF16", "precision bf16 / fp16"});
  j = case_;
  j["precision"] = "fp8";
  set_case(j);
  expect_replay_rejected(dir_, {"case.json", "precision", "\"fp8\""});
  j = case_;
  j["rounding"] = "up";
  set_case(j);
  expect_replay_rejected(dir_, {"case.json", "rounding", "\"up\""});
  j = case_;
  j["seed"] = -1;
  set_case(j);
  expect_replay_rejected(dir_, {"case.json", "seed", "-1"});
  j = case_;
  j["format"] = kReplayFormat;
  j["optimizer"] = j["groups"][0]["optimizer"];
  j["params"] = j["groups"][0]["params"];
  j.erase("groups");
  set_case(j);
  expect_replay_rejected(dir_, {"case.json", "'precision'", "renaissance-replay/2"});

  // Gradients as F32 only, then an expected copy of the wrong dtype.
  write_case({Precision::kFp32, Rounding::kNearest, 0});
  j = case_;
  j["precision"] = "bf16";
  j["rounding"] = "nearest";
  set_case(j);
  std::vector<float> w(63, 0.0f), wb(5, 0.0f);
  std::vector<uint16_t> c(63, 0);
  const StTensorView b{"b", StDtype::kF32, {5}, wb.data()};
  write_safetensors(dir_ + "/expected.safetensors", {{"a", StDtype::kF32, {7, 9}, w.data()},
                                                     {"c/a", StDtype::kF16, {7, 9}, c.data()}, b});
  expect_replay_rejected(dir_, {"expected.safetensors", "'c/a'", "F16", "bf16", "BF16"});
  write_safetensors(dir_ + "/expected.safetensors", {{"a", StDtype::kF32, {7, 9}, w.data()},
                                                     {"c/a", StDtype::kBF16, {9, 7}, c.data()}, b});
  expect_replay_rejected(dir_, {"expected.safetensors", "'c/a'", "[9, 7]"});
  // A copy in an fp32 case (nothing to compare it with).
  set_case(case_);
  write_safetensors(dir_ + "/expected.safetensors", {{"a", StDtype::kF32, {7, 9}, w.data()},
                                                     {"c/a", StDtype::kBF16, {7, 9}, c.data()}, b});
  expect_replay_rejected(dir_, {"expected.safetensors", "'c/a'", "precision bf16 / fp16"});
}

// The fuzzer's seed for the precision keys parses as the case it describes (seed 2^64 - 1).
TEST(ReplayPrecisionKeys, FuzzSeedParses) {
  std::ifstream in(std::string(RENAISSANCE_SOURCE_DIR) + "/fuzz/corpus/fuzz_replay_case/bf16_stochastic_format2.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_FALSE(text.empty());
  const ReplayCase rc = parse_replay_case_json(text, "seed");
  EXPECT_EQ(rc.precision.precision, Precision::kBf16);
  EXPECT_EQ(rc.precision.rounding, Rounding::kStochastic);
  EXPECT_EQ(rc.precision.seed, 18446744073709551615ull);
  EXPECT_EQ(rc.groups.size(), 2u);
}

}  // namespace
}  // namespace renaissance
