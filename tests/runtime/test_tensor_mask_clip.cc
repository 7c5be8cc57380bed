// The per-tensor mask (TaskOptions::tensor_mask) with gradient-norm clipping, for every kind, in
// fp32 and in bf16 (model copy and bf16 G), on every backend of the build (CUDA skips without a
// device). The oracle is what renaissance.torch's fallback does: the SAME mask-enabled layout with
// no tensor masked, the masked tensors' G zeroed, and their W, M, V (and so the copy, rounded to
// nearest from W) and per-tensor counts put back after the step. The masked task must give the
// same bits (W, M, V, copy, grad norm, counts) while its masked tensors' stale G holds NaN or
// large values: the clip norm and the non-finite check read a masked tensor as +0.0. The
// patterns include a step before any mask (the clear program, also compared with a task without
// the flag), a masked tensor that straddles grad-norm tiles, and a step with everything masked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/math/norm_reduction.h"
#include "renaissance/task.h"
#include "support/mask_test_util.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {


// Both groups; "big" and "fc" span several grad-norm tiles (kGradNormTile elements) and start
// inside one; sizes off the 64-element padding; a scalar.
std::vector<ParamSpec> clip_params() {
  return {
      {"bn1.b", {37}, Role::kBnBias},      {"conv1", {7, 3, 5, 5}, Role::kFirstConv}, {"bn1.w", {37}, Role::kBnWeight},
      {"big", {40000}, Role::kDeepConv},   {"fc.b", {10}, Role::kFcBias},             {"fc", {100, 300}, Role::kFcWeight},
      {"bn2.w", {}, Role::kBnWeight},      {"conv2", {9000}, Role::kDeepConv},
  };
}
constexpr size_t kBig = 3;

// Step 0 masks nothing (the clear program); then the straddling tensor alone, every other
// tensor, everything, the others, nothing (counts now differ: the masked program), two large ones.
bool masked(size_t id, int step) {
  switch (step) {
    case 1: return id == kBig;
    case 2: return id % 2 == 0;
    case 3: return true;
    case 4: return id % 2 == 1;
    case 6: return id == kBig || id == 5;
    default: return false;
  }
}
constexpr int kSteps = 7;

using testing_util::name_seed;
std::vector<float> weights_of(const ParamSpec& p) { return testing_util::named_weights(p); }
std::vector<float> grads_of(const ParamSpec& p, int step) { return testing_util::named_grads(p, step); }

using ClipCase = testing_util::KindPrecisionCase;

OptimizerConfig clipped(const ClipCase& c) {
  OptimizerConfig config = c.kind.config;
  config.max_grad_norm = 1.0;  // far under the gradients' norm: the coefficient is < 1
  return config;
}
std::unique_ptr<Task> make_task(const ClipCase& c, bool mask) {
  auto task = std::make_unique<Task>(clip_params(), testing_util::kind_precision_options(c, mask));
  task->optimizer(clipped(c));
  task->compile();
  task->set_loss_scale(4.0);
  for (size_t id = 0; id < task->num_params(); ++id) task->set_weight(id, weights_of(task->param(id)).data());
  return task;
}

using Snapshot = testing_util::TensorSnapshot;
Snapshot snapshot(Task& task, size_t id) { return testing_util::snapshot_tensor(task, id); }
::testing::AssertionResult same(const Snapshot& a, const Snapshot& b) { return testing_util::same_snapshot(a, b); }
// W, then M and V where the kind has them: what the fallback writes back (W's write refreshes
// the copy by nearest rounding, which is how the copy was made).
void restore(Task& task, size_t id, const Snapshot& s) {
  size_t k = 0;
  for (Family f : testing_util::kSnapshotFamilies) {
    if (!task.plan().has_family(f)) continue;
    task.write(f, id, s.families[k++].data());
  }
}
uint64_t bits(double x) {
  uint64_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// A stale gradient neither the check nor the norm may look at: at even steps NaN in every element
// (fp32, or the bf16 encoding; a look skips the step), at odd steps large finite values (a
// look moves the norm).
void write_stale(Task& task, size_t id, int step) {
  const size_t n = static_cast<size_t>(task.param(id).numel());
  if (step % 2 == 1) {
    task.set_grad(id, testing_util::lcg_values(name_seed(task.param(id).name) + 7u, static_cast<int64_t>(n), 64.0f).data());
  } else if (task.grad_dtype() == Precision::kFp32) {
    task.set_grad(id, std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()).data());
  } else {
    task.write_grad_encoded(id, std::vector<uint16_t>(n, 0x7fc0).data());
  }
}

class TensorMaskClipTest : public ::testing::TestWithParam<ClipCase> {};

TEST_P(TensorMaskClipTest, MaskedStepIsTheZeroedAndRestoredStep) {
  const ClipCase c = GetParam();
  RN_SKIP_IF_UNAVAILABLE(c.backend);
  const std::vector<ParamSpec> params = clip_params();
  auto task = make_task(c, true);
  auto oracle = make_task(c, true);
  auto flagless = make_task(c, false);
  // The layout really has a tensor across a tile boundary, masked at step 1.
  const Span g_span = task->plan().region_range(G_BN_BIAS, G_DEEP_CONV);
  const uint64_t element_bytes = task->grad_dtype() == Precision::kFp32 ? 4 : 2;
  const uint64_t big_first = (task->plan().tensor_offset(Family::kG, kBig) - g_span.offset) / element_bytes;
  const uint64_t big_last = big_first + static_cast<uint64_t>(params[kBig].numel()) - 1;
  ASSERT_NE(big_first / math::kGradNormTile, big_last / math::kGradNormTile);
  ASSERT_NE(big_first % math::kGradNormTile, 0u);

  std::vector<int64_t> taken(params.size(), 0);
  bool clipping_seen = false;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int32_t> mask(params.size());
    std::vector<Snapshot> before(params.size());
    const std::vector<int64_t> counts_before = oracle->tensor_steps();
    for (size_t id = 0; id < params.size(); ++id) {
      mask[id] = masked(id, step) ? 1 : 0;
      const std::vector<float> g = grads_of(params[id], step);
      if (mask[id]) {
        write_stale(*task, id, step);
        oracle->set_grad(id, std::vector<float>(g.size(), 0.0f).data());
        before[id] = snapshot(*oracle, id);
      } else {
        task->set_grad(id, g.data());
        oracle->set_grad(id, g.data());
        ++taken[id];
      }
    }
    task->set_tensor_mask(mask);
    // Step 0 runs the clear program (compile_unmasked_step), every later one the masked program.
    EXPECT_EQ(task->masked_program_next(), step > 0) << "step " << step;
    task->step();
    ASSERT_FALSE(task->last_step_skipped()) << "step " << step << ": a masked tensor's NaN was looked at";
    oracle->step();
    ASSERT_FALSE(oracle->last_step_skipped());
    std::vector<int64_t> counts = oracle->tensor_steps();
    for (size_t id = 0; id < params.size(); ++id) {
      if (!mask[id]) continue;
      restore(*oracle, id, before[id]);
      counts[id] = counts_before[id];
    }
    oracle->set_tensor_steps(counts);

    EXPECT_EQ(bits(task->last_grad_norm()), bits(oracle->last_grad_norm()))
        << "step " << step << ": " << task->last_grad_norm() << " vs " << oracle->last_grad_norm();
    if (step == 0) {
      // The clear program: the bits of the same step without the flag.
      for (size_t id = 0; id < params.size(); ++id) flagless->set_grad(id, grads_of(params[id], 0).data());
      flagless->step();
      EXPECT_EQ(bits(task->last_grad_norm()), bits(flagless->last_grad_norm()));
      for (size_t id = 0; id < params.size(); ++id) {
        EXPECT_TRUE(same(snapshot(*task, id), snapshot(*flagless, id))) << params[id].name << " vs the flagless task";
      }
    }
    clipping_seen = clipping_seen || task->last_grad_norm() > 1.0;
    for (size_t id = 0; id < params.size(); ++id) {
      if (mask[id]) {
        EXPECT_TRUE(same(snapshot(*task, id), before[id])) << params[id].name << " changed at step " << step;
      }
      EXPECT_TRUE(same(snapshot(*task, id), snapshot(*oracle, id))) << params[id].name << " at step " << step;
    }
    EXPECT_EQ(task->tensor_steps(), taken) << "step " << step;
    EXPECT_EQ(oracle->tensor_steps(), taken) << "step " << step;
  }
  EXPECT_TRUE(clipping_seen);
  EXPECT_EQ(task->step_count(), kSteps);
}

// With clipping, a non-finite value in an unmasked tensor still skips the whole step (and no
// count moves), while the same value in a masked tensor does not.
TEST_P(TensorMaskClipTest, NonFiniteInAnUnmaskedTensorStillSkipsTheStep) {
  const ClipCase c = GetParam();
  RN_SKIP_IF_UNAVAILABLE(c.backend);
  const std::vector<ParamSpec> params = clip_params();
  auto task = make_task(c, true);
  for (size_t id = 0; id < params.size(); ++id) task->set_grad(id, grads_of(params[id], 0).data());
  task->poison_gradient(kBig, 39999, std::numeric_limits<float>::infinity());
  std::vector<int32_t> mask(params.size(), 0);
  mask[1] = 1;
  task->set_tensor_mask(mask);
  const std::string before = task->fingerprint();
  task->step();
  EXPECT_TRUE(task->last_step_skipped());
  EXPECT_EQ(task->fingerprint(), before);
  EXPECT_EQ(task->tensor_steps(), std::vector<int64_t>(params.size(), 0));
  mask[kBig] = 1;
  task->set_tensor_mask(mask);
  task->step();
  EXPECT_FALSE(task->last_step_skipped());
  std::vector<int64_t> expected(params.size(), 1);
  expected[1] = expected[kBig] = 0;
  EXPECT_EQ(task->tensor_steps(), expected);
}

INSTANTIATE_TEST_SUITE_P(Kinds, TensorMaskClipTest, ::testing::ValuesIn(testing_util::kind_precision_cases({Precision::kFp32, Precision::kBf16})),
                         testing_util::kind_precision_case_name);

}  // namespace
}  // namespace renaissance
