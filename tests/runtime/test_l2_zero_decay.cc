// The L2 term ĝ + wd*w (and LAMB's u + wd*w) is skipped when the group's weight decay is 0, as
// torch and timm skip it: an infinite weight stays infinite (0*inf would make it NaN) and the
// other elements are the bits of a run whose weights are all finite. Every kind with such a term
// (sgd, sgd_momentum, sgd_nesterov in L2 mode, adam; the bias-like group, whose wd is 0, of adam
// and lamb) on every backend of the build; CPU and CUDA agree (skips without a device).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "renaissance/task.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::same_bits;
using testing_util::task_options;

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<ParamSpec> test_params() { return {{"fc.w", {40}, Role::kFcWeight}, {"fc.b", {24}, Role::kFcBias}}; }

struct Case {
  std::string name;
  OptimizerConfig config;
  bool weight_inf;  // the weight group's wd is 0 too: an infinite element there as well
};

std::vector<Case> cases() {
  auto l2 = [](OptimizerConfig c) {
    c.weight_decay_mode = WeightDecayMode::kL2;
    c.weight_decay = 0.0;
    return c;
  };
  OptimizerConfig adam = default_config(OptimizerKind::kAdam);
  adam.weight_decay = 0.0;
  OptimizerConfig adam_wd = default_config(OptimizerKind::kAdam);
  adam_wd.weight_decay = 0.05;
  return {{"sgd_l2", l2(default_config(OptimizerKind::kSgd)), true},
          {"sgd_momentum_l2", l2(default_config(OptimizerKind::kSgdMomentum)), true},
          {"sgd_nesterov_l2", l2(default_config(OptimizerKind::kSgdNesterov)), true},
          {"adam", adam, true},
          {"adam_bias_group", adam_wd, false},
          {"lamb_bias_group", default_config(OptimizerKind::kLamb), false}};
}

std::vector<float> initial(size_t id, bool with_inf) {
  std::vector<float> w(id == 0 ? 40 : 24);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.3f + 0.05f * static_cast<float>(i % 7) - 0.2f * static_cast<float>(i % 2);
  if (with_inf) {
    w[3] = kInf;
    w[6] = -kInf;
  }
  return w;
}

std::vector<float> grad(size_t id, int step) {
  std::vector<float> g(id == 0 ? 40 : 24);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>((i * 5 + step * 3 + id) % 11) - 0.04f;
  return g;
}

std::vector<float> read_w(Task& t, size_t id) {
  std::vector<float> v(static_cast<size_t>(t.param(id).numel()));
  t.read(Family::kW, id, v.data());
  return v;
}

void run(Task& t, const Case& c, bool with_inf) {
  t.optimizer(c.config);
  t.compile();
  t.set_weight(0, initial(0, with_inf && c.weight_inf).data());
  t.set_weight(1, initial(1, with_inf).data());
  for (int s = 0; s < 3; ++s) {
    for (size_t id = 0; id < 2; ++id) t.set_grad(id, grad(id, s).data());
    t.step();
  }
}


class L2ZeroDecayTest : public ::testing::TestWithParam<BackendKind> {};

TEST_P(L2ZeroDecayTest, AnInfiniteWeightStaysInfiniteAndTheRestIsUnchanged) {
  RN_SKIP_IF_UNAVAILABLE(GetParam());
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    Task with_inf(test_params(), task_options(GetParam())), finite(test_params(), task_options(GetParam()));
    run(with_inf, c, true);
    run(finite, c, false);
    EXPECT_EQ(with_inf.step_count(), 3);
    for (size_t id = 0; id < 2; ++id) {
      std::vector<float> a = read_w(with_inf, id), b = read_w(finite, id);
      if (id == 1 || c.weight_inf) {
        EXPECT_EQ(a[3], kInf) << "tensor " << id;
        EXPECT_EQ(a[6], -kInf) << "tensor " << id;
        a[3] = b[3];
        a[6] = b[6];
      }
      EXPECT_TRUE(same_bits(a, b)) << "tensor " << id;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, L2ZeroDecayTest, ::testing::ValuesIn(testing_util::backends_under_test()),
                         [](const ::testing::TestParamInfo<BackendKind>& info) {
                           return std::string(backend_kind_name(info.param));
                         });

TEST(L2ZeroDecayCuda, CpuAndCudaAgree) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  for (const Case& c : cases()) {
    Task cpu(test_params(), task_options(BackendKind::kCpu)), cuda(test_params(), task_options(BackendKind::kCuda));
    run(cpu, c, true);
    run(cuda, c, true);
    for (size_t id = 0; id < 2; ++id) EXPECT_TRUE(same_bits(read_w(cpu, id), read_w(cuda, id))) << c.name << " " << id;
  }
}

}  // namespace
}  // namespace renaissance
