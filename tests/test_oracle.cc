// Every optimizer kind against the independent float64 oracle (tests/oracle_f64.h): W, M, V and
// the LARS trust ratios N, compared by relative L2 per tensor after every step of a run with an
// lr schedule, loss scales != 1, a skipped (non-finite) step, and tensors of awkward sizes in
// all six roles. Runs on every backend under test, so the CUDA backend meets the same oracle.
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
#include "tests/optimizer_cases.h"
#include "tests/oracle_f64.h"
#include "tests/test_util.h"

namespace renaissance {
namespace {

using testing_util::KindCase;

// Tolerance on ‖float32 result - float64 oracle‖ / ‖oracle‖ per tensor.
//
// Why 4e-6: float32 rounds each operation with relative error <= u = 2^-24 ≈ 6e-8. One step of
// any kind is at most ~10 rounded operations per element, plus the float rounding of lr, 1-lr*wd,
// β, 1-β, eps, 1/scale and the bias corrections (each <= u, DESIGN.md §3 forms them in double
// and rounds once). The inputs are chosen so that no operation cancels (see element_sign in
// optimizer_cases.h), momentum and moment updates are contractions (β < 1), so errors from
// earlier steps do not grow. A worst-case linear sum over 8 steps is 8 * ~10 * u ≈ 5e-6; the
// errors are independent and of random sign, so the per-tensor L2 is typically ~1e-7..1e-6.
// 4e-6 sits above the typical drift with margin and well below what any formula mistake
// produces: a missing or misplaced weight decay moves W by lr*wd = 5e-4 per step, a wrong t in
// Adam's bias correction changes the update by tens of percent (≈ 1e-4 of W), a float-formed
// 1-β2 (1.3e-5 relative, DESIGN.md §3) pushes V past it, a missing unscale is off by 1000x.
constexpr double kRelL2Bound = 4e-6;

// The schedule: lr multipliers (0 included: a legal lr), loss scales (powers of two and a
// non-power of two, so 1/scale is inexact in float), and one step with a non-finite gradient
// that both the library and the oracle must skip without counting it in t.
constexpr int kSteps = 9;
constexpr double kLrFactor[kSteps] = {1.0, 0.5, 0.8, 1.2, 0.0, 1.0, 0.3, 0.9, 0.6};
constexpr double kLossScale[kSteps] = {1.0, 1024.0, 1000.0, 65536.0, 1.0, 0.5, 1.0, 3.0, 128.0};
constexpr int kNonFiniteStep = 4;

struct MaxErrors {
  double w = 0, m = 0, v = 0, n = 0;
};

class OracleTest : public ::testing::TestWithParam<std::tuple<BackendKind, KindCase>> {
 protected:
  // Runs the schedule on `params` from weights `w0` and checks every tensor after every step.
  // The gradients of `zero_grad_ids` are zero and those of `tiny_grad_ids` scaled by 1e-6.
  // ASSERTs return early, so the result goes through `out`.
  void run(const std::vector<ParamSpec>& params, const std::vector<std::vector<float>>& w0,
           const std::vector<size_t>& zero_grad_ids, const std::vector<size_t>& tiny_grad_ids, MaxErrors* out) {
    const BackendKind backend = std::get<0>(GetParam());
    const OptimizerConfig config = std::get<1>(GetParam()).config;
    const OptimizerKind kind = config.kind;
    TaskOptions options;
    options.backend = backend;
    Task task(params, options);
    task.optimizer(config);
    task.compile();
    testing_util::set_all_weights(task, w0);
    oracle::OracleF64 ref(config, params, w0);

    MaxErrors& max = *out;
    for (int s = 0; s < kSteps; ++s) {
      const double lr = config.lr * kLrFactor[s];
      const double scale = kLossScale[s];
      std::vector<std::vector<float>> g = testing_util::make_grads(params, 17, static_cast<uint64_t>(s), scale);
      for (size_t id : zero_grad_ids) std::fill(g[id].begin(), g[id].end(), 0.0f);
      // Tiny gradients drive the LARS trust ratio into its clamp at 100.
      for (size_t id : tiny_grad_ids) {
        for (float& x : g[id]) x = static_cast<float>(static_cast<double>(x) * 1e-6);
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
      ASSERT_EQ(task.last_step_skipped(), !applied) << "step " << s;
      ASSERT_EQ(task.step_count(), ref.t()) << "step " << s;

      const testing_util::TaskState got = testing_util::read_state(task);
      for (size_t id = 0; id < params.size(); ++id) {
        const oracle::TensorState& want = ref.tensor(id);
        const std::string where = "step " + std::to_string(s) + ", param " + std::to_string(id) + " (" +
                                  role_name(params[id].role) + ", " + std::to_string(params[id].numel()) +
                                  " elements)";
        const double ew = oracle::relative_l2(got.w[id], want.w);
        EXPECT_LE(ew, kRelL2Bound) << "W at " << where;
        max.w = std::max(max.w, ew);
        if (testing_util::has_m(kind)) {
          const double em = oracle::relative_l2(got.m[id], want.m);
          EXPECT_LE(em, kRelL2Bound) << "M at " << where;
          max.m = std::max(max.m, em);
        }
        if (testing_util::has_v(kind)) {
          const double ev = oracle::relative_l2(got.v[id], want.v);
          EXPECT_LE(ev, kRelL2Bound) << "V at " << where;
          max.v = std::max(max.v, ev);
        }
        if (testing_util::is_lars(kind) && ref.is_weight_group(id)) {
          // N holds the trust ratio η of the last applied step (one float per tensor).
          const double en = std::abs(static_cast<double>(got.n[id]) - want.trust) / want.trust;
          EXPECT_LE(en, kRelL2Bound) << "N = " << got.n[id] << ", oracle η = " << want.trust << " at " << where;
          max.n = std::max(max.n, en);
        }
      }
      if (HasFailure()) return;  // one step's report is enough
    }
    EXPECT_EQ(task.skipped_steps(), 1);
  }

  void report(const char* layout, const MaxErrors& e) {
    std::ostringstream os;
    os.precision(3);
    os << "[oracle] " << backend_kind_name(std::get<0>(GetParam())) << " " << std::get<1>(GetParam()).name << " "
       << layout << ": max rel L2 W=" << e.w << " M=" << e.m << " V=" << e.v << " N=" << e.n;
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
  const size_t zero_w_bias = params.size();
  params.push_back({"zero_w_bias", {33}, Role::kFcBias});
  const size_t zero_w_weight = params.size();  // LARS must take η = 1 when ‖w‖ < 1e-12
  params.push_back({"zero_w_weight", {31}, Role::kDeepConv});
  const size_t zero_g = params.size();  // and η = 1 when ‖ĝ‖ < 1e-12
  params.push_back({"zero_g", {65}, Role::kFcWeight});
  const size_t tiny_g = params.size();  // η clamped at 100
  params.push_back({"tiny_g", {129}, Role::kFirstConv});
  params.push_back({"last", {4099}, Role::kBnWeight});
  std::vector<std::vector<float>> w0 = testing_util::make_weights(params, 5);
  std::fill(w0[zero_w_bias].begin(), w0[zero_w_bias].end(), 0.0f);
  std::fill(w0[zero_w_weight].begin(), w0[zero_w_weight].end(), 0.0f);
  MaxErrors e;
  run(params, w0, {zero_g}, {tiny_g}, &e);
  report("odd_sizes", e);
}

TEST_P(OracleTest, HundredsOfTinyTensors) {
  RN_SKIP_IF_UNAVAILABLE(std::get<0>(GetParam()));
  std::vector<int64_t> sizes;
  for (int i = 0; i < 400; ++i) sizes.push_back(1 + (i * 7) % 9);  // 1..9 elements, roles cycling
  const std::vector<ParamSpec> params = testing_util::layout_of_sizes(sizes);
  MaxErrors e;
  run(params, testing_util::make_weights(params, 6), {}, {}, &e);
  report("tiny_tensors", e);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, OracleTest,
                         ::testing::Combine(::testing::ValuesIn(testing_util::backends_under_test()),
                                            ::testing::ValuesIn(testing_util::all_kind_cases())),
                         [](const ::testing::TestParamInfo<OracleTest::ParamType>& info) {
                           return std::string(backend_kind_name(std::get<0>(info.param))) + "_" +
                                  std::get<1>(info.param).name;
                         });

}  // namespace
}  // namespace renaissance
