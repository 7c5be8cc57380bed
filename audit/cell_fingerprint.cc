// cell_fingerprint and the gradient helpers of audit/cell_fingerprint.h: a conformance
// cell's inputs and final fingerprint, shared by the suite (runner.cc) and `renaissance audit`.
#include "audit/cell_fingerprint.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "renaissance/math/precision.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"

namespace renaissance {
namespace conformance {

namespace {

uint16_t to_grad_dtype(const PrecisionOptions& p, float x) {
  return math::f32_to_encoded_rne(p.precision, x);
}

}  // namespace

void round_grads_to_model_dtype(const PrecisionOptions& p, std::vector<std::vector<float>>* g) {
  if (!p.model_dtype_gradients) return;
  for (auto& tensor : *g) {
    for (float& x : tensor) {
      const uint16_t h = to_grad_dtype(p, x);
      x = math::encoded_to_f32(p.precision, h);
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

std::unique_ptr<Task> make_cell_task(const Cell& cell, BackendKind backend, const BackendOptions& backend_options) {
  const std::vector<ParamSpec> params = cell_params(cell);
  TaskOptions options;
  options.backend = backend;
  options.backend_options = backend_options;
  options.precision = cell.precision;
  options.tensor_mask = cell.tensor_mask;
  options.gradient_table = cell.gradient_table;
  auto task = std::make_unique<Task>(params, options);
  if (cell.hyper_groups > 1) {
    std::vector<OptimizerConfig> configs;
    for (int h = 0; h < cell.hyper_groups; ++h) configs.push_back(cell.group_config(h));
    task->optimizer_groups(configs);
  } else {
    task->optimizer(cell.config);
  }
  task->compile();
  std::vector<std::vector<float>> w0;
  make_weights(params, &w0);
  for (size_t id = 0; id < params.size(); ++id) task->set_weight(id, w0[id].data());
  return task;
}

std::vector<size_t> injection_order(const MemoryPlan& plan, const std::vector<ParamSpec>& params) {
  std::vector<size_t> by_offset;
  for (size_t id = 0; id < params.size(); ++id) {
    if (params[id].numel() > 0) by_offset.push_back(id);
  }
  std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) {
    return plan.tensor_offset(Family::kG, a) < plan.tensor_offset(Family::kG, b);
  });
  return by_offset;
}

CellStep cell_step(const Cell& cell, const std::vector<ParamSpec>& params, const std::vector<size_t>& order, int s) {
  CellStep st;
  st.s = s;
  for (int h = 0; h < cell.hyper_groups; ++h) st.lrs.push_back(cell.hyper_groups > 1 ? cell.lr_at(s, h) : cell.lr_at(s));
  for (const Injection& i : cell.injections) {
    if (i.step == s) st.injection = &i;
  }
  std::vector<size_t> sites;
  if (st.injection) {
    const Site site = st.injection->site;
    st.poison_id = site == Site::kFirst ? order.front() : site == Site::kMiddle ? order[order.size() / 2] : order.back();
    const uint64_t n = static_cast<uint64_t>(params[st.poison_id].numel());
    st.poison_idx = site == Site::kFirst ? 0 : (site == Site::kMiddle ? n / 2 : n - 1);
    sites.push_back(st.poison_id);
  }
  if (cell.tensor_mask) {
    for (size_t id = 0; id < params.size(); ++id) st.mask.push_back(cell.mask_at(id, s, sites) ? 1 : 0);
  }
  if (!cell.backend_gradients) {
    make_grads(params, static_cast<uint64_t>(s), cell.loss_scale, &st.grads);
    round_grads_to_model_dtype(cell.precision, &st.grads);
    for (size_t id = 0; id < st.mask.size(); ++id) {
      if (st.mask[id]) st.grads[id].assign(st.grads[id].size(), std::numeric_limits<float>::quiet_NaN());
    }
    if (st.injection) st.grads[st.poison_id][st.poison_idx] = st.injection->value;
  }
  return st;
}

CellFeeder::CellFeeder(const Cell& cell, Task& task, const BackendOptions& backend_options)
    : cell_(cell), task_(task) {
  if (!cell.gradient_table) return;
  const size_t n = task.num_params();
  for (int d = 0; d < 2; ++d) {
    // A filler first (1 or 3 elements), then every tensor flattened, each followed by an odd
    // filler: in one role region, back to back, so most tensors start off 16-byte boundaries and a
    // neighbour's finite values sit right after each one. Donor 1 holds the tensors in reverse.
    std::vector<ParamSpec> specs = {{"lead", {d == 0 ? 3 : 1}, Role::kDeepConv}};
    Donor donor;
    donor.slot.resize(n);
    for (size_t k = 0; k < n; ++k) {
      const size_t id = d == 0 ? k : n - 1 - k;
      donor.slot[id] = specs.size();
      specs.push_back({"g" + std::to_string(id), {task.param(id).numel()}, Role::kDeepConv});
      specs.push_back({"odd" + std::to_string(k), {static_cast<int64_t>(2 * (k % 8) + 1)}, Role::kDeepConv});
    }
    TaskOptions options;
    options.backend = task.backend().kind();
    options.backend_options = backend_options;
    options.precision = cell.precision;
    donor.task = std::make_unique<Task>(specs, options);
    donor.task->optimizer(OptimizerConfig{});
    donor.task->compile();
    for (size_t k = 0; k < specs.size(); ++k) {
      const std::vector<float> filler(static_cast<size_t>(specs[k].numel()), 3.0f);
      donor.task->set_grad(k, filler.data());
    }
    donors_.push_back(std::move(donor));
  }
  // The arena's own G: NaN, so a read of it instead of the table skips the step.
  for (size_t id = 0; id < n; ++id) {
    const std::vector<float> nan(static_cast<size_t>(task.param(id).numel()), std::numeric_limits<float>::quiet_NaN());
    task.set_grad(id, nan.data());
  }
}

CellFeeder::~CellFeeder() = default;

void CellFeeder::feed(const CellStep& st) {
  Task& task = task_;
  const Cell& cell = cell_;
  if (cell.hyper_groups > 1) {
    task.set_group_lrs(st.lrs);
  } else {
    task.set_lr(st.lrs[0]);
  }
  task.set_loss_scale(cell.loss_scale);
  const size_t n = task.num_params();
  if (cell.gradient_table) {
    // The donors' copies run on their own streams, unordered with this task's (as a user's
    // gradients are written on streams the library does not see): a step already launched here
    // may not have read the donor slots yet (a long step, e.g. muon's, lets the host run steps
    // ahead), so wait for it before overwriting them.
    task.backend().synchronize();
    std::vector<uint64_t> addresses(n);
    for (size_t id = 0; id < n; ++id) {
      const Donor& d = donors_[(id + static_cast<size_t>(st.s)) % 2];
      d.task->set_grad(d.slot[id], st.grads[id].data());
      addresses[id] = reinterpret_cast<uintptr_t>(d.task->grad_data(d.slot[id]));
    }
    if (st.injection) {
      const Donor& d = donors_[(st.poison_id + static_cast<size_t>(st.s)) % 2];
      upload_gradient_element(*d.task, cell.precision, d.slot[st.poison_id], st.poison_idx, st.injection->value);
    }
    // And the donors' copies are complete before this task's step reads them.
    for (const Donor& d : donors_) d.task->backend().synchronize();
    task.set_gradient_table(addresses);
  } else {
    if (cell.simulated_ranks > 0) {
      synthesize_rank_sum(task, kSyntheticSeed, static_cast<uint64_t>(st.s), static_cast<float>(cell.loss_scale),
                          cell.simulated_ranks);
    } else if (cell.backend_gradients) {
      task.synthesize_gradients(kSyntheticSeed, static_cast<uint64_t>(st.s), static_cast<float>(cell.loss_scale));
    } else {
      for (size_t id = 0; id < n; ++id) task.set_grad(id, st.grads[id].data());
    }
    if (cell.backend_gradients) {
      for (size_t id = 0; id < st.mask.size(); ++id) {
        if (!st.mask[id]) continue;
        const std::vector<float> nan(static_cast<size_t>(task.param(id).numel()), std::numeric_limits<float>::quiet_NaN());
        task.set_grad(id, nan.data());
      }
    }
    // The poisoned element also goes in through the raw arena upload at its G offset.
    if (st.injection) upload_gradient_element(task, cell.precision, st.poison_id, st.poison_idx, st.injection->value);
  }
  if (cell.tensor_mask) task.set_tensor_mask(st.mask);
}

std::string cell_fingerprint(const Cell& cell, BackendKind backend, std::string* description,
                             const BackendOptions& backend_options) {
  const std::vector<ParamSpec> params = cell_params(cell);
  std::unique_ptr<Task> task = make_cell_task(cell, backend, backend_options);
  if (description) *description = task->backend().describe();
  const std::vector<size_t> order = injection_order(task->plan(), params);
  CellFeeder feeder(cell, *task, backend_options);
  for (int s = 0; s < cell.steps; ++s) {
    feeder.feed(cell_step(cell, params, order, s));
    task->step();
  }
  return task->fingerprint();
}

}  // namespace conformance
}  // namespace renaissance
