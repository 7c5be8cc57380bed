// Format 2's optional keys, see replay_keys.h: precision, rounding and seed, and the
// mask keys: no_grad_per_step (per step, the parameters whose gradient was None),
// initial_tensor_steps and expected_tensor_steps (per-tensor applied-step counts, torch's
// per-parameter `step`), the ReplayCase queries over them, and the comparison of the final
// per-tensor counts. Each error names case.json and the key.
#include "core/src/io/replay_keys.h"

#include <algorithm>
#include <map>

#include "renaissance/error.h"

namespace renaissance {

bool ReplayCase::masked(int64_t step, size_t id) const {
  if (no_grad.empty()) return false;
  const std::vector<size_t>& ids = no_grad.at(static_cast<size_t>(step));
  return std::binary_search(ids.begin(), ids.end(), id);
}

bool ReplayCase::group_needs_mask(size_t gi) const {
  const ReplayGroup& g = groups.at(gi);
  if (!g.initial_tensor_steps.empty() || !g.expected_tensor_steps.empty()) return true;
  for (const std::vector<size_t>& ids : no_grad) {
    for (size_t id : ids) {
      if (id >= g.first_param && id < g.first_param + g.num_params) return true;
    }
  }
  return false;
}

std::vector<std::string> tensor_step_mismatches(const ReplayCase& rc, const ReplayResult& r) {
  std::vector<std::string> out;
  for (const ReplayGroup& g : rc.groups) {
    for (size_t k = 0; k < g.expected_tensor_steps.size(); ++k) {
      const size_t id = g.first_param + k;
      const int64_t got = id < r.tensor_steps.size() ? r.tensor_steps[id] : -1;
      if (got != g.expected_tensor_steps[k]) {
        out.push_back(rc.params[id].name + ": expected " + std::to_string(g.expected_tensor_steps[k]) + ", got " +
                      std::to_string(got));
      }
    }
  }
  return out;
}

namespace replay_keys {

// Format 2's precision, rounding and seed keys (all optional; fp32, nearest, 0).
PrecisionOptions parse_precision_keys(const nlohmann::json& j, const std::string& case_path) {
  PrecisionOptions p;
  if (j.contains("precision")) {
    const nlohmann::json& v = j["precision"];
    if (!v.is_string() || !parse_precision(v.get<std::string>(), &p.precision)) {
      throw_format(case_path + ": precision must be \"fp32\", \"bf16\" or \"fp16\", got " + v.dump());
    }
  }
  if (j.contains("rounding")) {
    const nlohmann::json& v = j["rounding"];
    const std::string r = v.is_string() ? v.get<std::string>() : std::string();
    if (r == "nearest") p.rounding = Rounding::kNearest;
    else if (r == "stochastic") p.rounding = Rounding::kStochastic;
    else throw_format(case_path + ": rounding must be \"nearest\" or \"stochastic\", got " + v.dump());
    if (p.precision == Precision::kFp32) {
      throw_format(case_path + ": rounding needs precision \"bf16\" or \"fp16\" (an fp32 case has no model copy)");
    }
  }
  if (j.contains("seed")) {
    if (!j["seed"].is_number_unsigned()) {
      throw_format(case_path + ": seed must be a non-negative integer below 2^64, got " + j["seed"].dump());
    }
    p.seed = j["seed"].get<uint64_t>();
  }
  return p;
}


std::vector<int64_t> parse_tensor_steps(const nlohmann::json& v, const std::string& where, size_t num_params,
                                        int64_t max) {
  if (!v.is_array() || v.size() != num_params) {
    throw_format(where + " must be an array of " + std::to_string(num_params) +
                 " integers (one per parameter of the group), got " + v.dump());
  }
  std::vector<int64_t> out;
  for (size_t k = 0; k < v.size(); ++k) {
    if (!v[k].is_number_unsigned() || v[k].get<uint64_t>() > static_cast<uint64_t>(max)) {
      throw_format(where + "[" + std::to_string(k) + "] must be a non-negative integer of at most " + std::to_string(max) +
                   ", got " + v[k].dump());
    }
    out.push_back(v[k].get<int64_t>());
  }
  return out;
}

void parse_no_grad(const nlohmann::json& j, const std::string& case_path, ReplayCase& rc) {
  const std::string where = case_path + ": no_grad_per_step";
  if (!j.is_array() || static_cast<int64_t>(j.size()) != rc.steps) {
    throw_format(where + " must be an array of " + std::to_string(rc.steps) +
                 " arrays (one per step) of parameter names, got " + (j.is_array() ? std::to_string(j.size()) + " entries" : j.dump()));
  }
  std::map<std::string, size_t> id_of;
  for (size_t id = 0; id < rc.params.size(); ++id) id_of.emplace(rc.params[id].name, id);
  std::vector<std::vector<size_t>> no_grad(j.size());
  bool any = false;
  for (size_t t = 0; t < j.size(); ++t) {
    const std::string at = where + "[" + std::to_string(t) + "]";
    if (!j[t].is_array()) throw_format(at + " must be an array of parameter names, got " + j[t].dump());
    for (const nlohmann::json& n : j[t]) {
      if (!n.is_string() || !id_of.count(n.get<std::string>())) {
        throw_format(at + ": " + n.dump() + " is not a parameter of the case");
      }
      no_grad[t].push_back(id_of[n.get<std::string>()]);
    }
    std::sort(no_grad[t].begin(), no_grad[t].end());
    if (std::adjacent_find(no_grad[t].begin(), no_grad[t].end()) != no_grad[t].end()) {
      throw_format(at + ": a parameter is named twice");
    }
    any = any || !no_grad[t].empty();
  }
  if (any) rc.no_grad = std::move(no_grad);  // empty: the case masks nothing (the plain path)
}

}  // namespace replay_keys
}  // namespace renaissance
