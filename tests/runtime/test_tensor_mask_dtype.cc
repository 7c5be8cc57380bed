// The per-tensor mask (TaskOptions::tensor_mask) with gradients in the model dtype
// (PrecisionOptions::model_dtype_gradients, bf16 and fp16 G), for every kind and backend of the
// build (CUDA skips without a device). Over a mask pattern that varies per step, with a NaN
// encoding in every masked tensor's G (the check must not look at it):
// - a masked tensor keeps its master, M, V and model copy bit for bit through the step;
// - each tensor ends with the bits (W, M, V, copy) and count of a one-tensor task without the
//   flag, same precision, that took only the steps where the tensor was unmasked. The expected
//   values come from those independent tasks, never from the masked task.
// Nearest rounding for the copy: the one-tensor tasks then need no shared rounding key.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/task.h"
#include "support/mask_test_util.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::kind_precision_options;

// Both groups, a tensor over several work items, a scalar, sizes off the 64-element padding.
std::vector<ParamSpec> dtype_params() {
  return {
      {"conv1", {7, 3, 5, 5}, Role::kFirstConv}, {"bn1.w", {37}, Role::kBnWeight}, {"bn1.b", {37}, Role::kBnBias},
      {"conv2", {9000}, Role::kDeepConv},        {"fc.b", {10}, Role::kFcBias},    {"bn2.w", {}, Role::kBnWeight},
  };
}

// Every tensor masked at some steps and unmasked at others; step 3 masks everything.
bool masked(size_t id, int step) { return step == 3 || (id * 3 + static_cast<size_t>(step)) % 3 == 0; }
constexpr int kSteps = 5;

std::vector<float> weights_of(const ParamSpec& p) { return testing_util::named_weights(p); }
std::vector<float> grads_of(const ParamSpec& p, int step) { return testing_util::named_grads(p, step); }

using DtypeCase = testing_util::KindPrecisionCase;


using Snapshot = testing_util::TensorSnapshot;
Snapshot snapshot(Task& task, size_t id) { return testing_util::snapshot_tensor(task, id); }
bool same(const Snapshot& a, const Snapshot& b) { return testing_util::same_snapshot(a, b); }

class TensorMaskDtypeTest : public ::testing::TestWithParam<DtypeCase> {
 protected:
  // A compiled task of dtype_params() under the case, its mask on; the fixture keeps it.
  Task& masked_task() {
    task_ = std::make_unique<Task>(dtype_params(), kind_precision_options(GetParam(), true));
    task_->optimizer(GetParam().kind.config);
    task_->compile();
    return *task_;
  }
  std::unique_ptr<Task> task_;
};

TEST_P(TensorMaskDtypeTest, MaskedTensorsKeepTheirBitsAndOthersMatchOneTensorTasks) {
  const DtypeCase c = GetParam();
  RN_SKIP_IF_UNAVAILABLE(c.backend);
  const std::vector<ParamSpec> params = dtype_params();
  Task& task = masked_task();
  task.set_loss_scale(4.0);
  std::vector<std::unique_ptr<Task>> alone;
  for (size_t id = 0; id < params.size(); ++id) {
    task.set_weight(id, weights_of(params[id]).data());
    alone.push_back(std::make_unique<Task>(std::vector<ParamSpec>{params[id]}, kind_precision_options(c, false)));
    alone[id]->optimizer(c.kind.config);
    alone[id]->compile();
    alone[id]->set_loss_scale(4.0);
    alone[id]->set_weight(0, weights_of(params[id]).data());
  }
  // A quiet NaN in the model dtype's encoding.
  const uint16_t nan = c.precision == Precision::kBf16 ? 0x7fc0 : 0x7e00;
  std::vector<int64_t> taken(params.size(), 0);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int32_t> mask(params.size());
    std::vector<Snapshot> before(params.size());
    for (size_t id = 0; id < params.size(); ++id) {
      mask[id] = masked(id, step) ? 1 : 0;
      if (mask[id]) {
        task.write_grad_encoded(id, std::vector<uint16_t>(static_cast<size_t>(params[id].numel()), nan).data());
        before[id] = snapshot(task, id);
      } else {
        task.set_grad(id, grads_of(params[id], step).data());
        alone[id]->set_grad(0, grads_of(params[id], step).data());
        alone[id]->step();
        ++taken[id];
      }
    }
    task.set_tensor_mask(mask);
    task.step();
    ASSERT_FALSE(task.last_step_skipped()) << "step " << step;
    for (size_t id = 0; id < params.size(); ++id) {
      if (!mask[id]) continue;
      EXPECT_TRUE(same(snapshot(task, id), before[id])) << params[id].name << " changed at step " << step;
    }
  }
  EXPECT_EQ(task.tensor_steps(), taken);
  for (size_t id = 0; id < params.size(); ++id) {
    EXPECT_EQ(alone[id]->step_count(), taken[id]);
    EXPECT_TRUE(same(snapshot(task, id), snapshot(*alone[id], 0))) << params[id].name << " after " << taken[id] << " steps";
  }
}

// A NaN encoding in an unmasked tensor still skips the whole step.
TEST_P(TensorMaskDtypeTest, NonFiniteInAnUnmaskedTensorStillSkipsTheStep) {
  const DtypeCase c = GetParam();
  RN_SKIP_IF_UNAVAILABLE(c.backend);
  const std::vector<ParamSpec> params = dtype_params();
  Task& task = masked_task();
  for (size_t id = 0; id < params.size(); ++id) task.set_grad(id, grads_of(params[id], 0).data());
  std::vector<uint16_t> g(static_cast<size_t>(params[3].numel()));
  task.read_grad_encoded(3, g.data());
  g[8999] = c.precision == Precision::kBf16 ? 0x7f80 : 0x7c00;  // +Inf
  task.write_grad_encoded(3, g.data());
  std::vector<int32_t> mask(params.size(), 0);
  mask[1] = 1;
  task.set_tensor_mask(mask);
  const std::string before = task.fingerprint();
  task.step();
  EXPECT_TRUE(task.last_step_skipped());
  EXPECT_EQ(task.fingerprint(), before);
  EXPECT_EQ(task.tensor_steps(), std::vector<int64_t>(params.size(), 0));
}

INSTANTIATE_TEST_SUITE_P(Kinds, TensorMaskDtypeTest, ::testing::ValuesIn(testing_util::kind_precision_cases({Precision::kBf16, Precision::kFp16})),
                         testing_util::kind_precision_case_name);

}  // namespace
}  // namespace renaissance
