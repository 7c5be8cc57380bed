// Running a replay case on fresh Tasks (renaissance/replay.h): the groups of one structure in one
// Task (replay_tasks), each group's initial state, then per step its lr, loss scale and gradients.
#include "renaissance/replay.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "renaissance/error.h"
#include "renaissance/fingerprint.h"
#include "renaissance/math/precision.h"

namespace renaissance {

std::vector<std::vector<size_t>> replay_tasks(const ReplayCase& rc) {
  // renaissance.torch's rule (python/renaissance/_torch_group.py, structure_key): groups whose
  // compiled step agrees (kind, weight-decay mode, max_grad_norm) share one Task, so that global
  // clipping spans them as it did in the recording. Two things a Task also holds once for all its
  // groups are added to the key: the step counter (initial_step), and under stochastic rounding
  // the parameter index of the rounding key, which the format defines within the group.
  const bool stochastic = rc.precision.precision != Precision::kFp32 && rc.precision.rounding == Rounding::kStochastic;
  std::vector<std::vector<size_t>> tasks;
  for (size_t gi = 0; gi < rc.groups.size(); ++gi) {
    const ReplayGroup& g = rc.groups[gi];
    bool placed = false;
    for (std::vector<size_t>& members : tasks) {
      const ReplayGroup& first = rc.groups[members.front()];
      if (!stochastic && first.config.kind == g.config.kind && first.config.weight_decay_mode == g.config.weight_decay_mode &&
          first.config.max_grad_norm == g.config.max_grad_norm && first.initial_step == g.initial_step) {
        members.push_back(gi);
        placed = true;
        break;
      }
    }
    if (!placed) tasks.push_back({gi});
  }
  return tasks;
}

namespace {

// The Tasks of a replay: classes[ti] lists the groups of Task ti (replay_tasks); place[gi] says
// where group gi lives: its Task, its hyperparameter group there and its first parameter's id.
struct ReplayTasks {
  struct Place {
    size_t task = 0;
    int hyper = 0;
    size_t first_id = 0;
  };
  std::vector<std::vector<size_t>> classes;
  std::vector<Place> place;
  std::vector<std::unique_ptr<Task>> tasks;
  std::vector<bool> masked;  // Task ti runs with TaskOptions::tensor_mask
};

// Task ti's initial state: each parameter's weight and given moments, and its step counts.
void set_initial_state(const ReplayCase& rc, const ReplayTasks& rt, size_t ti, Task* task) {
  for (size_t gi : rt.classes[ti]) {
    const ReplayGroup& g = rc.groups[gi];
    for (size_t k = 0; k < g.num_params; ++k) {
      const size_t id = g.first_param + k, tid = rt.place[gi].first_id + k;
      task->set_weight(tid, rc.init[id].data());
      if (id < rc.has_init_m.size() && rc.has_init_m[id]) task->write(Family::kM, tid, rc.init_m[id].data());
      if (id < rc.has_init_v.size() && rc.has_init_v[id]) task->write(Family::kV, tid, rc.init_v[id].data());
    }
  }
  // A fresh task is at step 0; only a resumed state moves the counter (format 1 never does).
  // The groups of one task share their initial_step (replay_tasks).
  const int64_t initial_step = rc.groups[rt.classes[ti].front()].initial_step;
  if (initial_step != 0) task->set_step_count(initial_step);
  if (rt.masked[ti]) {  // each tensor's own count where its group gives them (else initial_step)
    std::vector<int64_t> counts(task->num_params(), initial_step);
    for (size_t gi : rt.classes[ti]) {
      const ReplayGroup& g = rc.groups[gi];
      for (size_t k = 0; k < g.initial_tensor_steps.size(); ++k) counts[rt.place[gi].first_id + k] = g.initial_tensor_steps[k];
    }
    task->set_tensor_steps(counts);
  }
}

// One compiled Task per class of groups, in its initial state.
ReplayTasks make_replay_tasks(const ReplayCase& rc, const TaskOptions& options) {
  ReplayTasks rt;
  rt.classes = replay_tasks(rc);
  rt.place.resize(rc.groups.size());
  rt.masked.assign(rt.classes.size(), false);
  for (size_t ti = 0; ti < rt.classes.size(); ++ti) {
    std::vector<ParamSpec> specs;
    std::vector<OptimizerConfig> configs;
    for (size_t h = 0; h < rt.classes[ti].size(); ++h) {
      const ReplayGroup& g = rc.groups[rt.classes[ti][h]];
      rt.place[rt.classes[ti][h]] = ReplayTasks::Place{ti, static_cast<int>(h), specs.size()};
      for (size_t k = 0; k < g.num_params; ++k) {
        specs.push_back(rc.params[g.first_param + k]);
        specs.back().hyper_group = static_cast<int>(h);
      }
      configs.push_back(g.config);
    }
    TaskOptions task_options = options;
    task_options.precision = rc.precision;  // the case's model copy (a stochastic case: one group per task, see above)
    // The per-tensor mask only where the case needs it: the other cases run exactly as before.
    for (size_t gi : rt.classes[ti]) rt.masked[ti] = rt.masked[ti] || rc.group_needs_mask(gi);
    task_options.tensor_mask = rt.masked[ti];
    auto task = std::make_unique<Task>(std::move(specs), task_options);
    if (configs.size() == 1) task->optimizer(configs.front());
    else task->optimizer_groups(configs);
    task->compile();
    set_initial_state(rc, rt, ti, task.get());
    rt.tasks.push_back(std::move(task));
  }
  return rt;
}

// The gradient of parameter `param` at step t as fp32: the file's F32, or its model-dtype bits
// widened exactly; zeros for a masked parameter (no gradient in the file; the masked step does
// not read G, zeros keep it defined).
std::vector<float> replay_gradient(const ReplayCase& rc, int64_t t, size_t param) {
  if (rc.masked(t, param)) return std::vector<float>(static_cast<size_t>(rc.params[param].numel()), 0.0f);
  const std::string name = ReplayCase::grad_name(t, rc.params[param].name);
  if (rc.grads->info(name).dtype == StDtype::kF32) return rc.grads->read_f32(name);
  const std::vector<uint16_t> bits = rc.grads->read_encodings(name, rc.precision.precision);
  std::vector<float> grad(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) grad[i] = math::encoded_to_f32(rc.precision.precision, bits[i]);
  return grad;
}

// Step t of Task ti: its mask (a masked Task), loss scale, each group's lr and gradients, the step.
void replay_step(const ReplayCase& rc, ReplayTasks& rt, size_t ti, int64_t t) {
  Task& task = *rt.tasks[ti];
  if (rt.masked[ti]) {
    // The parameters without a gradient this step; a Task with none left is not stepped (its
    // count stays), as renaissance.torch does not step a Task without any gradient.
    std::vector<int32_t> mask(task.num_params(), 0);
    size_t masked = 0;
    for (size_t gi : rt.classes[ti]) {
      const ReplayGroup& g = rc.groups[gi];
      for (size_t k = 0; k < g.num_params; ++k) {
        if (rc.masked(t, g.first_param + k)) {
          mask[rt.place[gi].first_id + k] = 1;
          ++masked;
        }
      }
    }
    if (masked != 0 && masked == mask.size()) return;
    task.set_tensor_mask(mask);
  }
  task.set_loss_scale(rc.loss_scale_per_step[static_cast<size_t>(t)]);
  for (size_t gi : rt.classes[ti]) {
    const ReplayGroup& g = rc.groups[gi];
    const double lr = g.lr_per_step[static_cast<size_t>(t)];
    if (rt.classes[ti].size() == 1) task.set_lr(lr);
    else task.set_lr(rt.place[gi].hyper, lr);
    for (size_t k = 0; k < g.num_params; ++k) {
      task.set_grad(rt.place[gi].first_id + k, replay_gradient(rc, t, g.first_param + k).data());
    }
  }
  task.step();
}

// The final W, M, V and model copy of the tensors `ids` of `task` appended to r.
void read_final_state(Task& task, const std::vector<size_t>& ids, ReplayResult* r) {
  const bool has_m = task.plan().has_family(Family::kM);
  const bool has_v = task.plan().has_family(Family::kV);
  r->has_m = r->has_m || has_m;
  r->has_v = r->has_v || has_v;
  for (size_t id : ids) {
    std::vector<float> buf(static_cast<size_t>(task.param(id).numel()));
    task.read(Family::kW, id, buf.data());
    r->w.push_back(buf);
    r->param_has_m.push_back(has_m);
    r->param_has_v.push_back(has_v);
    r->m.emplace_back();
    r->v.emplace_back();
    if (has_m) {
      task.read(Family::kM, id, buf.data());
      r->m.back() = buf;
    }
    if (has_v) {
      task.read(Family::kV, id, buf.data());
      r->v.back() = buf;
    }
    r->c.emplace_back();
    if (r->precision != Precision::kFp32) {
      r->c.back().resize(buf.size());
      if (!buf.empty()) task.read_model_copy(id, r->c.back().data());
    }
  }
}

// Each group's counts, fingerprint and final state, in the case's group order.
ReplayResult collect_result(const ReplayCase& rc, ReplayTasks& rt) {
  ReplayResult r;
  r.backend = rt.tasks.front()->backend().describe();
  r.precision = rc.precision.precision;
  r.num_tasks = rt.classes.size();
  for (size_t gi = 0; gi < rc.groups.size(); ++gi) {
    const ReplayGroup& g = rc.groups[gi];
    const ReplayTasks::Place& at = rt.place[gi];
    Task& task = *rt.tasks[at.task];
    r.group_task.push_back(at.task);
    r.group_masked.push_back(rt.masked[at.task]);
    const int64_t count = task.step_count();
    r.group_step_counts.push_back(count);
    const std::vector<int64_t> own = rt.masked[at.task] ? task.tensor_steps() : std::vector<int64_t>();
    for (size_t k = 0; k < g.num_params; ++k) r.tensor_steps.push_back(own.empty() ? count : own[at.first_id + k]);
    std::vector<size_t> ids;
    for (size_t k = 0; k < g.num_params; ++k) ids.push_back(at.first_id + k);
    // A group's fingerprint is what a task holding only it prints (fingerprint(ids)).
    r.group_fingerprints.push_back(rt.classes[at.task].size() == 1 ? task.fingerprint() : task.fingerprint(ids));
    r.steps_applied += count - g.initial_step;
    r.steps_skipped += task.skipped_steps();
    read_final_state(task, ids, &r);
  }
  r.fingerprint = combine_fingerprints(r.group_fingerprints);
  return r;
}

}  // namespace

ReplayResult run_replay(const ReplayCase& rc, const TaskOptions& options) {
  ReplayTasks rt = make_replay_tasks(rc, options);
  for (int64_t t = 0; t < rc.steps; ++t) {
    for (size_t ti = 0; ti < rt.classes.size(); ++ti) replay_step(rc, rt, ti, t);
  }
  return collect_result(rc, rt);
}

}  // namespace renaissance
