// cell_fingerprint and the gradient helpers of audit/cell_fingerprint.h: a conformance
// cell's inputs and final fingerprint, shared by the suite (runner.cc) and `renaissance audit`.
#include "audit/cell_fingerprint.h"

#include <algorithm>

#include "renaissance/math/precision.h"
#include "renaissance/task.h"

namespace renaissance {
namespace conformance {

namespace {

uint16_t to_grad_dtype(const PrecisionOptions& p, float x) {
  return math::f32_to_half_rne(precision_bf16_coded(p.precision), x);
}

}  // namespace

void round_grads_to_model_dtype(const PrecisionOptions& p, std::vector<std::vector<float>>* g) {
  if (!p.model_dtype_gradients) return;
  for (auto& tensor : *g) {
    for (float& x : tensor) {
      const uint16_t h = to_grad_dtype(p, x);
      x = math::half_to_f32(precision_bf16_coded(p.precision), h);
    }
  }
}

void upload_gradient_element(Task& task, const PrecisionOptions& p, size_t id, uint64_t idx, float value) {
  const uint64_t g = task.plan().tensor_offset(Family::kG, id);
  if (p.model_dtype_gradients) {
    const uint16_t h = to_grad_dtype(p, value);
    task.backend().upload(g + idx * sizeof(uint16_t), &h, sizeof(h));
  } else {
    task.backend().upload(g + idx * sizeof(float), &value, sizeof(float));
  }
}

std::string cell_fingerprint(const Cell& cell, BackendKind backend, std::string* description,
                             const BackendOptions& backend_options) {
  const std::vector<ParamSpec> params = conformance_layout(cell.layout);
  TaskOptions options;
  options.backend = backend;
  options.backend_options = backend_options;
  options.precision = cell.precision;
  Task task(params, options);
  task.optimizer(cell.config);
  task.compile();
  if (description) *description = task.backend().describe();
  {
    std::vector<std::vector<float>> w0;
    make_weights(params, &w0);
    for (size_t id = 0; id < params.size(); ++id) task.set_weight(id, w0[id].data());
  }
  // Injection sites as run_cell picks them: non-empty G tensors in arena order.
  const MemoryPlan& plan = task.plan();
  std::vector<size_t> by_offset;
  for (size_t id = 0; id < params.size(); ++id) {
    if (params[id].numel() > 0) by_offset.push_back(id);
  }
  std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) {
    return plan.tensor_offset(Family::kG, a) < plan.tensor_offset(Family::kG, b);
  });
  std::vector<std::vector<float>> g;
  for (int s = 0; s < cell.steps; ++s) {
    task.set_lr(cell.lr_at(s));
    task.set_loss_scale(cell.loss_scale);
    if (cell.backend_gradients) {
      task.synthesize_gradients(kSyntheticSeed, static_cast<uint64_t>(s), static_cast<float>(cell.loss_scale));
    } else {
      make_grads(params, static_cast<uint64_t>(s), cell.loss_scale, &g);
      round_grads_to_model_dtype(cell.precision, &g);
      for (size_t id = 0; id < params.size(); ++id) task.set_grad(id, g[id].data());
    }
    for (const Injection& inj : cell.injections) {
      if (inj.step != s) continue;
      const size_t id = inj.site == Site::kFirst ? by_offset.front()
                        : inj.site == Site::kMiddle ? by_offset[by_offset.size() / 2]
                                                    : by_offset.back();
      const uint64_t n = static_cast<uint64_t>(params[id].numel());
      const uint64_t idx = inj.site == Site::kFirst ? 0 : (inj.site == Site::kMiddle ? n / 2 : n - 1);
      upload_gradient_element(task, cell.precision, id, idx, inj.value);
    }
    task.step();
  }
  return task.fingerprint();
}

}  // namespace conformance
}  // namespace renaissance
