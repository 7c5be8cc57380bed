// Every optimizer kind against the independent float64 oracle (tests/support/oracle_f64.h): W, M, V and
// the LARS trust ratios N, compared by relative L2 per tensor after every step of a run with an
// lr schedule (lr = 0 on an applied step), loss scales != 1, a skipped (non-finite) step,
// tensors of awkward sizes in all six roles, and regimes where every term matters (gradients
// near eps, tiny and huge weights, the LARS clamp, β close to 1), and global gradient-norm
// clipping on every kind (steps where it is active and steps where it is not, the total norm
// read back with last_grad_norm()). Bounds come from an honest
// float32 implementation's error on the same inputs (tests/support/oracle_f32.h). Runs on every backend
// under test, so the CUDA backend meets the same oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "renaissance/task.h"
#include "support/optimizer_cases.h"
#include "support/oracle_f32.h"
#include "support/oracle_f64.h"
#include "support/test_util.h"
#include "support/kind_columns.h"

namespace renaissance {
namespace {

using testing_util::KindCase;

// Tolerance on ‖float32 result - float64 oracle‖ / ‖oracle‖ per tensor and step: at most 3x the
// error an honest float32 implementation of the same formulas (tests/support/oracle_f32.h) has on the
// same inputs against the same oracle, never below 1e-7. A constant bound would have to hold in
// the worst regime and would then be 5-35x loose in the others (where moving Adam's eps into
// the sqrt or dropping LARS's eps went unnoticed); this one follows the regime.

// The schedule: lr multipliers (0 included, on an applied step: a legal lr that must leave W
// exactly as decoupled decay leaves it and still move the moments), loss scales (powers of two
// and a non-power of two, so 1/scale is inexact in float), and one step with a non-finite
// gradient that both the library and the oracle must skip without counting it in t.
constexpr int kSteps = 9;
constexpr double kLrFactor[kSteps] = {1.0, 0.5, 0.8, 1.2, 1.0, 0.3, 0.0, 0.9, 0.6};
constexpr double kLossScale[kSteps] = {1.0, 1024.0, 1000.0, 65536.0, 1.0, 0.5, 1.0, 3.0, 128.0};
constexpr int kNonFiniteStep = 4;
constexpr int kZeroLrStep = 6;
static_assert(kLrFactor[kZeroLrStep] == 0.0 && kZeroLrStep != kNonFiniteStep, "lr = 0 must be applied");

struct MaxErrors {
  double w = 0, m = 0, v = 0, n = 0;
  double ratio = 0;  // worst (library error) / (honest float32 error), where the latter is > 0
  // muon: worst (weight error - element-wise bound) / (Newton–Schulz path / ‖w‖), against
  // kMuonNsRelError (0 where the element-wise bound alone holds)
  double muon_ns = 0;
  int clipped_steps = 0, unclipped_steps = 0;  // applied steps with clipping on, by coefficient
};

// Per-step gradient multipliers of the clipping test: with max_grad_norm set to 3x the norm of a
// factor-1 step, the steps with factor 10 are clipped and the others are not.
constexpr double kClipStepFactor[kSteps] = {1.0, 10.0, 1.0, 10.0, 1.0, 10.0, 1.0, 1.0, 10.0};

// Per tensor: the initial weights and the unscaled gradients are multiplied by these (in double,
// then rounded to float once), to put tensors into regimes where every term of a rule matters.
struct Regime {
  double w = 1.0, g = 1.0;
};

class OracleTest : public ::testing::TestWithParam<std::tuple<BackendKind, KindCase>> {
 protected:
  // Runs the schedule on `params` from weights `w0` (regimes already applied) and checks every
  // tensor after every step. ASSERTs return early, so the result goes through `out`.
  void run(const std::vector<ParamSpec>& params, const std::vector<std::vector<float>>& w0,
           const std::vector<double>& grad_factor, const OptimizerConfig& config, MaxErrors* out,
           const double* step_factor = nullptr) {
    const BackendKind backend = std::get<0>(GetParam());
    const OptimizerKind kind = config.kind;
    TaskOptions options;
    options.backend = backend;
    Task task(params, options);
    task.optimizer(config);
    task.compile();
    testing_util::set_all_weights(task, w0);
    oracle::OracleF64 ref(config, params, w0);
    oracle::OracleF32 honest(config, params, w0);

    MaxErrors& max = *out;
    for (int s = 0; s < kSteps; ++s) {
      const double lr = config.lr * kLrFactor[s];
      const double scale = kLossScale[s];
      std::vector<std::vector<float>> g = testing_util::make_grads(params, 17, static_cast<uint64_t>(s), scale);
      for (size_t id = 0; id < params.size(); ++id) {
        if (grad_factor[id] == 1.0) continue;
        for (float& x : g[id]) x = static_cast<float>(static_cast<double>(x) * grad_factor[id]);
      }
      if (step_factor != nullptr && step_factor[s] != 1.0) {
        for (auto& tensor : g) {
          for (float& x : tensor) x = static_cast<float>(static_cast<double>(x) * step_factor[s]);
        }
      }
      if (s == kNonFiniteStep) {
        const size_t middle = params.size() / 2;
        ASSERT_GT(g[middle].size(), 0u);
        g[middle][g[middle].size() / 2] = std::numeric_limits<float>::infinity();
      }
      task.set_lr(lr);
      task.set_loss_scale(scale);
      testing_util::set_all_grads(task, g);
      task.step();
      const bool applied = ref.step(g, lr, scale);
      ASSERT_EQ(honest.step(g, lr, scale), applied);
      ASSERT_EQ(task.last_step_skipped(), !applied) << "step " << s;
      ASSERT_EQ(task.step_count(), ref.t()) << "step " << s;
      if (config.max_grad_norm > 0.0 && applied) {
        // The total norm the device computed, against the oracle's (bound as for every check).
        const double want = ref.last_total_norm();
        const double err = std::abs(task.last_grad_norm() - want) / want;
        EXPECT_LE(err, oracle::bound_from_f32(std::abs(honest.last_total_norm() - want) / want))
            << "total gradient norm at step " << s << ": " << task.last_grad_norm() << " vs " << want;
        (config.max_grad_norm < want ? max.clipped_steps : max.unclipped_steps) += 1;
      }

      const testing_util::TaskState got = testing_util::read_state(task);
      for (size_t id = 0; id < params.size(); ++id) {
        const oracle::TensorState& want = ref.tensor(id);
        const oracle::TensorStateF32& f32 = honest.tensor(id);
        const std::string where = "step " + std::to_string(s) + ", param " + std::to_string(id) + " " +
                                  params[id].name + " (" + role_name(params[id].role) + ", " +
                                  std::to_string(params[id].numel()) + " elements)";
        auto check = [&](const char* what, double err, double honest_err, double* worst) {
          const double bound = oracle::bound_from_f32(honest_err);
          EXPECT_LE(err, bound) << what << " at " << where << ": rel error " << err << ", honest float32 "
                                << honest_err;
          *worst = std::max(*worst, err);
          if (honest_err > 0) max.ratio = std::max(max.ratio, err / honest_err);
        };
        if (kind == OptimizerKind::kMuon && ref.is_weight_group(id)) {
          // Muon's weight group: the honest float32 run's Newton–Schulz is float64 (oracle_f32.h),
          // so its error covers the element-wise parts only; the exact-mode orthogonalisation adds
          // at most kMuonNsRelError of each step's ‖lr_adj·X‖, whose sum is the oracle's path.
          const double err = oracle::relative_l2(got.w[id], want.w);
          const double honest_err = oracle::relative_l2(f32.w, want.w);
          const double w_norm = std::sqrt(want.w.square().sum());
          const double bound = oracle::bound_from_f32(honest_err) +
                               (w_norm > 0.0 ? oracle::kMuonNsRelError * want.muon_path / w_norm : 0.0);
          EXPECT_LE(err, bound) << "W at " << where << ": rel error " << err << ", honest float32 " << honest_err
                                << ", Newton-Schulz path " << want.muon_path / w_norm;
          max.w = std::max(max.w, err);
          // The share of the path the error needs beyond the element-wise bound.
          const double beyond = err - oracle::bound_from_f32(honest_err);
          if (want.muon_path > 0.0 && beyond > 0.0) max.muon_ns = std::max(max.muon_ns, beyond * w_norm / want.muon_path);
        } else {
          check("W", oracle::relative_l2(got.w[id], want.w), oracle::relative_l2(f32.w, want.w), &max.w);
        }
        if (testing_util::has_m(kind)) {
          check("M", oracle::relative_l2(got.m[id], want.m), oracle::relative_l2(f32.m, want.m), &max.m);
        }
        if (testing_util::has_v(kind)) {
          check("V", oracle::relative_l2(got.v[id], want.v), oracle::relative_l2(f32.v, want.v), &max.v);
        }
        if (kind_info(kind).norm != NormPass::kNone && ref.is_weight_group(id) && ref.t() > 0) {
          // N holds the trust ratio (LARS η, LAMB r; Muon: the adjusted lr, 0 at lr = 0) of the last
          // applied step (one float per tensor).
          const double denominator = want.trust != 0.0 ? want.trust : 1.0;
          check("N (trust ratio)", std::abs(static_cast<double>(got.n[id]) - want.trust) / denominator,
                std::abs(static_cast<double>(f32.trust) - want.trust) / denominator, &max.n);
        }
      }
      if (HasFailure()) return;  // one step's report is enough
    }
    EXPECT_EQ(task.skipped_steps(), 1);
  }

  void run(const std::vector<ParamSpec>& params, const std::vector<Regime>& regimes, uint64_t seed,
           const OptimizerConfig& config, MaxErrors* out) {
    std::vector<std::vector<float>> w0 = testing_util::make_weights(params, seed);
    std::vector<double> grad_factor;
    for (size_t id = 0; id < params.size(); ++id) {
      for (float& x : w0[id]) x = static_cast<float>(static_cast<double>(x) * regimes[id].w);
      grad_factor.push_back(regimes[id].g);
    }
    run(params, w0, grad_factor, config, out);
  }

  // run() on `params` in their regimes, its errors reported under the name `layout`.
  void run_and_report(const char* layout, const std::vector<ParamSpec>& params, const std::vector<Regime>& regimes,
                      uint64_t seed, const OptimizerConfig& config) {
    MaxErrors e;
    run(params, regimes, seed, config, &e);
    report(layout, e);
  }

  void report(const char* layout, const MaxErrors& e) {
    std::ostringstream os;
    os.precision(3);
    os << "[oracle] " << backend_kind_name(std::get<0>(GetParam())) << " " << std::get<1>(GetParam()).name << " "
       << layout << ": max rel L2 W=" << e.w << " M=" << e.m << " V=" << e.v << " N=" << e.n
       << "; worst library/honest-float32 error ratio " << e.ratio << " (bound 3)";
    if (std::get<1>(GetParam()).config.kind == OptimizerKind::kMuon) {
      os << "; muon weight error beyond the element-wise bound / path " << e.muon_ns << " (bound "
         << oracle::kMuonNsRelError << ")";
    }
    std::cout << os.str() << std::endl;
    RecordProperty("max_rel_l2_w", std::to_string(e.w));
    RecordProperty("max_rel_l2_m", std::to_string(e.m));
    RecordProperty("max_rel_l2_v", std::to_string(e.v));
    RecordProperty("max_rel_l2_n", std::to_string(e.n));
  }
};

TEST_P(OracleTest, OddSizesInAllRoles) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  // The sizes, round robin over the six roles, then the same sizes again with the
  // roles shifted by three (so every size meets both groups), then edge cases by name.
  const std::vector<int64_t> sizes = {0, 1, 3, 7, 15, 16, 17, 1023, 4097, 300007};
  std::vector<ParamSpec> params = testing_util::layout_of_sizes(sizes);
  for (const ParamSpec& p : testing_util::layout_of_sizes(sizes, 3)) {
    params.push_back({"shifted_" + p.name, p.shape, p.role});
  }
  std::vector<Regime> regimes(params.size());
  params.push_back({"zero_w_bias", {33}, Role::kFcBias});
  regimes.push_back({0.0, 1.0});
  params.push_back({"zero_w_weight", {31}, Role::kDeepConv});  // LARS: η = 1 when ‖w‖ < 1e-12
  regimes.push_back({0.0, 1.0});
  params.push_back({"zero_g", {65}, Role::kFcWeight});  // and η = 1 when ‖ĝ‖ < 1e-12
  regimes.push_back({1.0, 0.0});
  params.push_back({"last", {4099}, Role::kBnWeight});
  regimes.push_back({});
  run_and_report("odd_sizes", params, regimes, 5, std::get<1>(GetParam()).config);
}

TEST_P(OracleTest, HundredsOfTinyTensors) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  std::vector<int64_t> sizes;
  for (int i = 0; i < 400; ++i) sizes.push_back(1 + (i * 7) % 9);  // 1..9 elements, roles cycling
  const std::vector<ParamSpec> params = testing_util::layout_of_sizes(sizes);
  MaxErrors e;
  run(params, std::vector<Regime>(params.size()), 6, std::get<1>(GetParam()).config, &e);
  report("tiny_tensors", e);
}

// Regimes in which every term of every rule moves the result by far more than the bound, in
// both groups: gradients near Adam's eps (|ĝ| in [1e-8, 1e-7) and [1e-7, 1e-6), on weights
// of ~1e-7 so Adam's L2 term does not swamp them), tiny and huge weights, a weight-group tensor
// with tiny gradients and one with huge weights (LARS: η = tc*‖w‖/(‖ĝ‖ + wd*‖w‖ + eps) -> tc/wd
// = 200, clamped at 100), and tiny weights with tiny gradients (LARS: eps is ~1% of the
// denominator). Run with the kind's hyperparameters and again with β close to 1 (β1 = 0.99,
// β2 = 0.99999, momentum 0.99), where 1 - β and the bias corrections must be formed in double.
std::vector<ParamSpec> extreme_layout(std::vector<Regime>* regimes) {
  std::vector<ParamSpec> p;
  auto add = [&](const char* name, int64_t n, Role role, Regime r) {
    p.push_back({name, {n}, role});
    regimes->push_back(r);
  };
  add("near_eps_weight", 257, Role::kDeepConv, {1e-7, 1e-7});
  add("near_eps_bias", 65, Role::kBnBias, {1e-7, 1e-7});
  add("small_g_weight", 129, Role::kFcWeight, {1e-7, 1e-6});
  add("small_g_bias", 33, Role::kFcBias, {1e-7, 1e-6});
  add("huge_w_weight", 300, Role::kFirstConv, {1e6, 1.0});
  add("huge_w_bias", 17, Role::kBnWeight, {1e6, 1.0});
  add("tiny_w_weight", 97, Role::kDeepConv, {1e-6, 1.0});
  add("tiny_w_bias", 40, Role::kBnBias, {1e-6, 1.0});
  add("clamped_weight", 129, Role::kDeepConv, {1.0, 1e-6});
  add("plain_weight", 1000, Role::kFcWeight, {});
  return p;
}

OptimizerConfig beta_near_one(OptimizerConfig c) {
  c.beta1 = 0.99;
  c.beta2 = 0.99999;
  c.momentum = 0.99;
  return testing_util::unread_columns_at_defaults(c);
}

TEST_P(OracleTest, NearEpsTinyHugeWeightsAndTheClamp) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  std::vector<Regime> regimes;
  const std::vector<ParamSpec> params = extreme_layout(&regimes);
  run_and_report("extremes", params, regimes, 7, std::get<1>(GetParam()).config);
}

TEST_P(OracleTest, NearEpsTinyHugeWeightsAndTheClampWithBetaNearOne) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  std::vector<Regime> regimes;
  const std::vector<ParamSpec> params = extreme_layout(&regimes);
  run_and_report("extremes_beta_near_one", params, regimes, 8, beta_near_one(std::get<1>(GetParam()).config));
}

// Global gradient-norm clipping on every kind: max_grad_norm between the norms of the plain and
// the scaled-up steps, so that the run has clipped and unclipped steps (both counted), and the
// skipped step. The oracle clips in float64 (torch's clip_grad_norm_ semantics).
TEST_P(OracleTest, GradientNormClipping) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  const std::vector<int64_t> sizes = {1, 7, 17, 1023, 4097, 70001};
  const std::vector<ParamSpec> params = testing_util::layout_of_sizes(sizes);
  // The norm of a factor-1 step (scale 1) sets the threshold.
  double sum_sq = 0.0;
  for (const auto& tensor : testing_util::make_grads(params, 17, 0, 1.0)) {
    for (float x : tensor) sum_sq += static_cast<double>(x) * x;
  }
  OptimizerConfig config = std::get<1>(GetParam()).config;
  config.max_grad_norm = 3.0 * std::sqrt(sum_sq);
  const std::vector<double> unit(params.size(), 1.0);
  MaxErrors e;
  run(params, testing_util::make_weights(params, 9), unit, config, &e, kClipStepFactor);
  report("clipping", e);
  EXPECT_GE(e.clipped_steps, 3);
  EXPECT_GE(e.unclipped_steps, 3);
  // Again with gradients 1e-6 as large (total norms ~1e-4): the 1e-6 in max_norm/(total + 1e-6)
  // now moves the coefficient by ~1%, far beyond the bound.
  const std::vector<double> tiny(params.size(), 1e-6);
  config.max_grad_norm *= 1e-6;
  MaxErrors small;
  run(params, testing_util::make_weights(params, 9), tiny, config, &small, kClipStepFactor);
  report("clipping_small_norms", small);
  EXPECT_GE(small.clipped_steps, 3);
  EXPECT_GE(small.unclipped_steps, 3);
}

// The regimes really are reached: computed with the float64 oracle alone, before any library
// step, so a change of inputs that loses one (say, gradients no longer near eps) fails here
// instead of silently weakening the tests above.
TEST(OracleRegimes, ExtremeLayoutReachesEveryRegime) {
  std::vector<Regime> regimes;
  const std::vector<ParamSpec> params = extreme_layout(&regimes);
  std::vector<std::vector<float>> w0 = testing_util::make_weights(params, 7);
  std::vector<std::vector<float>> g = testing_util::make_grads(params, 17, 0, 1.0);
  for (size_t id = 0; id < params.size(); ++id) {
    for (float& x : w0[id]) x = static_cast<float>(static_cast<double>(x) * regimes[id].w);
    for (float& x : g[id]) x = static_cast<float>(static_cast<double>(x) * regimes[id].g);
  }
  auto max_abs = [](const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, std::abs(static_cast<double>(x)));
    return m;
  };
  // Adam: |ĝ| within a factor 100 of eps = 1e-8 in the near-eps tensors.
  EXPECT_LE(max_abs(g[0]), 1e-7);
  EXPECT_LE(max_abs(g[2]), 1e-6);
  // LARS (tc 0.2, wd 1e-3, eps 1e-8): the clamp in clamped_weight and huge_w_weight, eps >= 1%
  // of the denominator (and no clamp) in near_eps_weight.
  const OptimizerConfig lars = LARS().lr(0.02).momentum(0.9).weight_decay(1e-3).trust_coefficient(0.2).eps(1e-8).config();
  for (size_t id : {size_t{4}, size_t{8}, size_t{0}}) {
    oracle::OracleF64 ref(lars, {params[id]}, {w0[id]});
    ASSERT_TRUE(ref.step({g[id]}, lars.lr, 1.0));
    if (id == 0) {
      EXPECT_LT(ref.tensor(0).trust, 100.0) << params[id].name;
      double g_sq = 0, w_sq = 0;
      for (float x : g[id]) g_sq += static_cast<double>(x) * x;
      for (float x : w0[id]) w_sq += static_cast<double>(x) * x;
      EXPECT_GE(lars.eps / (std::sqrt(g_sq) + lars.weight_decay * std::sqrt(w_sq) + lars.eps), 0.005) << params[id].name;
    } else {
      EXPECT_EQ(ref.tensor(0).trust, 100.0) << params[id].name << " does not reach the clamp";
    }
  }
}

// Layout marks (ParamSpec::optimizer "adamw"): a muon task steps the marked embedding and head
// with its auxiliary AdamW, which here also decays (aux_weight_decay 0.1 with aux_lr 0.01, not
// Muon's lr 0.02); every other kind ignores the marks. The oracle decides both independently.
TEST_P(OracleTest, MarkedAdamWTensorsAndAuxWeightDecay) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  std::vector<ParamSpec> params = {{"embedding", {40, 8}, Role::kFcWeight},
                                   {"ln.w", {8}, Role::kBnWeight},
                                   {"proj", {8, 12}, Role::kFcWeight},
                                   {"proj.b", {12}, Role::kFcBias},
                                   {"head", {12, 30}, Role::kFcWeight}};
  params[0].optimizer = ParamOptimizer::kAdamW;
  params[4].optimizer = ParamOptimizer::kAdamW;
  OptimizerConfig config = std::get<1>(GetParam()).config;
  if (config.kind == OptimizerKind::kMuon) {
    config.aux_lr = 0.01;
    config.aux_weight_decay = 0.1;
    oracle::OracleF64 ref(config, params, testing_util::make_weights(params, 8));
    EXPECT_FALSE(ref.is_weight_group(0));  // the marks reach the oracle
    EXPECT_TRUE(ref.is_weight_group(2));
  }
  run_and_report("marked_adamw", params, std::vector<Regime>(params.size()), 8, config);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, OracleTest,
                         testing_util::backend_kind_tuples(), testing_util::backend_kind_tuple_name);

}  // namespace
}  // namespace renaissance
