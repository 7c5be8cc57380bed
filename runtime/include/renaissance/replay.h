// Running a replay case (renaissance/replay_case.h) on fresh Tasks: which groups share one Task,
// and the run itself. Shared by `renaissance replay`, the Python binding and the tests.
#pragma once

#include <cstddef>
#include <vector>

#include "renaissance/replay_case.h"
#include "renaissance/task.h"

namespace renaissance {

// Which groups run in one Task (lists of group indices, in order of their first group): groups
// with the same kind, weight_decay_mode, max_grad_norm and initial_step share one, as
// renaissance.torch shares one among the torch groups of one structure (so max_grad_norm clips
// over all of them); a stochastic-rounding case keeps one Task per group (its rounding key's
// parameter index is the index within the group).
std::vector<std::vector<size_t>> replay_tasks(const ReplayCase& replay);

// Runs the case on fresh Tasks, one per entry of replay_tasks, each group a hyperparameter group
// of its Task: each group's initial weights, state and step count, then per step and Task
// set_loss_scale, each group's set_lr and gradients, one step(). A Task whose groups need the
// mask (group_needs_mask) runs with TaskOptions::tensor_mask: per-tensor initial counts, and per
// step the mask from no_grad (a masked parameter's G zeroed, not read from the file); a Task all
// of whose parameters are masked in a step is not stepped, as renaissance.torch does not step it.
ReplayResult run_replay(const ReplayCase& replay, const TaskOptions& options);

}  // namespace renaissance
