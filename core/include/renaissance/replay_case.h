// Replay cases (formats `renaissance-replay/1` and `/2`, docs/replay-format.md): a recorded
// optimizer run (initial weights, per-step gradients, learning rates and loss scales; in format 2
// also several parameter groups, an initial optimizer state and an expected fingerprint) that any
// backend can re-run and compare with a float64 reference or a recorded fingerprint. The same
// code serves `renaissance replay`, the Python binding and the tests. Loading validates the whole
// case (case.json, and every header and tensor of the safetensors files) before anything runs,
// so a broken case never produces output.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "renaissance/safetensors.h"

namespace renaissance {

constexpr const char* kReplayFormat = "renaissance-replay/1";
constexpr const char* kReplayFormat2 = "renaissance-replay/2";

// One parameter group: a hyperparameter group of the Task that replay_tasks puts it in.
struct ReplayGroup {
  OptimizerConfig config;
  std::vector<double> lr_per_step;  // `steps` entries (optimizer.lr when not given)
  size_t first_param = 0;           // the group's parameters are params[first_param, +num_params)
  size_t num_params = 0;
  int64_t initial_step = 0;  // applied steps the initial state was taken at
  // Format 2's per-tensor step counts (torch's per-parameter `step` after None
  // gradients): each parameter's applied-step count in the initial state (empty: initial_step
  // for every one) and the one the replay must end with (empty: not checked). Either makes the
  // group's Task run with TaskOptions::tensor_mask.
  std::vector<int64_t> initial_tensor_steps, expected_tensor_steps;
};

struct ReplayCase {
  std::string dir;
  std::string name;
  int format = 1;  // 1 or 2
  std::vector<ReplayGroup> groups;  // one in format 1
  int64_t steps = 0;
  std::vector<double> loss_scale_per_step;  // `steps` entries (1 when not given)
  // Format 2's no_grad_per_step: per step, the ids of the parameters that had no
  // gradient (torch's `.grad is None`), ascending; empty when the case masks nothing. Such a
  // parameter has no step{t}/NAME in grads.safetensors and is masked in that step.
  std::vector<std::vector<size_t>> no_grad;
  std::vector<ParamSpec> params;            // every group's, in group order; names unique in the case
  std::vector<std::vector<float>> init;     // per parameter
  // Format 2's initial optimizer state (init.safetensors m/NAME, v/NAME): per parameter, empty
  // where the file has none (a group gives it for all its parameters or for none).
  std::vector<std::vector<float>> init_m, init_v;
  std::vector<bool> has_init_m, has_init_v;  // per parameter
  // Format 2: the fingerprint the final state must have (combine_fingerprints of the groups'),
  // 16 lowercase hex digits; empty when the case has none.
  std::string expected_fingerprint;
  // case.json's optional `tolerance`: the largest rel_l2 per tensor against expected.safetensors
  // that passes, for a case whose reference the library meets only within a known bound (muon's
  // float64 Newton–Schulz); 0 when the case gives none (the caller's default applies).
  double tolerance = 0.0;
  // Format 2's optional keys precision, rounding and seed: a bf16/fp16 model copy of
  // every group's weights besides the fp32 masters (fp32: none). Gradients may then be stored in
  // the model dtype (widened exactly), and expected.safetensors may hold c/NAME, the copy in its
  // dtype, compared bit for bit.
  PrecisionOptions precision;
  // Gradients are validated at load time but read step by step while running, so a long case
  // does not need all of them in memory at once.
  std::shared_ptr<SafetensorsReader> grads;
  // expected.safetensors, when the case has one: per parameter, plus "m/NAME" / "v/NAME" entries
  // where the reference records optimizer state.
  bool has_expected = false;
  std::map<std::string, std::vector<double>> expected;
  std::map<std::string, std::vector<uint16_t>> expected_copy;  // "c/NAME": its encodings, one per uint16_t

  // The group parameter `id` belongs to.
  const ReplayGroup& group_of(size_t id) const;
  // Whether parameter `id` had no gradient at step t (no_grad_per_step).
  bool masked(int64_t step, size_t id) const;
  // Whether group gi's Task must run with the per-tensor mask: some parameter of the group is
  // masked in some step, or the group gives per-tensor step counts.
  bool group_needs_mask(size_t gi) const;

  static std::string grad_name(int64_t step, const std::string& param) {
    return "step" + std::to_string(step) + "/" + param;
  }
};

// The default largest rel_l2 per tensor of a comparison with expected.safetensors.
constexpr double kReplayDefaultTolerance = 1e-6;

// The tolerance a comparison uses: `requested` where the caller gives one (>= 0), else the
// case's own `tolerance`, else kReplayDefaultTolerance.
inline double replay_tolerance(const ReplayCase& rc, double requested) {
  if (requested >= 0.0) return requested;
  return rc.tolerance > 0.0 ? rc.tolerance : kReplayDefaultTolerance;
}

// Loads and validates a case directory. Throws Error(kFormat / kIo / kInvalidArgument) with a
// message naming the file, the tensor or the key and what is wrong.
ReplayCase load_replay_case(const std::string& dir);

// The case.json half of load_replay_case: parses and validates `json_text` (format, name,
// optimizer, steps, per-step lists, params) without touching the disk. `dir` only names the
// case (rc.dir, the default name, and "DIR/case.json" in messages); init, grads and expected
// stay empty. load_replay_case calls this first; the fuzzer (fuzz/fuzz_replay_case.cc) calls it
// directly.
ReplayCase parse_replay_case_json(const std::string& json_text, const std::string& dir);

struct ReplayResult {
  std::string backend;  // Backend::describe()
  // Steps this replay applied and skipped, summed over the groups (a one-group case: its steps).
  int64_t steps_applied = 0;
  int64_t steps_skipped = 0;
  std::string fingerprint;                      // combine_fingerprints(group_fingerprints)
  std::vector<std::string> group_fingerprints;  // Task::fingerprint() of each group
  std::vector<int64_t> group_step_counts;       // each group's final applied-step count
  std::vector<size_t> group_task;               // the Task each group ran in (replay_tasks' index)
  std::vector<bool> group_masked;               // whether that Task ran with TaskOptions::tensor_mask
  // Per parameter: its applied-step count at the end (its group's count where the Task has no mask).
  std::vector<int64_t> tensor_steps;
  size_t num_tasks = 0;
  bool has_m = false;  // some group's kind keeps M (V)
  bool has_v = false;
  // Per parameter; m[i], v[i] are empty where the parameter's group keeps no M (V).
  std::vector<std::vector<float>> w, m, v;
  std::vector<bool> param_has_m, param_has_v;
  Precision precision = Precision::kFp32;  // the model copy's dtype (fp32: c is empty)
  std::vector<std::vector<uint16_t>> c;      // per parameter: its model copy
};

struct TensorComparison {
  std::string name;  // the parameter name, or m/NAME, v/NAME
  int64_t numel = 0;
  double rel_l2 = 0.0;   // ||got - ref|| / ||ref|| in double (||got - ref|| when ref is zero)
  double max_abs = 0.0;  // largest |got - ref|
  bool finite = true;    // every element of `got` is finite
  // c/NAME (the model copy) is compared bit for bit: `mismatched` elements differ, and rel_l2 is
  // 0 when none does, +inf otherwise (so any tolerance fails it).
  bool bitwise = false;
  int64_t mismatched = 0;
};

// Whether the result has the case's expected fingerprint (true when the case has none).
bool fingerprint_matches(const ReplayCase& replay, const ReplayResult& result);

// The parameters whose final step count differs from their group's expected_tensor_steps, as
// "NAME: expected A, got B" (empty when every group that gives them matches, or none does).
std::vector<std::string> tensor_step_mismatches(const ReplayCase& replay, const ReplayResult& result);

// Compares a result with expected.safetensors (empty when the case has none), in tensor order.
std::vector<TensorComparison> compare_replay(const ReplayCase& replay, const ReplayResult& result);

// Writes the final weights (by parameter name) and m/NAME, v/NAME where present, as F32, and
// c/NAME, the model copy, as BF16 / F16 when the case has one, atomically (see write_safetensors).
void write_replay_result(const std::string& path, const ReplayCase& replay, const ReplayResult& result);

}  // namespace renaissance
