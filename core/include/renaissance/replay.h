// Replay cases (format `renaissance-replay/1`, docs/replay-format.md): a recorded optimizer
// run (initial weights, per-step gradients, learning rates and loss scales) that any backend can
// re-run and compare with a float64 reference. The same code serves `renaissance replay` and the
// tests. Loading validates the whole case (case.json, and every header and tensor of the
// safetensors files) before anything runs, so a broken case never produces output.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "renaissance/safetensors.h"
#include "renaissance/task.h"

namespace renaissance {

constexpr const char* kReplayFormat = "renaissance-replay/1";

struct ReplayCase {
  std::string dir;
  std::string name;
  OptimizerConfig config;
  int64_t steps = 0;
  std::vector<double> lr_per_step;          // `steps` entries (optimizer.lr when not given)
  std::vector<double> loss_scale_per_step;  // `steps` entries (1 when not given)
  std::vector<ParamSpec> params;
  std::vector<std::vector<float>> init;  // per parameter
  // Gradients are validated at load time but read step by step while running, so a long case
  // does not need all of them in memory at once.
  std::shared_ptr<SafetensorsReader> grads;
  // expected.safetensors, when the case has one: per parameter, plus "m/NAME" / "v/NAME" entries
  // where the reference records optimizer state.
  bool has_expected = false;
  std::map<std::string, std::vector<double>> expected;

  static std::string grad_name(int64_t step, const std::string& param) {
    return "step" + std::to_string(step) + "/" + param;
  }
};

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
  int64_t steps_applied = 0;
  int64_t steps_skipped = 0;
  std::string fingerprint;
  bool has_m = false;
  bool has_v = false;
  std::vector<std::vector<float>> w, m, v;  // per parameter; m, v empty when the kind has none
};

// Runs the case on a fresh Task: per step set_lr, set_loss_scale, set_grad for every tensor, step().
ReplayResult run_replay(const ReplayCase& replay, const TaskOptions& options);

struct TensorComparison {
  std::string name;  // the parameter name, or m/NAME, v/NAME
  int64_t numel = 0;
  double rel_l2 = 0.0;   // ||got - ref|| / ||ref|| in double (||got - ref|| when ref is zero)
  double max_abs = 0.0;  // largest |got - ref|
  bool finite = true;    // every element of `got` is finite
};

// Compares a result with expected.safetensors (empty when the case has none), in tensor order.
std::vector<TensorComparison> compare_replay(const ReplayCase& replay, const ReplayResult& result);

// Writes the final weights (by parameter name) and m/NAME, v/NAME where present, as F32,
// atomically (see write_safetensors).
void write_replay_result(const std::string& path, const ReplayCase& replay, const ReplayResult& result);

}  // namespace renaissance
