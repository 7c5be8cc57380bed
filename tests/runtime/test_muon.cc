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

void expect_steps_are_the_formulas(double momentum, bool nesterov, int adjust) {
  const std::vector<ParamSpec> params = muon_params();
  OptimizerConfig config = Muon().lr(0.02).weight_decay(0.05).momentum(momentum).nesterov(nesterov)
                               .adjust_lr(static_cast<MuonAdjustLr>(adjust)).aux_lr(0.003).ns_steps(4)
                               .config();
  Task task(params, testing_util::cpu_task_options());
  task.optimizer(config);
  task.compile();
  std::vector<std::vector<float>> w = testing_util::make_weights(params, 5), m(params.size());
  testing_util::set_all_weights(task, w);
  for (size_t i = 0; i < params.size(); ++i) m[i].assign(w[i].size(), 0.0f);
  std::vector<std::vector<float>> v = m;
  const float lr = 0.02f, w1 = static_cast<float>(1.0 - momentum), mu = static_cast<float>(momentum);
  const float decay = static_cast<float>(1.0 - 0.02 * 0.05), aux_lr = 0.003f;
  math::NewtonSchulzCoefficients coeff;  // the defaults, as the configuration's
  for (int s = 0; s < 2; ++s) {
    const std::vector<std::vector<float>> g = testing_util::make_grads(params, 11, static_cast<uint64_t>(s), 1.0);
    testing_util::set_all_grads(task, g);
    task.step();
    for (size_t i = 0; i < params.size(); ++i) {
      const size_t n = w[i].size();
      if (group_of(params[i].role) == Group::kBiasLike) {
        // The auxiliary AdamW (docs/math.md's adamw rule, wd 0) with aux_lr.
        const float b1 = 0.9f, b2 = 0.95f, omb1 = static_cast<float>(1.0 - 0.9), omb2 = static_cast<float>(1.0 - 0.95);
        const float bc1 = static_cast<float>(1.0 / (1.0 - std::pow(0.9, s + 1)));
        const float bc2 = static_cast<float>(1.0 / (1.0 - std::pow(0.95, s + 1)));
        for (size_t k = 0; k < n; ++k) {
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

}  // namespace
}  // namespace renaissance
