// Hyperparameters that a kind does not read, and those the compiled step holds: a configuration
// that sets a hyperparameter its kind ignores (one of Muon's, dampening, amsgrad, or a kind table
// column: momentum, betas, eps, trust_coefficient) to anything but the kind's default is refused,
// naming the kind, it and the kinds that take it;
// Task::optimizer() after compile() refuses a change of amsgrad, Muon's adjust_lr and muon_mode
// by name and leaves the task as it was; a checkpoint made with another adjust_lr is refused; the
// Muon builder refuses an adjust_lr that is not one of its choices.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "renaissance/task.h"
#include "support/checkpoint_test_util.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

std::vector<ParamSpec> params() {
  return {{"w", {12, 8}, Role::kDeepConv}, {"b", {12}, Role::kFcBias}, {"v", {6, 10}, Role::kFcWeight}};
}

std::unique_ptr<Task> start(const OptimizerConfig& config) {
  return testing_util::with_made_weights(checkpoint_test::make_task(params(), config, BackendKind::kCpu, 1), params(),
                                         3);
}
void step(Task& task, int s) { testing_util::step_on_made_grads(task, params(), 7, s); }

// A configuration of `kind` (one that holds no momentum buffer; `name`, written out) given
// momentum 0.9 is refused, the message naming every kind that reads momentum, in table order.
void expect_momentum_refused(OptimizerKind kind, const std::string& name) {
  OptimizerConfig c = default_config(kind);
  c.momentum = 0.9;
  checkpoint_test::expect_error(
      [&] { c.validate(); },
      name + " does not take momentum (0.9 given; the kinds that do: sgd_momentum, sgd_nesterov, lars, lars_nesterov, "
             "muon)",
      ErrorKind::kInvalidArgument);
}

// Every field that no family but Muon's reads, set on an AdamW configuration.
TEST(KindReads, AConfigurationRefusesAHyperparameterItsKindDoesNotRead) {
  struct Case {
    const char* name;
    void (*set)(OptimizerConfig&);
  };
  const Case cases[] = {
      {"aux_lr", [](OptimizerConfig& c) { c.aux_lr = 0.01; }},
      {"aux_weight_decay", [](OptimizerConfig& c) { c.aux_weight_decay = 0.1; }},
      {"nesterov", [](OptimizerConfig& c) { c.nesterov = false; }},
      {"ns_steps", [](OptimizerConfig& c) { c.ns_steps = 3; }},
      {"ns_eps", [](OptimizerConfig& c) { c.ns_eps = 1e-5; }},
      {"adjust_lr", [](OptimizerConfig& c) { c.adjust_lr = 1; }},
      {"ns_a", [](OptimizerConfig& c) { c.ns_a = 3.0; }},
      {"ns_b", [](OptimizerConfig& c) { c.ns_b = -4.0; }},
      {"ns_c", [](OptimizerConfig& c) { c.ns_c = 2.0; }},
      {"muon_mode", [](OptimizerConfig& c) { c.muon_mode = 1; }},
  };
  for (const Case& k : cases) {
    OptimizerConfig c = default_config(OptimizerKind::kAdamW);
    k.set(c);
    checkpoint_test::expect_error([&] { c.validate(); }, std::string("adamw does not take ") + k.name + " (",
                                  ErrorKind::kInvalidArgument);
    // Muon takes every one of them.
    OptimizerConfig m = default_config(OptimizerKind::kMuon);
    k.set(m);
    EXPECT_NO_THROW(m.validate()) << k.name;
  }
  // The SGD family's dampening and the Adam family's amsgrad, by the same rule.
  OptimizerConfig c = default_config(OptimizerKind::kLion);
  c.dampening = 0.5;
  checkpoint_test::expect_error([&] { c.validate(); },
                                "lion does not take dampening (0.5 given; the kinds that do: sgd_momentum, sgd_nesterov)",
                                ErrorKind::kInvalidArgument);
  c = default_config(OptimizerKind::kMuon);
  c.amsgrad = true;
  checkpoint_test::expect_error([&] { c.validate(); }, "muon does not take amsgrad (on given; the kinds that do: adam, adamw)",
                                ErrorKind::kInvalidArgument);
  // The library's own configurations of every kind pass.
  for (int k = 0; k < kNumOptimizerKinds; ++k) {
    EXPECT_NO_THROW(reference_config(static_cast<OptimizerKind>(k)).validate()) << k;
    EXPECT_NO_THROW(bench_config(static_cast<OptimizerKind>(k)).validate()) << k;
  }
}

// SGD without momentum is kind sgd, which holds no momentum buffer: a momentum or dampening set on
// it would be ignored, so a configuration refuses them; the SGD builder, as torch.optim.SGD,
// takes a dampening without momentum and drops it (torch ignores it there).
TEST(KindReads, SgdWithoutMomentumTakesNeitherMomentumNorDampening) {
  expect_momentum_refused(OptimizerKind::kSgd, "sgd");
  OptimizerConfig c = default_config(OptimizerKind::kSgd);
  c.dampening = 0.5;
  checkpoint_test::expect_error([&] { c.validate(); }, "sgd does not take dampening (0.5 given",
                                ErrorKind::kInvalidArgument);
  const OptimizerConfig plain = SGD().lr(0.1).dampening(0.5).config();
  EXPECT_EQ(plain.kind, OptimizerKind::kSgd);
  EXPECT_EQ(plain.dampening, 0.0);
  EXPECT_NO_THROW(plain.validate());
  const OptimizerConfig heavy = SGD().lr(0.1).momentum(0.9).dampening(0.5).config();
  EXPECT_EQ(heavy.kind, OptimizerKind::kSgdMomentum);
  EXPECT_EQ(heavy.dampening, 0.5);
  EXPECT_NO_THROW(heavy.validate());
}

// The kind table's columns by the same rule: momentum on adam, betas on sgd, trust_coefficient on
// muon, ... are refused by validate() and by Task::optimizer() and optimizer_groups(), naming the
// kind, the field and the kinds that read it; the kind's own default stays accepted (every
// configuration holds every field: OptimizerConfig's member defaults and recorded cases).
TEST(KindReads, AConfigurationRefusesAKindTableColumnItsKindDoesNotRead) {
  // Which kinds read each column, written out (docs/math.md): a change of the table shows here.
  struct Column {
    const char* name;
    double OptimizerConfig::*field;
    std::vector<OptimizerKind> readers;
  };
  using K = OptimizerKind;
  const Column columns[] = {
      // sgd holds no momentum buffer: SGD with a momentum is sgd_momentum.
      {"momentum", &OptimizerConfig::momentum, {K::kSgdMomentum, K::kSgdNesterov, K::kLars, K::kLarsNesterov, K::kMuon}},
      {"beta1", &OptimizerConfig::beta1, {K::kAdam, K::kAdamW, K::kLion, K::kLamb, K::kMuon}},
      {"beta2", &OptimizerConfig::beta2, {K::kAdam, K::kAdamW, K::kLion, K::kLamb, K::kMuon}},
      {"eps", &OptimizerConfig::eps, {K::kAdam, K::kAdamW, K::kLars, K::kLarsNesterov, K::kLamb, K::kMuon}},
      {"trust_coefficient", &OptimizerConfig::trust_coefficient, {K::kLars, K::kLarsNesterov}},
  };
  int refused = 0;
  for (const Column& col : columns) {
    for (const KindInfo& k : kKindTable) {
      const bool reads = std::find(col.readers.begin(), col.readers.end(), k.kind) != col.readers.end();
      OptimizerConfig c = default_config(k.kind);
      c.*col.field = 0.5;  // no kind's default of any of these columns
      if (reads) {
        EXPECT_NO_THROW(c.validate()) << k.name << " " << col.name;
        continue;
      }
      ++refused;
      const std::string words = std::string(k.name) + " does not take " + col.name + " (0.5 given; the kinds that do: ";
      checkpoint_test::expect_error([&] { c.validate(); }, words, ErrorKind::kInvalidArgument);
      Task task(params(), testing_util::cpu_task_options());
      checkpoint_test::expect_error([&] { task.optimizer(c); }, words, ErrorKind::kInvalidArgument);
      checkpoint_test::expect_error([&] { task.optimizer_groups({default_config(k.kind), c}); }, words,
                                    ErrorKind::kInvalidArgument);
      // The kind's default, written out, is what an untouched configuration holds.
      c.*col.field = default_config(k.kind).*col.field;
      EXPECT_NO_THROW(c.validate()) << k.name << " " << col.name;
    }
  }
  EXPECT_EQ(refused, 27);  // 5 + 5 + 5 + 4 + 8 kinds that do not read the column
  // The message names every kind that reads it, in table order.
  expect_momentum_refused(OptimizerKind::kAdam, "adam");
  // A configuration built from OptimizerConfig's member defaults (the kind set by hand) passes.
  for (const KindInfo& k : kKindTable) {
    OptimizerConfig c;
    c.kind = k.kind;
    if (k.needs_momentum) c.momentum = 0.9;
    EXPECT_NO_THROW(c.validate()) << k.name;
  }
}

TEST(FixedAfterCompile, TheMuonBuilderRefusesAnAdjustLrThatIsNoChoice) {
  checkpoint_test::expect_error([] { Muon().adjust_lr(static_cast<MuonAdjustLr>(2)); },
                                "invalid adjust_lr = 2: must be one of original|match_rms_adamw (0 to 1)",
                                ErrorKind::kInvalidArgument);
  checkpoint_test::expect_error([] { Muon().adjust_lr(static_cast<MuonAdjustLr>(-1)); }, "invalid adjust_lr = -1",
                                ErrorKind::kInvalidArgument);
  EXPECT_EQ(Muon().adjust_lr(MuonAdjustLr::kMatchRmsAdamW).config().adjust_lr, 1.0);
}

TEST(FixedAfterCompile, OptimizerRefusesAChangedAdjustLrAndLeavesTheTaskAsItWas) {
  const OptimizerConfig original = Muon().lr(0.02).adjust_lr(MuonAdjustLr::kOriginal).config();
  auto task = start(original);
  step(*task, 0);
  const auto before = testing_util::read_state(*task);
  const OptimizerConfig other = Muon().lr(0.03).adjust_lr(MuonAdjustLr::kMatchRmsAdamW).config();
  checkpoint_test::expect_error([&] { task->optimizer(other); }, "cannot change adjust_lr after compile()",
                                ErrorKind::kInvalidArgument);
  EXPECT_EQ(task->config().adjust_lr, 0.0);
  EXPECT_EQ(task->config().lr, 0.02);
  // A change of a scalar (lr) with the same adjust_lr is taken.
  task->optimizer(Muon().lr(0.03).adjust_lr(MuonAdjustLr::kOriginal).config());
  EXPECT_EQ(task->config().lr, 0.03);
  EXPECT_TRUE(testing_util::same_state(testing_util::read_state(*task), before));
}

TEST(FixedAfterCompile, OptimizerRefusesAChangedAmsgrad) {
  for (const bool on : {false, true}) {
    auto task = start(AdamW().lr(1e-3).amsgrad(on).config());
    step(*task, 0);
    checkpoint_test::expect_error([&] { task->optimizer(AdamW().lr(2e-3).amsgrad(!on).config()); },
                                  "cannot change amsgrad after compile()", ErrorKind::kInvalidArgument);
    EXPECT_EQ(task->config().amsgrad, on);
    EXPECT_EQ(task->config().lr, 1e-3);
    step(*task, 1);  // the compiled step still runs
  }
}

TEST(FixedAfterCompile, ACheckpointOfAnotherAdjustLrIsRefused) {
  checkpoint_test::TempDir dir;
  const std::string path = dir.file("match.ckpt");
  auto saved = start(Muon().adjust_lr(MuonAdjustLr::kMatchRmsAdamW).config());
  step(*saved, 0);
  saved->save(path);
  EXPECT_EQ(read_checkpoint_info(path).config.adjust_lr, 1.0);
  auto other = start(Muon().adjust_lr(MuonAdjustLr::kOriginal).config());
  const auto before = testing_util::read_state(*other);
  checkpoint_test::expect_error([&] { other->load(path); },
                                "checkpoint was made with adjust_lr match_rms_adamw, task runs adjust_lr original",
                                ErrorKind::kInvalidArgument);
  EXPECT_EQ(other->config().adjust_lr, 0.0);
  EXPECT_TRUE(testing_util::same_state(testing_util::read_state(*other), before));
  // The same adjust_lr loads.
  auto same = start(Muon().adjust_lr(MuonAdjustLr::kMatchRmsAdamW).config());
  EXPECT_NO_THROW(same->load(path));
}

}  // namespace
}  // namespace renaissance
