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

ReplayResult run_replay(const ReplayCase& rc, const TaskOptions& options) {
  const std::vector<std::vector<size_t>> classes = replay_tasks(rc);
  // Where group gi lives: its Task, its hyperparameter group there and its first parameter's id.
  struct Place {
    size_t task = 0;
    int hyper = 0;
    size_t first_id = 0;
  };
  std::vector<Place> place(rc.groups.size());
  std::vector<std::unique_ptr<Task>> tasks;
  std::vector<bool> task_masked(classes.size(), false);  // runs with TaskOptions::tensor_mask
  for (size_t ti = 0; ti < classes.size(); ++ti) {
    std::vector<ParamSpec> specs;
    std::vector<OptimizerConfig> configs;
    for (size_t h = 0; h < classes[ti].size(); ++h) {
      const ReplayGroup& g = rc.groups[classes[ti][h]];
      place[classes[ti][h]] = Place{ti, static_cast<int>(h), specs.size()};
      for (size_t k = 0; k < g.num_params; ++k) {
        specs.push_back(rc.params[g.first_param + k]);
        specs.back().hyper_group = static_cast<int>(h);
      }
      configs.push_back(g.config);
    }
    TaskOptions task_options = options;
    task_options.precision = rc.precision;  // the case's model copy (a stochastic case: one group per task, see above)
    // The per-tensor mask only where the case needs it: the other cases run exactly as before.
    for (size_t gi : classes[ti]) task_masked[ti] = task_masked[ti] || rc.group_needs_mask(gi);
    task_options.tensor_mask = task_masked[ti];
    auto task = std::make_unique<Task>(std::move(specs), task_options);
    if (configs.size() == 1) task->optimizer(configs.front());
    else task->optimizer_groups(configs);
    task->compile();
    for (size_t gi : classes[ti]) {
      const ReplayGroup& g = rc.groups[gi];
      for (size_t k = 0; k < g.num_params; ++k) {
        const size_t id = g.first_param + k, tid = place[gi].first_id + k;
        task->set_weight(tid, rc.init[id].data());
        if (id < rc.has_init_m.size() && rc.has_init_m[id]) task->write(Family::kM, tid, rc.init_m[id].data());
        if (id < rc.has_init_v.size() && rc.has_init_v[id]) task->write(Family::kV, tid, rc.init_v[id].data());
      }
    }
    // A fresh task is at step 0; only a resumed state moves the counter (format 1 never does).
    // The groups of one task share their initial_step (replay_tasks).
    const int64_t initial_step = rc.groups[classes[ti].front()].initial_step;
    if (initial_step != 0) task->set_step_count(initial_step);
    if (task_masked[ti]) {  // each tensor's own count where its group gives them (else initial_step)
      std::vector<int64_t> counts(task->num_params(), initial_step);
      for (size_t gi : classes[ti]) {
        const ReplayGroup& g = rc.groups[gi];
        for (size_t k = 0; k < g.initial_tensor_steps.size(); ++k) counts[place[gi].first_id + k] = g.initial_tensor_steps[k];
      }
      task->set_tensor_steps(counts);
    }
    tasks.push_back(std::move(task));
  }
  for (int64_t t = 0; t < rc.steps; ++t) {
    for (size_t ti = 0; ti < classes.size(); ++ti) {
      Task& task = *tasks[ti];
      if (task_masked[ti]) {
        // The parameters without a gradient this step; a Task with none left is not stepped (its
        // count stays), as renaissance.torch does not step a Task without any gradient.
        std::vector<int32_t> mask(task.num_params(), 0);
        size_t masked = 0;
        for (size_t gi : classes[ti]) {
          const ReplayGroup& g = rc.groups[gi];
          for (size_t k = 0; k < g.num_params; ++k) {
            if (rc.masked(t, g.first_param + k)) {
              mask[place[gi].first_id + k] = 1;
              ++masked;
            }
          }
        }
        if (masked != 0 && masked == mask.size()) continue;
        task.set_tensor_mask(mask);
      }
      task.set_loss_scale(rc.loss_scale_per_step[static_cast<size_t>(t)]);
      for (size_t gi : classes[ti]) {
        const ReplayGroup& g = rc.groups[gi];
        const double lr = g.lr_per_step[static_cast<size_t>(t)];
        if (classes[ti].size() == 1) task.set_lr(lr);
        else task.set_lr(place[gi].hyper, lr);
        for (size_t k = 0; k < g.num_params; ++k) {
          const std::string name = ReplayCase::grad_name(t, rc.params[g.first_param + k].name);
          std::vector<float> grad;
          if (rc.masked(t, g.first_param + k)) {
            // No gradient in the file; the masked step does not read G, zeros keep it defined.
            grad.assign(static_cast<size_t>(rc.params[g.first_param + k].numel()), 0.0f);
          } else if (rc.grads->info(name).dtype == StDtype::kF32) {
            grad = rc.grads->read_f32(name);
          } else {  // model-dtype gradients, widened exactly
            const std::vector<uint16_t> bits = rc.grads->read_half_bits(name);
            grad.resize(bits.size());
            const bool bf16 = precision_bf16_coded(rc.precision.precision);
            for (size_t i = 0; i < bits.size(); ++i) {
              grad[i] = math::half_to_f32(bf16, bits[i]);
            }
          }
          task.set_grad(place[gi].first_id + k, grad.data());
        }
      }
      task.step();
    }
  }
  ReplayResult r;
  r.backend = tasks.front()->backend().describe();
  r.precision = rc.precision.precision;
  r.num_tasks = classes.size();
  for (size_t gi = 0; gi < rc.groups.size(); ++gi) {
    const ReplayGroup& g = rc.groups[gi];
    Task& task = *tasks[place[gi].task];
    r.group_task.push_back(place[gi].task);
    r.group_masked.push_back(task_masked[place[gi].task]);
    const int64_t count = task.step_count();
    r.group_step_counts.push_back(count);
    const std::vector<int64_t> own = task_masked[place[gi].task] ? task.tensor_steps() : std::vector<int64_t>();
    for (size_t k = 0; k < g.num_params; ++k) r.tensor_steps.push_back(own.empty() ? count : own[place[gi].first_id + k]);
    std::vector<size_t> ids;
    for (size_t k = 0; k < g.num_params; ++k) ids.push_back(place[gi].first_id + k);
    // A group's fingerprint is what a task holding only it prints (fingerprint(ids)).
    r.group_fingerprints.push_back(classes[place[gi].task].size() == 1 ? task.fingerprint() : task.fingerprint(ids));
    r.steps_applied += count - g.initial_step;
    r.steps_skipped += task.skipped_steps();
    const bool has_m = task.plan().has_family(Family::kM);
    const bool has_v = task.plan().has_family(Family::kV);
    r.has_m = r.has_m || has_m;
    r.has_v = r.has_v || has_v;
    for (size_t id : ids) {
      std::vector<float> buf(static_cast<size_t>(task.param(id).numel()));
      task.read(Family::kW, id, buf.data());
      r.w.push_back(buf);
      r.param_has_m.push_back(has_m);
      r.param_has_v.push_back(has_v);
      r.m.emplace_back();
      r.v.emplace_back();
      if (has_m) {
        task.read(Family::kM, id, buf.data());
        r.m.back() = buf;
      }
      if (has_v) {
        task.read(Family::kV, id, buf.data());
        r.v.back() = buf;
      }
      r.c.emplace_back();
      if (r.precision != Precision::kFp32) {
        r.c.back().resize(buf.size());
        if (!buf.empty()) task.read_model_copy(id, r.c.back().data());
      }
    }
  }
  r.fingerprint = combine_fingerprints(r.group_fingerprints);
  return r;
}

}  // namespace renaissance
