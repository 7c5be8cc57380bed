// Parameter specifications: what the user declares about each tensor of the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "renaissance/region.h"

namespace renaissance {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // an empty shape is a scalar (one element); a 0 extent is empty
  Role role = Role::kDeepConv;
  // Hyperparameter group in [0, H) (Task::optimizer_groups): which block of scalar slots the
  // tensor's update reads. 0 for a task with one configuration.
  int hyper_group = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Checks names (non-empty, unique) and shapes (non-negative extents, no overflow); throws
// Error(kInvalidArgument) naming the parameter.
void validate_param_specs(const std::vector<ParamSpec>& params);

}  // namespace renaissance
