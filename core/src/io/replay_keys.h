// Format 2's optional keys, parsed and checked here so that replay.cc stays about the rest of the
// format: precision / rounding / seed and the per-tensor mask keys (steps in
// which some parameters had no gradient, and per-tensor step counts). Private to the replay
// reader (core/src/io/replay_case.cc); docs/replay-format.md has the keys.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "renaissance/replay_case.h"

namespace renaissance {
namespace replay_keys {

// precision, rounding and seed (all optional; fp32, nearest, 0).
PrecisionOptions parse_precision_keys(const nlohmann::json& j, const std::string& case_path);


// The group object's initial_tensor_steps / expected_tensor_steps (`key`): one integer per
// parameter of the group, each at most `max` (the int32 step counter's room).
std::vector<int64_t> parse_tensor_steps(const nlohmann::json& v, const std::string& where, size_t num_params,
                                        int64_t max);

// no_grad_per_step: `steps` arrays of parameter names of the case (no repeats within a step),
// into rc.no_grad as ids. rc.params and rc.groups must be parsed.
void parse_no_grad(const nlohmann::json& j, const std::string& case_path, ReplayCase& rc);

}  // namespace replay_keys
}  // namespace renaissance
