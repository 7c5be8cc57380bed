// Hyperparameter validation (docs/math.md): every bad value is rejected with
// renaissance::Error(kInvalidArgument) whose message names the parameter and the value, at
// configuration time (the fluent setter) and on every later set (Task::set_lr,
// Task::set_loss_scale, Task::optimizer before and after compile). A rejected set leaves the
// task exactly as it was: same hyperparameters, same state bits, same next step.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/optimizer.h"
#include "renaissance/task.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Bad values per rule. Finite ones are exact in binary so their printed form is unambiguous.
const std::vector<double> kBadNonNegative = {-0.25, -1e-300, kNaN, kInf, -kInf};   // lr, weight_decay
const std::vector<double> kBadUnitInterval = {-0.25, 1.0, 1.5, kNaN, kInf, -kInf};  // momentum, β, β1, β2
const std::vector<double> kBadPositive = {0.0, -0.0, -0.25, kNaN, kInf, -kInf};    // eps, tc, loss scale
const std::vector<double> kBadSteps = {0.0, -1.0, 101.0, 1000.0};                  // Muon's ns_steps
const std::vector<double> kBadMuonMode = {2.0, -1.0, 3.0};                          // Muon's muon_mode

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// How a value may appear in a message: %g (what a person writes) or %.17g (round-trip form).
std::vector<std::string> spellings(double v) {
  if (std::isnan(v)) return {"nan"};
  if (std::isinf(v)) return {v > 0 ? "inf" : "-inf"};
  char g[64], g17[64];
  std::snprintf(g, sizeof(g), "%g", v);
  std::snprintf(g17, sizeof(g17), "%.17g", v);
  return {g, g17};
}

// The message must name the parameter (any of `names`) and contain the value.
::testing::AssertionResult names_param_and_value(const std::string& message, const std::vector<std::string>& names,
                                                 double value) {
  const std::string m = lower(message);
  bool named = false;
  for (const std::string& n : names) named = named || m.find(lower(n)) != std::string::npos;
  if (!named) return ::testing::AssertionFailure() << "message does not name '" << names[0] << "': " << message;
  for (const std::string& s : spellings(value)) {
    if (m.find(lower(s)) != std::string::npos) return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "message does not show the value " << spellings(value)[0] << ": "
                                       << message;
}

// Runs `fn`, expecting Error(kInvalidArgument) naming the parameter and the value.
::testing::AssertionResult rejects(const std::function<void()>& fn, const std::vector<std::string>& names,
                                   double value) {
  try {
    fn();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kInvalidArgument) {
      return ::testing::AssertionFailure() << "wrong error kind for " << e.what();
    }
    return names_param_and_value(e.what(), names, value);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw something other than renaissance::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << names[0] << " = " << spellings(value)[0] << " was accepted";
}

// One hyperparameter of one builder: its names in messages, its bad values, a way to set it on
// a fresh builder and on a raw OptimizerConfig (the path of Task::optimizer and file loaders).
struct Setter {
  std::string builder;
  std::vector<std::string> names;
  const std::vector<double>* bad;
  std::function<void(double)> set_on_builder;
  OptimizerKind kind;  // a kind this parameter belongs to, for the raw-config path
  std::function<void(OptimizerConfig&, double)> set_on_config;
};

std::vector<Setter> setters() {
  using K = OptimizerKind;
  auto lr = [](OptimizerConfig& c, double v) { c.lr = v; };
  auto wd = [](OptimizerConfig& c, double v) { c.weight_decay = v; };
  auto mom = [](OptimizerConfig& c, double v) { c.momentum = v; };
  auto b1 = [](OptimizerConfig& c, double v) { c.beta1 = v; };
  auto b2 = [](OptimizerConfig& c, double v) { c.beta2 = v; };
  auto eps = [](OptimizerConfig& c, double v) { c.eps = v; };
  auto tc = [](OptimizerConfig& c, double v) { c.trust_coefficient = v; };
  return {
      {"SGD", {"lr"}, &kBadNonNegative, [](double v) { SGD().lr(v); }, K::kSgd, lr},
      {"SGD", {"momentum"}, &kBadUnitInterval, [](double v) { SGD().momentum(v); }, K::kSgdMomentum, mom},
      {"SGD", {"weight_decay"}, &kBadNonNegative, [](double v) { SGD().weight_decay(v); }, K::kSgd, wd},
      {"Adam", {"lr"}, &kBadNonNegative, [](double v) { Adam().lr(v); }, K::kAdam, lr},
      {"Adam", {"beta1"}, &kBadUnitInterval, [](double v) { Adam().beta1(v); }, K::kAdam, b1},
      {"Adam", {"beta2"}, &kBadUnitInterval, [](double v) { Adam().beta2(v); }, K::kAdam, b2},
      {"Adam", {"eps"}, &kBadPositive, [](double v) { Adam().eps(v); }, K::kAdam, eps},
      {"Adam", {"weight_decay"}, &kBadNonNegative, [](double v) { Adam().weight_decay(v); }, K::kAdam, wd},
      {"AdamW", {"lr"}, &kBadNonNegative, [](double v) { AdamW().lr(v); }, K::kAdamW, lr},
      {"AdamW", {"beta1"}, &kBadUnitInterval, [](double v) { AdamW().beta1(v); }, K::kAdamW, b1},
      {"AdamW", {"beta2"}, &kBadUnitInterval, [](double v) { AdamW().beta2(v); }, K::kAdamW, b2},
      {"AdamW", {"eps"}, &kBadPositive, [](double v) { AdamW().eps(v); }, K::kAdamW, eps},
      {"AdamW", {"weight_decay"}, &kBadNonNegative, [](double v) { AdamW().weight_decay(v); }, K::kAdamW, wd},
      {"LARS", {"lr"}, &kBadNonNegative, [](double v) { LARS().lr(v); }, K::kLars, lr},
      {"LARS", {"momentum"}, &kBadUnitInterval, [](double v) { LARS().momentum(v); }, K::kLars, mom},
      {"LARS", {"weight_decay"}, &kBadNonNegative, [](double v) { LARS().weight_decay(v); }, K::kLars, wd},
      {"LARS", {"trust_coefficient", "trust coefficient"}, &kBadPositive,
       [](double v) { LARS().trust_coefficient(v); }, K::kLars, tc},
      {"LARS", {"eps"}, &kBadPositive, [](double v) { LARS().eps(v); }, K::kLars, eps},
      {"Muon", {"lr"}, &kBadNonNegative, [](double v) { Muon().lr(v); }, K::kMuon, lr},
      {"Muon", {"momentum"}, &kBadUnitInterval, [](double v) { Muon().momentum(v); }, K::kMuon, mom},
      {"Muon", {"weight_decay"}, &kBadNonNegative, [](double v) { Muon().weight_decay(v); }, K::kMuon, wd},
      {"Muon", {"aux_lr"}, &kBadNonNegative, [](double v) { Muon().aux_lr(v); }, K::kMuon,
       [](OptimizerConfig& c, double v) { c.aux_lr = v; }},
      {"Muon", {"ns_eps"}, &kBadPositive, [](double v) { Muon().ns_eps(v); }, K::kMuon,
       [](OptimizerConfig& c, double v) { c.ns_eps = v; }},
      {"Muon", {"ns_steps"}, &kBadSteps, [](double v) { Muon().ns_steps(static_cast<int>(v)); }, K::kMuon,
       [](OptimizerConfig& c, double v) { c.ns_steps = v; }},
      {"Muon", {"muon_mode"}, &kBadMuonMode, [](double v) { Muon().mode(static_cast<MuonMode>(static_cast<int>(v))); },
       K::kMuon, [](OptimizerConfig& c, double v) { c.muon_mode = v; }},
  };
}

// Whether the builder called `builder` produces configs of `kind` (its setters are that kind's
// hyperparameters).
bool builder_makes(const std::string& builder, OptimizerKind kind) {
  switch (kind_info(kind).family) {
    case KindFamily::kSgd: return builder == "SGD";
    case KindFamily::kAdam: return builder == (kind == OptimizerKind::kAdamW ? "AdamW" : "Adam");
    case KindFamily::kLars: return builder == "LARS";
    case KindFamily::kLion: return builder == "Lion";
    case KindFamily::kLamb: return builder == "LAMB";
    case KindFamily::kMuon: return builder == "Muon";
  }
  return false;
}

const std::vector<std::string> kLossScaleNames = {"loss scale", "loss_scale", "scale"};

TEST(Validation, FluentSettersRejectEveryBadValue) {
  for (const Setter& s : setters()) {
    for (double v : *s.bad) {
      SCOPED_TRACE(s.builder + "()." + s.names[0] + "(" + spellings(v)[0] + ")");
      EXPECT_TRUE(rejects([&] { s.set_on_builder(v); }, s.names, v));
    }
  }
}

TEST(Validation, OptimizerConfigValidateRejectsEveryBadValue) {
  for (const Setter& s : setters()) {
    for (double v : *s.bad) {
      SCOPED_TRACE(std::string(optimizer_kind_name(s.kind)) + " config with " + s.names[0] + " = " +
                   spellings(v)[0]);
      OptimizerConfig c;
      c.kind = s.kind;
      c.momentum = 0.9;
      s.set_on_config(c, v);
      EXPECT_TRUE(rejects([&] { c.validate(); }, s.names, v));
    }
  }
}

// The edges of each rule are legal: lr = 0, wd = 0, β = 0 and just below 1, tiny eps and tc.
TEST(Validation, BoundaryValuesAreAccepted) {
  EXPECT_NO_THROW(SGD().lr(0.0).momentum(0.0).weight_decay(0.0).config());
  EXPECT_NO_THROW(SGD().momentum(0.999999).nesterov(true).config());
  EXPECT_NO_THROW(Adam().lr(0.0).beta1(0.0).beta2(0.0).eps(1e-30).weight_decay(0.0).config());
  EXPECT_NO_THROW(AdamW().beta1(0.999999).beta2(0.999999).config());
  EXPECT_NO_THROW(LARS().lr(0.0).momentum(0.5).trust_coefficient(1e-30).eps(1e-30).weight_decay(0.0).config());
  EXPECT_NO_THROW(check_loss_scale(1e-30));
  EXPECT_NO_THROW(check_loss_scale(65536.0));
  EXPECT_NO_THROW(check_lr(0.0));
}

TEST(Validation, NesterovWithoutMomentumIsRejected) {
  const std::vector<std::string> names = {"momentum"};
  EXPECT_TRUE(rejects([] { SGD().nesterov(true).config(); }, names, 0.0));
  EXPECT_TRUE(rejects([] { SGD().momentum(0.0).nesterov(true).config(); }, names, 0.0));
  EXPECT_TRUE(rejects([] { LARS().momentum(0.0).nesterov(true).config(); }, names, 0.0));
  // The message says why: nesterov needs momentum.
  try {
    SGD().nesterov(true).config();
  } catch (const Error& e) {
    EXPECT_NE(lower(e.what()).find("nesterov"), std::string::npos) << e.what();
  }
  // The raw-config path (Task::optimizer, file loaders) too.
  for (OptimizerKind k : {OptimizerKind::kSgdNesterov, OptimizerKind::kLarsNesterov}) {
    OptimizerConfig c;
    c.kind = k;
    c.momentum = 0.0;
    EXPECT_TRUE(rejects([&] { c.validate(); }, names, 0.0)) << optimizer_kind_name(k);
    Task task({{"w", {4}, Role::kFcWeight}});
    EXPECT_TRUE(rejects([&] { task.optimizer(c); }, names, 0.0)) << optimizer_kind_name(k);
  }
  // A builder that is told about momentum later is fine: the check is on the finished config.
  EXPECT_NO_THROW(SGD().nesterov(true).momentum(0.9).config());
}

TEST(Validation, FreeValidatorsRejectBadLrAndLossScale) {
  for (double v : kBadNonNegative) EXPECT_TRUE(rejects([&] { check_lr(v); }, {"lr"}, v));
  for (double v : kBadPositive) EXPECT_TRUE(rejects([&] { check_loss_scale(v); }, kLossScaleNames, v));
}

// ---- Later sets on a Task: rejected, and the task is left exactly as it was ----

class TaskValidationTest : public ::testing::TestWithParam<BackendKind> {};

std::vector<ParamSpec> small_layout() {
  return {{"b", {5}, Role::kBnBias}, {"w", {4099}, Role::kDeepConv}, {"f", {33}, Role::kFcWeight}};
}

TEST_P(TaskValidationTest, SetLrAndSetLossScaleRejectBeforeCompile) {
  RN_SKIP_IF_UNAVAILABLE(GetParam());
  TaskOptions options;
  options.backend = GetParam();
  Task task(small_layout(), options);
  task.optimizer(AdamW().lr(1e-3));
  for (double v : kBadNonNegative) {
    EXPECT_TRUE(rejects([&] { task.set_lr(v); }, {"lr"}, v));
    EXPECT_EQ(task.lr(), 1e-3);
  }
  for (double v : kBadPositive) {
    EXPECT_TRUE(rejects([&] { task.set_loss_scale(v); }, kLossScaleNames, v));
    EXPECT_EQ(task.loss_scale(), 1.0);
  }
}

// For every kind: two tasks run the same steps; one is hit with every rejected set between the
// steps. Its hyperparameters and state must be untouched and every later step bit-identical.
TEST_P(TaskValidationTest, RejectedSetsLeaveStateAndBehaviourUnchanged) {
  RN_SKIP_IF_UNAVAILABLE(GetParam());
  const std::vector<ParamSpec> params = small_layout();
  for (const testing_util::KindCase& kc : testing_util::all_kind_cases()) {
    SCOPED_TRACE(kc.name);
    auto make = [&] {
      TaskOptions options;
      options.backend = GetParam();
      auto task = std::make_unique<Task>(params, options);
      task->optimizer(kc.config);
      task->compile();
      task->set_lr(kc.config.lr * 0.5);
      task->set_loss_scale(256.0);
      testing_util::set_all_weights(*task, testing_util::make_weights(params, 31));
      return task;
    };
    std::unique_ptr<Task> hit = make();
    std::unique_ptr<Task> clean = make();
    for (uint64_t s = 0; s < 3; ++s) {
      const auto grads = testing_util::make_grads(params, 37, s, 256.0);
      testing_util::set_all_grads(*clean, grads);
      clean->step();
      testing_util::set_all_grads(*hit, grads);
      hit->step();

      const testing_util::TaskState before = testing_util::read_state(*hit);
      const OptimizerConfig config_before = hit->config();
      // Every bad lr and loss scale through the setters.
      for (double v : kBadNonNegative) EXPECT_TRUE(rejects([&] { hit->set_lr(v); }, {"lr"}, v));
      for (double v : kBadPositive) EXPECT_TRUE(rejects([&] { hit->set_loss_scale(v); }, kLossScaleNames, v));
      // Every bad field of this kind through optimizer() after compile.
      for (const Setter& st : setters()) {
        if (!builder_makes(st.builder, kc.config.kind)) continue;
        for (double v : *st.bad) {
          OptimizerConfig c = kc.config;
          st.set_on_config(c, v);
          EXPECT_TRUE(rejects([&] { hit->optimizer(c); }, st.names, v)) << st.names[0];
        }
      }
      // Nothing moved: hyperparameters as set, state bits as before.
      EXPECT_EQ(hit->lr(), kc.config.lr * 0.5);
      EXPECT_EQ(hit->loss_scale(), 256.0);
      EXPECT_EQ(hit->config().lr, config_before.lr);
      EXPECT_EQ(hit->config().weight_decay, config_before.weight_decay);
      EXPECT_EQ(hit->config().momentum, config_before.momentum);
      EXPECT_EQ(hit->config().beta1, config_before.beta1);
      EXPECT_EQ(hit->config().beta2, config_before.beta2);
      EXPECT_EQ(hit->config().eps, config_before.eps);
      EXPECT_EQ(hit->config().trust_coefficient, config_before.trust_coefficient);
      EXPECT_TRUE(testing_util::same_state(testing_util::read_state(*hit), before));
      EXPECT_TRUE(testing_util::same_state(testing_util::read_state(*hit), testing_util::read_state(*clean)))
          << "after step " << s;
      if (HasFailure()) return;
    }
    // One more step after the last batch of rejected sets: still the same bits.
    const auto grads = testing_util::make_grads(params, 37, 3, 256.0);
    testing_util::set_all_grads(*clean, grads);
    clean->step();
    testing_util::set_all_grads(*hit, grads);
    hit->step();
    EXPECT_TRUE(testing_util::same_state(testing_util::read_state(*hit), testing_util::read_state(*clean)));
    EXPECT_EQ(hit->skipped_steps(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TaskValidationTest, ::testing::ValuesIn(testing_util::backends_under_test()),
                         testing_util::backend_param_name);

}  // namespace
}  // namespace renaissance
