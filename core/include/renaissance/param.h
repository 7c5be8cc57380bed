// Parameter specifications: what the user declares about each tensor of the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "renaissance/region.h"

namespace renaissance {

// Which optimizer of a muon task steps a tensor (a layout's per-parameter "optimizer" key).
// kRole, the default ("muon" in a layout): the role decides, Muon for the weight roles and the
// auxiliary AdamW for the bias-like ones. kAdamW ("adamw"): the auxiliary AdamW whatever the
// role, for the matrices Muon should not touch (embeddings, heads). Other kinds ignore it.
enum class ParamOptimizer : int { kRole = 0, kAdamW = 1 };

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // an empty shape is a scalar (one element); a 0 extent is empty
  Role role = Role::kDeepConv;
  // Hyperparameter group in [0, H) (Task::optimizer_groups): which block of scalar slots the
  // tensor's update reads. 0 for a task with one configuration.
  int hyper_group = 0;
  ParamOptimizer optimizer = ParamOptimizer::kRole;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// The role a plan places a tensor by (MemoryPlan::tensor(id).spec.role): in a muon plan a
// weight-role tensor marked kAdamW joins the bias-like group as an fc_bias, so that the auxiliary
// AdamW steps it; every other tensor keeps its role.
inline Role planned_role(const ParamSpec& p, bool muon) {
  return muon && p.optimizer == ParamOptimizer::kAdamW && group_of(p.role) == Group::kWeight ? Role::kFcBias : p.role;
}

// Checks names (non-empty, unique) and shapes (non-negative extents, no overflow); throws
// Error(kInvalidArgument) naming the parameter.
void validate_param_specs(const std::vector<ParamSpec>& params);

}  // namespace renaissance
