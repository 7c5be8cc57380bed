// amsgrad (torch's, kinds adam and adamw: the denominator reads vmax = max(vmax, v), kept in the
// VMAX family), on every backend of the build (CUDA skips without a device):
// - W, M, V and VMAX bit for bit against the independent float32 oracle (tests/support/oracle_f32.h)
//   over a run whose gradients shrink (so vmax > v decides the step), with loss scales, an lr
//   change, a skipped non-finite step, with and without clipping, with and without the tensor mask,
//   two hyperparameter groups, maximize (the oracle fed -G) and a bf16 model copy (masters as the
//   oracle's, the copy their round to nearest even);
// - VMAX exists only with amsgrad, and a plan without it is the plan of a configuration that never
//   heard of it; kinds other than adam and adamw refuse it; the groups of a task cannot differ in it;
// - a checkpoint carries VMAX: a resumed run continues bit for bit, a task of the other setting
//   refuses the file, and a file without amsgrad has no VMAX section (its bytes are those of before).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/math/precision.h"
#include "renaissance/task.h"
#include "support/checkpoint_test_util.h"
#include "support/mask_test_util.h"
#include "support/oracle_f32.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::same_bits;

// Tensors of every role, odd sizes (vector bodies and scalar tails), a scalar and an empty one.
std::vector<ParamSpec> test_params(int groups) {
  std::vector<ParamSpec> p = {
      {"conv1", {7, 3, 5, 5}, Role::kFirstConv}, {"bn1.w", {37}, Role::kBnWeight},
      {"bn1.b", {37}, Role::kBnBias},            {"conv2", {1000}, Role::kDeepConv},
      {"fc.w", {10, 13}, Role::kFcWeight},       {"fc.b", {10}, Role::kFcBias},
      {"bn2.w", {}, Role::kBnWeight},            {"empty", {0}, Role::kDeepConv},
  };
  for (size_t i = 0; i < p.size(); ++i) p[i].hyper_group = static_cast<int>(i) % groups;
  return p;
}

std::vector<std::vector<float>> initial_weights(const std::vector<ParamSpec>& params) {
  std::vector<std::vector<float>> w;
  for (const ParamSpec& p : params) w.push_back(testing_util::lcg_values(testing_util::name_seed(p.name), p.numel(), 0.5f));
  return w;
}

// The gradients of a step: large first, then shrinking, with every other step's sign flipped per
// element, so v falls below its running max after a few steps.
constexpr int kSteps = 8;
constexpr float kAmplitude[kSteps] = {4.0f, 2.0f, 0.25f, 0.5f, 0.05f, 1.0f, 0.01f, 0.2f};
constexpr double kLossScale[kSteps] = {1.0, 1024.0, 3.0, 1.0, 1.0, 0.5, 128.0, 1.0};
constexpr double kLrFactor[kSteps] = {1.0, 1.0, 0.5, 1.0, 1.0, 2.0, 1.0, 0.0};
constexpr int kNonFiniteStep = 3;

std::vector<std::vector<float>> unscaled_grads(const std::vector<ParamSpec>& params, int step) {
  std::vector<std::vector<float>> g;
  for (const ParamSpec& p : params) {
    g.push_back(testing_util::lcg_values(testing_util::name_seed(p.name) + 77u * static_cast<uint32_t>(step + 1),
                                         p.numel(), kAmplitude[step]));
  }
  return g;
}

std::vector<float> read_family(Task& task, Family f, size_t id) {
  std::vector<float> v(static_cast<size_t>(task.param(id).numel()));
  task.read(f, id, v.data());
  return v;
}

struct Case {
  OptimizerKind kind;
  BackendKind backend;
};
void PrintTo(const Case& c, std::ostream* os) { *os << optimizer_kind_name(c.kind) << "/" << backend_kind_name(c.backend); }

std::vector<Case> cases() {
  std::vector<Case> out;
  for (BackendKind b : testing_util::backends_under_test()) {
    for (OptimizerKind k : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) out.push_back({k, b});
  }
  return out;
}

OptimizerConfig amsgrad_config(OptimizerKind kind) {
  OptimizerConfig c = reference_config(kind);
  c.amsgrad = true;
  return c;
}

struct Variant {
  double clip = 0.0;
  bool mask = false;
  int groups = 1;
  bool maximize = false;
  Precision copy = Precision::kFp32;
};
std::string variant_name(const Variant& v) {
  return "clip " + std::to_string(v.clip) + " mask " + std::to_string(v.mask) + " groups " + std::to_string(v.groups) +
         " maximize " + std::to_string(v.maximize) + " copy " + precision_name(v.copy);
}

class AmsgradTest : public ::testing::TestWithParam<Case> {
 protected:
  // Runs the schedule on a task of `variant` and checks W, M, V, VMAX (and the copy) against the
  // float32 oracle after every step.
  void run_against_oracle(const Variant& variant) {
    SCOPED_TRACE(variant_name(variant));
    const std::vector<ParamSpec> params = test_params(variant.groups);
    OptimizerConfig config = amsgrad_config(GetParam().kind);
    config.max_grad_norm = variant.clip;
    config.maximize = variant.maximize;
    TaskOptions options;
    options.backend = GetParam().backend;
    options.backend_options.threads = 2;
    options.tensor_mask = variant.mask;
    options.precision.precision = variant.copy;
    Task task(params, options);
    // Two groups holding the same values: every group's block must read VMAX the same way.
    task.optimizer_groups(std::vector<OptimizerConfig>(static_cast<size_t>(variant.groups), config));
    task.compile();
    ASSERT_TRUE(task.plan().has_family(Family::kVmax));
    const std::vector<std::vector<float>> w0 = initial_weights(params);
    for (size_t id = 0; id < params.size(); ++id) task.set_weight(id, w0[id].data());
    // The oracle minimizes; a maximizing task is fed G and the oracle -G (torch's maximize).
    OptimizerConfig oracle_config = config;
    oracle_config.maximize = false;
    oracle::OracleF32 honest(oracle_config, params, w0);
    for (int s = 0; s < kSteps; ++s) {
      std::vector<std::vector<float>> g = unscaled_grads(params, s);
      for (auto& t : g) {
        for (float& x : t) x = static_cast<float>(static_cast<double>(x) * kLossScale[s]);
      }
      if (s == kNonFiniteStep) g[3][17] = std::numeric_limits<float>::quiet_NaN();
      const double lr = config.lr * kLrFactor[s];
      task.set_lr(lr);
      task.set_loss_scale(kLossScale[s]);
      for (size_t id = 0; id < params.size(); ++id) task.set_grad(id, g[id].data());
      task.step();
      std::vector<std::vector<float>> og = g;
      if (variant.maximize) {
        for (auto& t : og) {
          for (float& x : t) x = -x;
        }
      }
      const bool applied = honest.step(og, lr, kLossScale[s]);
      ASSERT_EQ(task.last_step_skipped(), !applied) << "step " << s;
      for (size_t id = 0; id < params.size(); ++id) {
        const oracle::TensorStateF32& want = honest.tensor(id);
        const std::string where = "step " + std::to_string(s) + " " + params[id].name;
        EXPECT_TRUE(same_bits(read_family(task, Family::kW, id), want.w)) << "W at " << where;
        EXPECT_TRUE(same_bits(read_family(task, Family::kM, id), want.m)) << "M at " << where;
        EXPECT_TRUE(same_bits(read_family(task, Family::kV, id), want.v)) << "V at " << where;
        EXPECT_TRUE(same_bits(read_family(task, Family::kVmax, id), want.vmax)) << "VMAX at " << where;
        if (variant.copy != Precision::kFp32 && !want.w.empty()) {
          std::vector<uint16_t> copy(want.w.size());
          task.read_model_copy(id, copy.data());
          for (size_t k = 0; k < copy.size(); ++k) {
            ASSERT_EQ(copy[k], math::f32_to_half_rne(variant.copy == Precision::kBf16, want.w[k]))
                << "copy at " << where << " element " << k;
          }
        }
      }
    }
    // The run must have exercised the maximum: somewhere v ended below vmax.
    bool below = false;
    for (size_t id = 0; id < params.size(); ++id) {
      const oracle::TensorStateF32& t = honest.tensor(id);
      for (size_t k = 0; k < t.v.size(); ++k) below = below || t.v[k] < t.vmax[k];
    }
    EXPECT_TRUE(below) << "the schedule never let v fall below its running maximum";
  }
};

TEST_P(AmsgradTest, MatchesTheFloat32OracleBitForBit) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  run_against_oracle({});
  run_against_oracle({3.0, false, 1, false, Precision::kFp32});
}

TEST_P(AmsgradTest, ComposesWithMaskGroupsMaximizeAndModelCopy) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  run_against_oracle({0.0, true, 1, false, Precision::kFp32});
  run_against_oracle({0.0, false, 2, false, Precision::kFp32});
  run_against_oracle({2.0, false, 1, true, Precision::kFp32});
  run_against_oracle({0.0, false, 1, false, Precision::kBf16});
  run_against_oracle({3.0, true, 2, true, Precision::kBf16});
}

// The oracle itself must tell amsgrad apart: the same run without it ends elsewhere.
TEST_P(AmsgradTest, AmsgradChangesTheRun) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  const std::vector<ParamSpec> params = test_params(1);
  std::vector<std::string> fingerprints;
  for (bool amsgrad : {false, true}) {
    OptimizerConfig config = reference_config(GetParam().kind);
    config.amsgrad = amsgrad;
    TaskOptions options;
    options.backend = GetParam().backend;
    Task task(params, options);
    task.optimizer(config);
    task.compile();
    EXPECT_EQ(task.plan().has_family(Family::kVmax), amsgrad);
    const auto w0 = initial_weights(params);
    for (size_t id = 0; id < params.size(); ++id) task.set_weight(id, w0[id].data());
    for (int s = 0; s < kSteps; ++s) {
      const auto g = unscaled_grads(params, s);
      for (size_t id = 0; id < params.size(); ++id) task.set_grad(id, g[id].data());
      task.step();
    }
    fingerprints.push_back(task.fingerprint({0, 1, 3}));
  }
  EXPECT_NE(fingerprints[0], fingerprints[1]);
}

std::string temp_path(const std::string& name) { return testing_util::unique_temp_path("amsgrad_" + name + ".rnck"); }

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST_P(AmsgradTest, CheckpointCarriesVmax) {
  RN_SKIP_IF_UNAVAILABLE(GetParam().backend);
  const std::vector<ParamSpec> params = test_params(1);
  const auto w0 = initial_weights(params);
  TaskOptions options;
  options.backend = GetParam().backend;
  auto make = [&](bool amsgrad) {
    auto task = std::make_unique<Task>(params, options);
    OptimizerConfig config = reference_config(GetParam().kind);
    config.amsgrad = amsgrad;
    task->optimizer(config);
    task->compile();
    for (size_t id = 0; id < params.size(); ++id) task->set_weight(id, w0[id].data());
    return task;
  };
  auto feed = [&](Task& task, int s) {
    const auto g = unscaled_grads(params, s);
    for (size_t id = 0; id < params.size(); ++id) task.set_grad(id, g[id].data());
    task.step();
  };
  const std::string path = temp_path(std::string(optimizer_kind_name(GetParam().kind)) + "_" +
                                     backend_kind_name(GetParam().backend));
  auto straight = make(true);
  for (int s = 0; s < kSteps; ++s) feed(*straight, s);

  auto first = make(true);
  for (int s = 0; s < kSteps / 2; ++s) feed(*first, s);
  first->save(path);
  const std::string bytes = file_bytes(path);
  EXPECT_NE(bytes.find("FAMX"), std::string::npos) << "an amsgrad checkpoint holds the VMAX section";
  EXPECT_LT(bytes.find("FAMV"), bytes.find("FAMX")) << "VMAX comes right after V";
  EXPECT_LT(bytes.find("FAMX"), bytes.find("SCAL")) << "VMAX comes before the scalars";
  EXPECT_TRUE(read_checkpoint_info(path).config.amsgrad);
  auto resumed = make(true);
  resumed->load(path);
  for (size_t id = 0; id < params.size(); ++id) {
    EXPECT_TRUE(same_bits(read_family(*resumed, Family::kVmax, id), read_family(*first, Family::kVmax, id)))
        << params[id].name;
  }
  for (int s = kSteps / 2; s < kSteps; ++s) feed(*resumed, s);
  EXPECT_EQ(resumed->fingerprint(), straight->fingerprint());

  // The other setting refuses the file, naming amsgrad; and an amsgrad task refuses a plain file.
  auto plain = make(false);
  checkpoint_test::expect_error([&] { plain->load(path); }, "checkpoint was made with amsgrad, task runs without it",
                                ErrorKind::kInvalidArgument);
  plain->save(path);
  EXPECT_EQ(file_bytes(path).find("FAMX"), std::string::npos) << "a file without amsgrad has no VMAX section";
  checkpoint_test::expect_error([&] { resumed->load(path); }, "checkpoint was made without amsgrad, task runs with it",
                                ErrorKind::kInvalidArgument);
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Kinds, AmsgradTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(optimizer_kind_name(info.param.kind)) + "_" +
                                  backend_kind_name(info.param.backend);
                         });

// Only adam and adamw take amsgrad: every other kind refuses it, naming both.
TEST(Amsgrad, OtherKindsRefuseIt) {
  for (const KindInfo& info : kKindTable) {
    OptimizerConfig c = reference_config(info.kind);
    c.amsgrad = true;
    if (info.kind == OptimizerKind::kAdam || info.kind == OptimizerKind::kAdamW) {
      EXPECT_NO_THROW(c.validate()) << info.name;
      continue;
    }
    try {
      c.validate();
      ADD_FAILURE() << info.name << " accepted amsgrad";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string(info.name) + " does not take amsgrad (on given; the kinds that do: adam, adamw)");
    }
  }
  EXPECT_TRUE(Adam().amsgrad(true).config().amsgrad);
  EXPECT_TRUE(AdamW().amsgrad(true).config().amsgrad);
  const HyperparameterInfo* row = find_hyperparameter("amsgrad");
  ASSERT_NE(row, nullptr);
  EXPECT_TRUE(row->task_wide);
  EXPECT_FALSE(kind_reads(OptimizerKind::kLamb, *row));
  EXPECT_TRUE(kind_reads(OptimizerKind::kAdamW, *row));
}

// Without amsgrad the plan is the plan of before (no VMAX, same regions and arena); with it VMAX
// follows V with V's layout.
TEST(Amsgrad, PlanHasVmaxOnlyWithAmsgrad) {
  const std::vector<ParamSpec> params = test_params(1);
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    OptimizerConfig c = reference_config(kind);
    const MemoryPlan before(params, plan_config_from_optimizer(kind));
    const MemoryPlan off(params, plan_config_from_optimizer(c));
    EXPECT_EQ(off.describe(), before.describe());
    EXPECT_EQ(off.arena_bytes(), before.arena_bytes());
    EXPECT_FALSE(off.has_family(Family::kVmax));
    c.amsgrad = true;
    const MemoryPlan on(params, plan_config_from_optimizer(c));
    ASSERT_TRUE(on.has_family(Family::kVmax));
    EXPECT_EQ(on.region(VMAX_BN_BIAS).offset, on.region(V_DEEP_CONV).offset + on.region(V_DEEP_CONV).count * 4);
    for (size_t id = 0; id < params.size(); ++id) {
      EXPECT_EQ(on.tensor_offset(Family::kVmax, id) - on.region(VMAX_BN_BIAS).offset,
                on.tensor_offset(Family::kV, id) - on.region(V_BN_BIAS).offset);
    }
  }
}

// amsgrad is task-wide: the groups of one task hold the same value.
TEST(Amsgrad, GroupsCannotDiffer) {
  const std::vector<ParamSpec> params = test_params(2);
  OptimizerConfig a = reference_config(OptimizerKind::kAdamW);
  OptimizerConfig b = a;
  b.amsgrad = true;
  Task task(params);
  EXPECT_THROW(task.optimizer_groups({a, b}), Error);
}

// A rank's state shard holds VMAX's slice exactly as V's (the family table marks VMAX optimizer
// state): the same elements of every role region, so the sharded step cuts and gathers it as V
// (tests/comm/sharded_runs.cc: sharded amsgrad runs == one process, bit for bit).
TEST(Amsgrad, AStateShardSlicesVmaxAsV) {
  for (int rank = 0; rank < 2; ++rank) {
    TaskOptions options;
    options.backend = BackendKind::kCpu;
    options.state_shard.world_size = 2;
    options.state_shard.rank = rank;
    Task task(checkpoint_test::big_params(), options);  // large enough for two slices
    task.optimizer(AdamW().amsgrad(true));
    task.compile();
    const MemoryPlan& plan = task.plan();
    ASSERT_TRUE(plan.state_sliced()) << rank;
    ASSERT_TRUE(plan.has_family(Family::kVmax)) << rank;
    for (int r = 0; r < kNumRoles; ++r) {
      const RegionInfo& v = plan.region(family_region(Family::kV, static_cast<Role>(r)));
      const RegionInfo& x = plan.region(family_region(Family::kVmax, static_cast<Role>(r)));
      EXPECT_EQ(x.count, v.count) << rank << " role " << r;
      EXPECT_EQ(x.used, v.used) << rank << " role " << r;
      // Both start at the slice's first element: their offsets are as far from the family's
      // base as V's.
      EXPECT_EQ(x.offset - plan.region(family_region(Family::kVmax, Role::kBnBias)).offset,
                v.offset - plan.region(family_region(Family::kV, Role::kBnBias)).offset) << rank << " role " << r;
    }
  }
}

// CPU and CUDA in lockstep on the same inputs: the fingerprint (W, M, V, VMAX, the copy and the
// step count) equal after every step, for adam and adamw, fp32 and a bf16 copy, with the mask,
// two groups, clipping and maximize. Skips without a CUDA device.
TEST(AmsgradCuda, MatchesCpuBitForBit) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  const Variant variants[] = {{}, {3.0, true, 2, true, Precision::kFp32}, {0.0, false, 1, false, Precision::kBf16},
                              {2.0, true, 2, false, Precision::kBf16}};
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    for (const Variant& variant : variants) {
      SCOPED_TRACE(std::string(optimizer_kind_name(kind)) + " " + variant_name(variant));
      const std::vector<ParamSpec> params = test_params(variant.groups);
      OptimizerConfig config = amsgrad_config(kind);
      config.max_grad_norm = variant.clip;
      config.maximize = variant.maximize;
      std::vector<std::unique_ptr<Task>> tasks;
      for (BackendKind backend : {BackendKind::kCpu, BackendKind::kCuda}) {
        TaskOptions options;
        options.backend = backend;
        options.tensor_mask = variant.mask;
        options.precision.precision = variant.copy;
        tasks.push_back(std::make_unique<Task>(params, options));
        tasks.back()->optimizer_groups(std::vector<OptimizerConfig>(static_cast<size_t>(variant.groups), config));
        tasks.back()->compile();
        const auto w0 = initial_weights(params);
        for (size_t id = 0; id < params.size(); ++id) tasks.back()->set_weight(id, w0[id].data());
      }
      for (int s = 0; s < kSteps; ++s) {
        std::vector<std::vector<float>> g = unscaled_grads(params, s);
        for (auto& t : g) {
          for (float& x : t) x = static_cast<float>(static_cast<double>(x) * kLossScale[s]);
        }
        if (s == kNonFiniteStep) g[3][17] = std::numeric_limits<float>::infinity();
        for (auto& task : tasks) {
          task->set_lr(config.lr * kLrFactor[s]);
          task->set_loss_scale(kLossScale[s]);
          for (size_t id = 0; id < params.size(); ++id) task->set_grad(id, g[id].data());
          task->step();
        }
        ASSERT_EQ(tasks[0]->fingerprint(), tasks[1]->fingerprint()) << "step " << s;
      }
      for (size_t id = 0; id < params.size(); ++id) {
        EXPECT_TRUE(same_bits(read_family(*tasks[0], Family::kVmax, id), read_family(*tasks[1], Family::kVmax, id)))
            << params[id].name;
      }
    }
  }
}

}  // namespace
}  // namespace renaissance
