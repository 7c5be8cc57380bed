// OptimizerConfig::dampening (torch.optim.SGD's dampening) on every backend of the build (CUDA
// skips without a device):
// - sgd_momentum in both weight-decay modes against a float32 sequence written out here, element
//   by element (torch's rule: the first applied step's buffer is ĝ', later steps add (1-d)*ĝ'),
//   with a skipped first step and with the per-tensor mask (a tensor masked at the first step has
//   its own first step later);
// - a dampening set with set_group_hyper between steps, and a checkpoint that carries it;
// - (CPU == CUDA for a damped run with L2, clipping and the mask: the conformance suite's
//   sgd_momentum dampening cells, audit/matrix.cc);
// - the validation rules (torch's Nesterov rule and text; the kinds that refuse it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/task.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::same_bits;
using testing_util::read_family;
using testing_util::task_options;

constexpr double kLr = 0.05, kMomentum = 0.9, kDampening = 0.3, kWeightDecay = 0.1;

// Two weight tensors and a bias-like one (wd = 0 there), odd sizes.
std::vector<ParamSpec> test_params() {
  return {{"fc.w", {7, 13}, Role::kFcWeight}, {"fc.b", {7}, Role::kFcBias}, {"conv", {37}, Role::kDeepConv}};
}

std::vector<float> weights_of(size_t id, int64_t n) {
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[i] = 0.5f + 0.01f * static_cast<float>((i * 7 + id * 3) % 97) - 0.4f * (i % 2);
  return w;
}

// Gradient of tensor id at step s; NaN in element 0 of tensor 0 at the steps in `bad`.
std::vector<float> grad_of(size_t id, int64_t n, int step, const std::vector<int>& bad) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    g[i] = 0.25f * static_cast<float>(((i + 1) * (step + 3) * 31 + id * 17) % 41) / 41.0f - 0.11f;
  }
  for (int b : bad) {
    if (b == step && id == 0 && n > 0) g[0] = std::numeric_limits<float>::quiet_NaN();
  }
  return g;
}

OptimizerConfig damped_config(WeightDecayMode mode) {
  OptimizerConfig c = SGD().lr(kLr).momentum(kMomentum).weight_decay(kWeightDecay).dampening(kDampening).config();
  c.weight_decay_mode = mode;
  return c;
}

// The expected float32 sequence of one tensor, written out from torch's rule (not the library's
// rule functions): a step whose gradients hold a NaN anywhere is skipped whole; `masked` steps
// skip this tensor only. Every line is one float32 operation (the build never contracts).
struct Expected {
  std::vector<float> w, m;
};
Expected expected_run(size_t id, int64_t n, bool weight_group, WeightDecayMode mode, int steps,
                      const std::vector<int>& bad, const std::vector<int>& masked) {
  const float lr = static_cast<float>(kLr), beta = static_cast<float>(kMomentum);
  const float wd = weight_group ? static_cast<float>(kWeightDecay) : 0.0f;
  const float decay = weight_group ? static_cast<float>(1.0 - kLr * kWeightDecay) : 1.0f;
  const float one_minus_d = static_cast<float>(1.0 - kDampening);
  Expected e{weights_of(id, n), std::vector<float>(static_cast<size_t>(n), 0.0f)};
  bool has_buffer = false;
  for (int s = 0; s < steps; ++s) {
    bool skip = false;
    for (int b : bad) skip = skip || b == s;
    bool off = false;
    for (int k : masked) off = off || k == s;
    if (skip || off) continue;
    const std::vector<float> g = grad_of(id, n, s, {});
    for (int64_t i = 0; i < n; ++i) {
      float gp = g[i];
      if (mode == WeightDecayMode::kL2) {
        const float term = wd * e.w[i];
        gp = gp + term;
      }
      if (!has_buffer) {
        e.m[i] = gp;  // torch: buf = clone(g')
      } else {
        const float kept = beta * e.m[i];
        const float added = one_minus_d * gp;
        e.m[i] = kept + added;
      }
      const float step = lr * e.m[i];
      if (mode == WeightDecayMode::kL2) {
        e.w[i] = e.w[i] - step;
      } else {
        const float decayed = e.w[i] * decay;
        e.w[i] = decayed - step;
      }
    }
    has_buffer = true;
  }
  return e;
}

// Runs steps [from, to); with `mask`, tensor 2 is masked at the steps in `masked`.
void run(Task& task, int from, int to, const std::vector<int>& bad, const std::vector<int>& masked,
         bool mask = false) {
  const std::vector<ParamSpec> params = test_params();
  for (int s = from; s < to; ++s) {
    if (mask) {
      bool off = false;
      for (int k : masked) off = off || k == s;
      task.set_tensor_mask({0, 0, off ? 1 : 0});
    }
    for (size_t id = 0; id < params.size(); ++id) task.set_grad(id, grad_of(id, params[id].numel(), s, bad).data());
    task.step();
  }
}

class DampeningTest : public ::testing::TestWithParam<BackendKind> {};

TEST_P(DampeningTest, MatchesTorchsRuleWrittenOut) {
  RN_SKIP_IF_UNAVAILABLE(GetParam());
  const std::vector<ParamSpec> params = test_params();
  for (WeightDecayMode mode : {WeightDecayMode::kDecoupled, WeightDecayMode::kL2}) {
    for (bool mask : {false, true}) {
      // No skip; a skipped first step (the next applied step is still the undamped first); a
      // skip later on.
      for (const std::vector<int>& bad : {std::vector<int>{}, std::vector<int>{0}, std::vector<int>{3}}) {
        const std::vector<int> masked = mask ? std::vector<int>{0, 1, 4} : std::vector<int>{};
        SCOPED_TRACE(std::string(mode == WeightDecayMode::kL2 ? "l2" : "decoupled") + " mask " +
                     std::to_string(mask) + " bad " + (bad.empty() ? "-" : std::to_string(bad[0])));
        Task task(params, task_options(GetParam(), mask));
        task.optimizer(damped_config(mode));
        task.compile();
        for (size_t id = 0; id < params.size(); ++id) task.set_weight(id, weights_of(id, params[id].numel()).data());
        run(task, 0, 6, bad, masked, mask);
        for (size_t id = 0; id < params.size(); ++id) {
          const Expected e = expected_run(id, params[id].numel(), group_of(params[id].role) == Group::kWeight, mode, 6,
                                          bad, id == 2 ? masked : std::vector<int>{});
          EXPECT_TRUE(same_bits(read_family(task, Family::kW, id), e.w)) << params[id].name << " W";
          EXPECT_TRUE(same_bits(read_family(task, Family::kM, id), e.m)) << params[id].name << " M";
        }
      }
    }
  }
}

// Dampening is not a no-op: the first step equals the undamped run's, the second does not.
TEST_P(DampeningTest, ChangesTheRunFromTheSecondStep) {
  RN_SKIP_IF_UNAVAILABLE(GetParam());
  const std::vector<ParamSpec> params = test_params();
  OptimizerConfig plain = damped_config(WeightDecayMode::kDecoupled);
  plain.dampening = 0.0;
  Task a(params, task_options(GetParam(), false)), b(params, task_options(GetParam(), false));
  a.optimizer(damped_config(WeightDecayMode::kDecoupled));
  b.optimizer(plain);
  for (Task* t : {&a, &b}) {
    t->compile();
    for (size_t id = 0; id < params.size(); ++id) t->set_weight(id, weights_of(id, params[id].numel()).data());
    run(*t, 0, 1, {}, {});
  }
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  run(a, 1, 2, {}, {});
  run(b, 1, 2, {}, {});
  EXPECT_NE(a.fingerprint(), b.fingerprint());
}

// set_group_hyper between steps: a run undamped for 3 steps, then damped, equals the written-out
// sequence with the factor switched at that step.
TEST_P(DampeningTest, SetGroupHyperBetweenSteps) {
  RN_SKIP_IF_UNAVAILABLE(GetParam());
  const std::vector<ParamSpec> params = test_params();
  OptimizerConfig plain = damped_config(WeightDecayMode::kDecoupled);
  plain.dampening = 0.0;
  Task switched(params, task_options(GetParam(), false));
  switched.optimizer(plain);
  switched.compile();
  for (size_t id = 0; id < params.size(); ++id) switched.set_weight(id, weights_of(id, params[id].numel()).data());
  run(switched, 0, 3, {}, {});
  switched.set_group_hyper(0, damped_config(WeightDecayMode::kDecoupled));
  run(switched, 3, 5, {}, {});
  // The reference: the same written-out rule, undamped (factor 1) at steps 1-3.
  for (size_t id = 0; id < params.size(); ++id) {
    const int64_t n = params[id].numel();
    const bool weight = group_of(params[id].role) == Group::kWeight;
    const float lr = static_cast<float>(kLr), beta = static_cast<float>(kMomentum);
    const float decay = weight ? static_cast<float>(1.0 - kLr * kWeightDecay) : 1.0f;
    const float one_minus_d = static_cast<float>(1.0 - kDampening);
    std::vector<float> w = weights_of(id, n), m(static_cast<size_t>(n), 0.0f);
    for (int s = 0; s < 5; ++s) {
      const std::vector<float> g = grad_of(id, n, s, {});
      for (int64_t i = 0; i < n; ++i) {
        if (s == 0) {
          m[i] = g[i];
        } else {
          const float kept = beta * m[i];
          const float added = s < 3 ? g[i] : one_minus_d * g[i];
          m[i] = kept + added;
        }
        const float decayed = w[i] * decay;
        const float step = lr * m[i];
        w[i] = decayed - step;
      }
    }
    EXPECT_TRUE(same_bits(read_family(switched, Family::kW, id), w)) << params[id].name;
    EXPECT_TRUE(same_bits(read_family(switched, Family::kM, id), m)) << params[id].name;
  }
}

// A checkpoint carries group 0's dampening: a task built undamped resumes a damped run bit for bit
// (the factor is formed again by the next step, not read from the file).
TEST_P(DampeningTest, CheckpointCarriesDampening) {
  RN_SKIP_IF_UNAVAILABLE(GetParam());
  const std::vector<ParamSpec> params = test_params();
  const std::string path = testing_util::unique_temp_path(std::string("dampening_") + backend_kind_name(GetParam()) + ".ckpt");
  Task whole(params, task_options(GetParam(), false));
  whole.optimizer(damped_config(WeightDecayMode::kL2));
  whole.compile();
  for (size_t id = 0; id < params.size(); ++id) whole.set_weight(id, weights_of(id, params[id].numel()).data());
  run(whole, 0, 2, {}, {});
  whole.save(path);
  run(whole, 2, 5, {}, {});
  const CheckpointInfo info = read_checkpoint_info(path);
  EXPECT_EQ(info.config.dampening, kDampening);

  OptimizerConfig plain = damped_config(WeightDecayMode::kL2);
  plain.dampening = 0.0;
  Task resumed(params, task_options(GetParam(), false));
  resumed.optimizer(plain);
  resumed.compile();
  resumed.load(path);
  EXPECT_EQ(resumed.config().dampening, kDampening);
  run(resumed, 2, 5, {}, {});
  EXPECT_EQ(resumed.fingerprint(), whole.fingerprint());
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Backends, DampeningTest, ::testing::ValuesIn(testing_util::backends_under_test()),
                         [](const ::testing::TestParamInfo<BackendKind>& info) {
                           return std::string(backend_kind_name(info.param));
                         });

TEST(DampeningValidation, TorchsRules) {
  // Nesterov: torch's rule and text.
  try {
    SGD().momentum(0.9).nesterov(true).dampening(0.1).config();
    ADD_FAILURE() << "nesterov with dampening was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Nesterov momentum requires a momentum and zero dampening"), std::string::npos)
        << e.what();
  }
  OptimizerConfig nesterov = SGD().momentum(0.9).nesterov(true).config();
  nesterov.dampening = 0.5;
  EXPECT_THROW(nesterov.validate(), Error);
  // No momentum: accepted and without effect, as torch; any finite value (torch checks no range).
  EXPECT_NO_THROW(SGD().dampening(0.5).config().validate());
  EXPECT_NO_THROW(SGD().momentum(0.9).dampening(-2.0).config().validate());
  EXPECT_NO_THROW(SGD().momentum(0.9).dampening(1.5).config().validate());
  // What float32 cannot hold.
  EXPECT_THROW(SGD().dampening(std::numeric_limits<double>::infinity()), Error);
  EXPECT_THROW(SGD().dampening(std::nan("")), Error);
  EXPECT_THROW(SGD().dampening(1e39), Error);
  // The other kinds refuse it.
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW, OptimizerKind::kLars, OptimizerKind::kLion,
                             OptimizerKind::kLamb}) {
    OptimizerConfig c = default_config(kind);
    c.dampening = 0.1;
    EXPECT_THROW(c.validate(), Error) << optimizer_kind_name(kind);
  }
  EXPECT_EQ(SGD().momentum(0.9).dampening(0.25).config().dampening, 0.25);
  EXPECT_EQ(SGD().config().dampening, 0.0);
}

}  // namespace
}  // namespace renaissance
