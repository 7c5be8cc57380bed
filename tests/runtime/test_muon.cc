// Muon (docs/math.md, "Muon: the kind") on the CPU backend: its regions and matrix table are
// planned for muon only and after every other region; two steps of the whole pipeline (momentum,
// exact Newton–Schulz, adjusted lr, decay, the auxiliary AdamW's own lr) equal, bit for bit, the
// formulas written out here in float with math::newton_schulz_reference, in both lerp branches and
// with Nesterov on and off.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "renaissance/math/newton_schulz.h"
#include "renaissance/task.h"
#include "support/checkpoint_test_util.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

// A wide conv weight, a tall matrix, a 1-D and a scalar weight, an empty weight, bias-like ones.
std::vector<ParamSpec> muon_params() {
  return {{"conv", {6, 2, 2, 2}, Role::kFirstConv}, {"bn.b", {6}, Role::kBnBias},
          {"tall", {20, 3}, Role::kFcWeight},       {"vec", {5}, Role::kDeepConv},
          {"scalar", {}, Role::kDeepConv},          {"empty", {0, 4}, Role::kDeepConv},
          {"fc.b", {3}, Role::kFcBias}};
}

TEST(Muon, RegionsAndMatrixTableArePlannedForMuonOnlyAfterEveryOtherRegion) {
  const std::vector<ParamSpec> params = muon_params();
  for (const KindInfo& info : kKindTable) {
    const MemoryPlan plan(params, plan_config_from_optimizer(info.kind));
    const bool muon = info.kind == OptimizerKind::kMuon;
    for (Region r : {T_MUON_UPDATE, T_MUON_MATRICES, T_MUON_SCRATCH}) {
      EXPECT_EQ(plan.region(r).allocated, muon) << info.name << " " << region_name(r);
    }
    if (!muon) continue;
    for (int r = 0; r < T_MUON_UPDATE; ++r) {
      if (plan.region(static_cast<Region>(r)).allocated) {
        EXPECT_LT(plan.region(static_cast<Region>(r)).offset, plan.region(T_MUON_UPDATE).offset) << region_name(static_cast<Region>(r));
      }
    }
    EXPECT_EQ(plan.region(T_MUON_UPDATE).count, plan.group_span(Family::kW, Group::kWeight).count);
  }
  // (rows, cols) and the factor of each weight-group tensor in index_in_group order (fc_weight
  // before first_conv before deep_conv): original sqrt(max(1, A/B)), match 0.2 sqrt(max(A, B)).
  struct Want {
    int64_t rows, cols;
    double original, match;
  };
  const Want want[] = {{20, 3, std::sqrt(20.0 / 3.0), 0.2 * std::sqrt(20.0)},
                       {6, 8, 1.0, 0.2 * std::sqrt(8.0)},
                       {1, 5, 1.0, 0.2 * std::sqrt(5.0)},
                       {1, 1, 1.0, 0.2},
                       {0, 4, 1.0, 0.4}};
  for (int adjust : {0, 1}) {
    PlanConfig config = plan_config_from_optimizer(OptimizerKind::kMuon);
    config.muon_adjust_lr = adjust;
    const MemoryPlan plan(params, config);
    ASSERT_EQ(plan.muon_matrices().size(), 5u);
    for (size_t t = 0; t < 5; ++t) {
      const MuonMatrix& m = plan.muon_matrices()[t];
      EXPECT_EQ(m.rows, want[t].rows) << t;
      EXPECT_EQ(m.cols, want[t].cols) << t;
      EXPECT_EQ(m.adjust, adjust == 0 ? want[t].original : want[t].match) << t;
    }
    // The scratch of the largest need, 3rc + 3r² with r = min, c = max: 6 x 8 (252), not 20 x 3 (207).
    EXPECT_EQ(plan.muon_scratch_floats(), 3u * 6 * 8 + 3u * 6 * 6);
  }
}

// torch.lerp's formula for a scalar weight, one float operation at a time.
float lerp(float a, float b, float w) { return (w < 0.5f && w > -0.5f) ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

// `aux_wd`: the auxiliary AdamW's decoupled weight decay; `mark`: the tall fc_weight is marked
// ParamOptimizer::kAdamW, so the auxiliary AdamW steps it instead of Muon; `threads` > 0: the CPU
// backend's thread count.
void expect_steps_are_the_formulas(double momentum, bool nesterov, int adjust, double aux_wd = 0.0, bool mark = false,
                                   std::vector<ParamSpec> params = muon_params(), int threads = 0) {
  if (mark) params[2].optimizer = ParamOptimizer::kAdamW;
  OptimizerConfig config = Muon().lr(0.02).weight_decay(0.05).momentum(momentum).nesterov(nesterov)
                               .adjust_lr(static_cast<MuonAdjustLr>(adjust)).aux_lr(0.003).aux_weight_decay(aux_wd)
                               .ns_steps(4).config();
  TaskOptions options = testing_util::cpu_task_options();
  if (threads > 0) options.backend_options.threads = threads;
  Task task(params, options);
  task.optimizer(config);
  task.compile();
  std::vector<std::vector<float>> w = testing_util::make_weights(params, 5), m(params.size());
  testing_util::set_all_weights(task, w);
  for (size_t i = 0; i < params.size(); ++i) m[i].assign(w[i].size(), 0.0f);
  std::vector<std::vector<float>> v = m;
  const float lr = 0.02f, w1 = static_cast<float>(1.0 - momentum), mu = static_cast<float>(momentum);
  const float decay = static_cast<float>(1.0 - 0.02 * 0.05), aux_lr = 0.003f;
  const float aux_decay = static_cast<float>(1.0 - 0.003 * aux_wd);  // in double, rounded once
  math::NewtonSchulzCoefficients coeff;  // the defaults, as the configuration's
  for (int s = 0; s < 2; ++s) {
    const std::vector<std::vector<float>> g = testing_util::make_grads(params, 11, static_cast<uint64_t>(s), 1.0);
    testing_util::set_all_grads(task, g);
    task.step();
    for (size_t i = 0; i < params.size(); ++i) {
      const size_t n = w[i].size();
      if (group_of(params[i].role) == Group::kBiasLike || params[i].optimizer == ParamOptimizer::kAdamW) {
        // The auxiliary AdamW (docs/math.md's adamw rule) with aux_lr and aux_weight_decay.
        const float b1 = 0.9f, b2 = 0.95f, omb1 = static_cast<float>(1.0 - 0.9), omb2 = static_cast<float>(1.0 - 0.95);
        const float bc1 = static_cast<float>(1.0 / (1.0 - std::pow(0.9, s + 1)));
        const float bc2 = static_cast<float>(1.0 / (1.0 - std::pow(0.95, s + 1)));
        for (size_t k = 0; k < n; ++k) {
          w[i][k] = w[i][k] * aux_decay;
          m[i][k] = b1 * m[i][k] + omb1 * g[i][k];
          v[i][k] = b2 * v[i][k] + omb2 * (g[i][k] * g[i][k]);
          w[i][k] = w[i][k] - (aux_lr * (m[i][k] * bc1)) / (std::sqrt(v[i][k] * bc2) + 1e-10f);
        }
        continue;
      }
      std::vector<float> u(n);
      for (size_t k = 0; k < n; ++k) {
        m[i][k] = lerp(m[i][k], g[i][k], w1);
        u[k] = nesterov ? lerp(g[i][k], m[i][k], mu) : m[i][k];
      }
      const int64_t rows = params[i].shape.size() < 2 ? 1 : params[i].shape[0];
      int64_t cols = 1;
      for (size_t d = params[i].shape.size() < 2 ? 0 : 1; d < params[i].shape.size(); ++d) cols *= params[i].shape[d];
      if (n > 0) {
        ASSERT_TRUE(math::newton_schulz_reference(u.data(), static_cast<size_t>(rows), static_cast<size_t>(cols), u.data(),
                                                  coeff, 4, 1e-7f));
      }
      const double a = static_cast<double>(rows), b = static_cast<double>(cols);
      const double factor = adjust == 0 ? (b > 0 ? std::sqrt(std::max(1.0, a / b)) : 1.0) : 0.2 * std::sqrt(std::max(a, b));
      const float lr_adj = static_cast<float>(static_cast<double>(lr) * factor);
      for (size_t k = 0; k < n; ++k) w[i][k] = w[i][k] * decay - lr_adj * u[k];
      float n_got = 0.0f;
      task.read(Family::kN, i, &n_got);
      EXPECT_EQ(testing_util::float_bits(n_got), testing_util::float_bits(lr_adj)) << params[i].name << " step " << s;
    }
    const testing_util::TaskState got = testing_util::read_state(task);
    for (size_t i = 0; i < params.size(); ++i) {
      for (size_t k = 0; k < w[i].size(); ++k) {
        ASSERT_EQ(testing_util::float_bits(got.w[i][k]), testing_util::float_bits(w[i][k]))
            << params[i].name << "[" << k << "] step " << s << ": " << got.w[i][k] << " vs " << w[i][k];
        ASSERT_EQ(testing_util::float_bits(got.m[i][k]), testing_util::float_bits(m[i][k]))
            << "m of " << params[i].name << "[" << k << "] step " << s;
      }
    }
  }
}

TEST(Muon, StepsAreTheFormulasBitForBitNesterov) { expect_steps_are_the_formulas(0.95, true, 0); }
TEST(Muon, StepsAreTheFormulasBitForBitPlainMomentumMatchRms) { expect_steps_are_the_formulas(0.95, false, 1); }
// μ < 0.5: the buffer's lerp (weight 1 - μ >= 0.5) and Nesterov's (weight μ < 0.5) take the other
// branches of torch's formula.
TEST(Muon, StepsAreTheFormulasBitForBitSmallMomentum) { expect_steps_are_the_formulas(0.3, true, 0); }
// The auxiliary AdamW's decoupled decay w *= 1 - aux_lr*aux_wd (aux_lr, not Muon's lr), on the
// bias-like tensors; and a weight-role tensor marked "adamw" stepped by that AdamW, not by Muon.
TEST(Muon, StepsAreTheFormulasBitForBitAuxWeightDecay) { expect_steps_are_the_formulas(0.95, true, 0, 0.25); }
TEST(Muon, StepsAreTheFormulasBitForBitMarkedAdamW) { expect_steps_are_the_formulas(0.95, true, 0, 0.0, true); }
TEST(Muon, StepsAreTheFormulasBitForBitMarkedAdamWWithAuxWeightDecay) {
  expect_steps_are_the_formulas(0.95, false, 1, 0.25, true);
}

// Matrices on both sides of the CPU backend's small-matrix bound, 2^21 multiply-adds per product
// (r² c; below it a matrix runs on one thread, beside the other small ones; from it on the whole
// team): 127 x 130 (2,096,770) and 128 x 128 (2,097,152), with the small ones of muon_params, on
// 7 threads. Every matrix must still be the reference's, whichever way it ran.
TEST(Muon, StepsAreTheFormulasWithMatricesOnBothSidesOfTheSmallBoundOnSevenThreads) {
  std::vector<ParamSpec> params = muon_params();
  params.push_back({"below", {127, 130}, Role::kDeepConv});
  params.push_back({"square", {128, 128}, Role::kDeepConv});
  params.push_back({"wide", {3, 11}, Role::kDeepConv});
  expect_steps_are_the_formulas(0.95, true, 0, 0.0, false, params, 7);
}

// A muon plan places a weight-role tensor marked "adamw" in the bias-like group (as an fc_bias):
// no Muon matrix for it, its elements in the bias-like span; other kinds keep its role.
TEST(Muon, MarkedTensorJoinsTheBiasLikeGroupOfAMuonPlanOnly) {
  std::vector<ParamSpec> params = muon_params();
  params[2].optimizer = ParamOptimizer::kAdamW;  // "tall", fc_weight, 60 elements
  const MemoryPlan muon(params, plan_config_from_optimizer(OptimizerKind::kMuon));
  EXPECT_EQ(muon.tensor(2).spec.role, Role::kFcBias);
  EXPECT_EQ(muon.muon_matrices().size(), 4u);
  EXPECT_EQ(muon.muon_matrices()[0].rows, 6);  // the conv weight comes first now
  EXPECT_EQ(muon.region(W_FC_BIAS).used, 3u + 60u);
  for (const KindInfo& info : kKindTable) {
    if (info.kind == OptimizerKind::kMuon) continue;
    const MemoryPlan plan(params, plan_config_from_optimizer(info.kind));
    EXPECT_EQ(plan.tensor(2).spec.role, Role::kFcWeight) << info.name;
    EXPECT_EQ(plan.region(W_FC_BIAS).used, 3u) << info.name;
  }
}

// aux_weight_decay goes through a checkpoint (META's optional rows): a task built with the
// defaults loads it, and its next steps are the saving task's bit for bit. The mark is part of
// the layout: a file of a marked layout is refused by a task without the mark, naming both.
TEST(Muon, AuxWeightDecayAndTheMarkGoThroughACheckpoint) {
  checkpoint_test::TempDir dir;
  std::vector<ParamSpec> params = muon_params();
  params[2].optimizer = ParamOptimizer::kAdamW;
  const OptimizerConfig config = Muon().lr(0.02).aux_lr(0.01).aux_weight_decay(0.3).config();
  auto run = checkpoint_test::make_task(params, config, BackendKind::kCpu);
  testing_util::set_all_weights(*run, testing_util::make_weights(params, 5));
  auto step = [&](Task& task, uint64_t s) {
    testing_util::set_all_grads(task, testing_util::make_grads(params, 11, s, 1.0));
    task.step();
  };
  step(*run, 0);
  step(*run, 1);
  run->save(dir.file("a.ckpt"));
  EXPECT_EQ(read_checkpoint_info(dir.file("a.ckpt")).config.aux_weight_decay, 0.3);
  auto resumed = checkpoint_test::make_task(params, Muon().config(), BackendKind::kCpu);
  resumed->load(dir.file("a.ckpt"));
  EXPECT_EQ(resumed->config().aux_weight_decay, 0.3);
  EXPECT_EQ(resumed->fingerprint(), run->fingerprint());
  step(*run, 2);
  step(*resumed, 2);
  EXPECT_EQ(resumed->fingerprint(), run->fingerprint());

  std::vector<ParamSpec> unmarked = muon_params();
  auto other = checkpoint_test::make_task(unmarked, Muon().config(), BackendKind::kCpu);
  checkpoint_test::expect_error([&] { other->load(dir.file("a.ckpt")); }, "'tall': optimizer adamw (checkpoint) vs by role (task)",
                                ErrorKind::kInvalidArgument);
}

}  // namespace
}  // namespace renaissance
