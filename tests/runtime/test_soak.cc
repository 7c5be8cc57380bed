// Soak test: 2000 steps with the learning rate changed every step, a NaN gradient
// every 7 steps and a checkpoint (save, then load into a fresh Task that carries on) every 100
// steps. The result must have the same bits as the same run without checkpoints, and stay within
// 1e-4 relative L2 of a float64 reference. Run under scripts/sanitize.sh it also shows that
// 2000 steps and 40 save/load cycles leak nothing (LeakSanitizer).
//
// The float64 reference below is written from docs/math.md for the two kinds the soak runs
// (AdamW and SGD with momentum, decoupled decay), independently of math/update_rules.inc.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/task.h"
#include "support/test_util.h"
#include "support/kind_columns.h"

namespace renaissance {
namespace {

constexpr int64_t kSteps = 2000;
constexpr int64_t kNanEvery = 7;
constexpr int64_t kCheckpointEvery = 100;
constexpr double kLossScale = 128.0;  // a power of two, as AMP uses
constexpr uint64_t kSeed = 2024;

// A few thousand parameters over every role, so 2000 steps take well under a second.
std::vector<ParamSpec> soak_params() {
  return {{"stem.weight", {32, 3, 3, 3}, Role::kFirstConv}, {"stem.bn.weight", {32}, Role::kBnWeight},
          {"stem.bn.bias", {32}, Role::kBnBias},            {"block.weight", {32, 32, 3}, Role::kDeepConv},
          {"head.weight", {10, 64}, Role::kFcWeight},       {"head.bias", {10}, Role::kFcBias}};
}

OptimizerConfig soak_config(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = kind == OptimizerKind::kAdamW ? 2e-3 : 0.02;
  c.weight_decay = 0.05;
  c.momentum = 0.9;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  return testing_util::unread_columns_at_defaults(c);
}

double lr_at(const OptimizerConfig& c, int64_t step) {
  return c.lr * (0.55 + 0.45 * std::cos(0.013 * double(step)) + 1e-3 * double(step % 5));
}

std::unique_ptr<Task> fresh_task(OptimizerKind kind) {
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  auto task = std::make_unique<Task>(soak_params(), options);
  task->optimizer(soak_config(kind));
  task->compile();
  return task;
}

std::vector<std::vector<float>> initial_weights() {
  std::vector<std::vector<float>> w;
  for (const ParamSpec& p : soak_params()) {
    std::vector<float> t(static_cast<size_t>(p.numel()));
    for (size_t i = 0; i < t.size(); ++i) t[i] = 0.2f * std::sin(0.91f * float(i) + float(w.size()));
    w.push_back(std::move(t));
  }
  return w;
}

// ---- float64 reference (docs/math.md) ----
struct Reference {
  OptimizerConfig c;
  std::vector<bool> weight_group;
  std::vector<std::vector<double>> w, m, v;
  int64_t t = 0;  // applied steps

  Reference(const OptimizerConfig& config, const std::vector<std::vector<float>>& w0) : c(config) {
    for (size_t k = 0; k < w0.size(); ++k) {
      weight_group.push_back(group_of(soak_params()[k].role) == Group::kWeight);
      w.emplace_back(w0[k].begin(), w0[k].end());
      m.emplace_back(w0[k].size(), 0.0);
      v.emplace_back(w0[k].size(), 0.0);
    }
  }

  // grads as the backward pass stored them (times the loss scale); skipped when any is not finite.
  void step(const std::vector<std::vector<float>>& grads, double lr) {
    for (const auto& g : grads) {
      for (float x : g) {
        if (!std::isfinite(x)) return;
      }
    }
    ++t;
    const double bc1 = 1.0 / (1.0 - std::pow(c.beta1, double(t)));
    const double bc2 = 1.0 / (1.0 - std::pow(c.beta2, double(t)));
    for (size_t k = 0; k < w.size(); ++k) {
      const double wd = weight_group[k] ? c.weight_decay : 0.0;  // bias-like: never decayed
      for (size_t i = 0; i < w[k].size(); ++i) {
        const double g = double(grads[k][i]) / kLossScale;
        double& wi = w[k][i];
        double& mi = m[k][i];
        if (c.kind == OptimizerKind::kAdamW) {
          wi = wi * (1.0 - lr * wd);
          mi = c.beta1 * mi + (1.0 - c.beta1) * g;
          v[k][i] = c.beta2 * v[k][i] + (1.0 - c.beta2) * g * g;
          wi = wi - lr * (mi * bc1) / (std::sqrt(v[k][i] * bc2) + c.eps);
        } else {  // sgd_momentum, decoupled
          mi = c.momentum * mi + g;
          wi = wi * (1.0 - lr * wd) - lr * mi;
        }
      }
    }
  }
};

double relative_l2(Task& task, Family f, const std::vector<std::vector<double>>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t k = 0; k < ref.size(); ++k) {
    std::vector<float> got(ref[k].size());
    task.read(f, k, got.data());
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = double(got[i]) - ref[k][i];
      diff += d * d;
      norm += ref[k][i] * ref[k][i];
    }
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

// A struct with operator<< so that ctest lists the parameter by name.
struct KindParam {
  OptimizerKind kind;
};
std::ostream& operator<<(std::ostream& os, const KindParam& p) { return os << optimizer_kind_name(p.kind); }

class Soak : public ::testing::TestWithParam<KindParam> {};

TEST_P(Soak, CheckpointedRunMatchesStraightRunAndFloat64Reference) {
  const OptimizerKind kind = GetParam().kind;
  const OptimizerConfig config = soak_config(kind);
  const auto w0 = initial_weights();

  char dir_template[] = "/tmp/rn-soak-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string path = dir + "/soak.ckpt";

  auto start = [&] {
    auto task = fresh_task(kind);
    for (size_t k = 0; k < w0.size(); ++k) task->set_weight(k, w0[k].data());
    task->set_loss_scale(kLossScale);
    return task;
  };
  auto straight = start();
  auto resumed = start();
  Reference reference(config, w0);

  int checkpoints = 0;
  std::vector<std::vector<float>> grads(w0.size());
  for (int64_t s = 0; s < kSteps; ++s) {
    const double lr = lr_at(config, s);
    for (Task* task : {straight.get(), resumed.get()}) {
      task->set_lr(lr);
      task->synthesize_gradients(kSeed, static_cast<uint64_t>(s), static_cast<float>(0.05 * kLossScale));
    }
    for (size_t k = 0; k < grads.size(); ++k) {
      grads[k].resize(w0[k].size());
      straight->read(Family::kG, k, grads[k].data());
    }
    if (s % kNanEvery == kNanEvery - 1) {
      // A NaN in a different tensor and element each time, in both runs.
      const size_t k = static_cast<size_t>(s / kNanEvery) % grads.size();
      grads[k][static_cast<size_t>(s) % grads[k].size()] = std::nanf("");
      straight->set_grad(k, grads[k].data());
      resumed->set_grad(k, grads[k].data());
    }
    straight->step();
    resumed->step();
    reference.step(grads, lr);

    if ((s + 1) % kCheckpointEvery == 0) {
      resumed->save(path);
      auto next = fresh_task(kind);  // starts from zero weights, default scale: all from the file
      next->load(path);
      resumed = std::move(next);
      ++checkpoints;
    }
  }
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());

  const int64_t skipped = kSteps / kNanEvery;
  EXPECT_EQ(checkpoints, kSteps / kCheckpointEvery);
  EXPECT_EQ(straight->step_count(), kSteps - skipped);
  EXPECT_EQ(straight->skipped_steps(), skipped);
  EXPECT_EQ(reference.t, kSteps - skipped);

  // Identical bits with and without the checkpoints.
  for (Family f : {Family::kW, Family::kM, Family::kV}) {
    if (!straight->plan().has_family(f)) continue;
    for (size_t k = 0; k < w0.size(); ++k) {
      std::vector<float> a(w0[k].size()), b(w0[k].size());
      straight->read(f, k, a.data());
      resumed->read(f, k, b.data());
      EXPECT_TRUE(testing_util::same_bits(a, b)) << family_name(f) << " of " << soak_params()[k].name;
    }
  }
  EXPECT_EQ(straight->fingerprint(), resumed->fingerprint());
  EXPECT_EQ(resumed->step_count(), straight->step_count());
  EXPECT_EQ(resumed->skipped_steps(), straight->skipped_steps());

  // Close to float64 (relative L2 over the whole family).
  const double err_w = relative_l2(*resumed, Family::kW, reference.w);
  const double err_m = relative_l2(*resumed, Family::kM, reference.m);
  const double err_v = kind == OptimizerKind::kAdamW ? relative_l2(*resumed, Family::kV, reference.v) : 0.0;
  std::printf("[          ] %s: %d checkpoints, %lld skipped steps, relative L2 vs float64: W %.3g, M %.3g, V %.3g\n",
              optimizer_kind_name(kind), checkpoints, static_cast<long long>(skipped), err_w, err_m, err_v);
  EXPECT_LT(err_w, 1e-4);
  EXPECT_LT(err_m, 1e-4);
  EXPECT_LT(err_v, 1e-4);
  // The run must have moved the weights well beyond the tolerance, or the comparison says little.
  double moved = 0.0, norm0 = 0.0;
  for (size_t k = 0; k < w0.size(); ++k) {
    for (size_t i = 0; i < w0[k].size(); ++i) {
      moved += (reference.w[k][i] - w0[k][i]) * (reference.w[k][i] - w0[k][i]);
      norm0 += double(w0[k][i]) * w0[k][i];
    }
  }
  EXPECT_GT(std::sqrt(moved / norm0), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Kinds, Soak,
                         ::testing::Values(KindParam{OptimizerKind::kAdamW}, KindParam{OptimizerKind::kSgdMomentum}),
                         [](const ::testing::TestParamInfo<KindParam>& i) {
                           return std::string(optimizer_kind_name(i.param.kind));
                         });

}  // namespace
}  // namespace renaissance
