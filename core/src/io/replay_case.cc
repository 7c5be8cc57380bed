// Replay cases: loading and validating a case directory (formats 1 and 2). Running one is the
// runtime's (runtime/src/replay_run.cc); comparing the result and combine_fingerprints are in
// replay_result.cc. The checks here are the user-facing ones for
// files written by other tools, so each names the file, the tensor or the key.
#include "renaissance/replay_case.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/src/io/file_checks.h"
#include "core/src/io/replay_keys.h"
#include "renaissance/error.h"
#include "renaissance/fingerprint.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/layout.h"
#include "renaissance/math/precision.h"
#include "renaissance/plan.h"

namespace renaissance {

namespace {

std::string sq(const std::string& s) { return "'" + s + "'"; }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Whether the optional file is there. Only a name that is absent counts as absent: a dangling or
// looping symlink, or a name that cannot be looked up, is an error (a reference that silently
// vanished would make the replay "pass" with nothing compared).
bool optional_file_present(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    throw_io(io::printable(path) + ": cannot look it up: " + std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode) && ::stat(path.c_str(), &st) != 0) {
    throw_io(io::printable(path) + ": a symbolic link that leads nowhere (" + std::strerror(errno) + ")");
  }
  return true;
}

std::string kind_list() {
  std::string s;
  for (int k = 0; k < kNumOptimizerKinds; ++k) s += std::string(k ? ", " : "") + optimizer_kind_name(static_cast<OptimizerKind>(k));
  return s;
}

// The keys of an optimizer object: kind, the table's numbers, weight_decay_mode, its flags.
std::string optimizer_keys() {
  std::string numbers, flags;
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    (row.number != nullptr ? numbers : flags) += std::string(", ") + row.name;
  }
  return "kind" + numbers + ", weight_decay_mode" + flags;
}

// `where` names the object in messages: "DIR/case.json: optimizer" (format 1) or
// "DIR/case.json: groups[1].optimizer" (format 2).
OptimizerConfig parse_optimizer(const nlohmann::json& o, const std::string& where) {
  if (!o.is_object()) throw_format(where + " must be an object");
  if (!o.contains("kind") || !o["kind"].is_string()) throw_format(where + ".kind is missing or not a string (expected one of " + kind_list() + ")");
  const std::string kind_text = o["kind"].get<std::string>();
  OptimizerKind kind;
  if (!parse_optimizer_kind(kind_text, &kind)) {
    throw_format(where + ".kind: unknown optimizer kind " + sq(kind_text) + " (expected one of " + kind_list() + ")");
  }
  OptimizerConfig c = default_config(kind);
  for (auto it = o.begin(); it != o.end(); ++it) {
    const std::string& key = it.key();
    if (key == "kind") continue;
    if (key == "weight_decay_mode") {
      const std::string mode = it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
      if (mode == "decoupled") c.weight_decay_mode = WeightDecayMode::kDecoupled;
      else if (mode == "l2") c.weight_decay_mode = WeightDecayMode::kL2;
      else throw_format(where + ".weight_decay_mode: unknown mode " + sq(mode) + " (expected decoupled or l2)");
      continue;
    }
    // The hyperparameter table's keys: a number, or a flag (true / false); absent: the default.
    const HyperparameterInfo* row = find_hyperparameter(key);
    if (row == nullptr) {
      throw_format(where + ": unknown key " + sq(key) + " (expected " + optimizer_keys() + ")");
    }
    if (row->number != nullptr) {
      if (!it.value().is_number()) throw_format(where + "." + key + " = " + it.value().dump() + " is not a number");
      c.*row->number = it.value().get<double>();
    } else {
      if (!it.value().is_boolean()) throw_format(where + "." + key + " = " + it.value().dump() + " is not true or false");
      c.*row->flag_field = it.value().get<bool>();
    }
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw_format(where + ": " + e.what());
  }
  return c;
}

// A per-step list of `steps` numbers, each checked by `check` (check_lr / check_loss_scale).
std::vector<double> parse_per_step(const nlohmann::json& j, const std::string& key, int64_t steps,
                                   const std::string& file, void (*check)(double)) {
  const std::string where = file + ": " + key;
  if (!j.is_array()) throw_format(where + " must be an array of numbers");
  if (static_cast<int64_t>(j.size()) != steps) {
    throw_format(where + " has " + std::to_string(j.size()) + " entries but steps is " + std::to_string(steps));
  }
  std::vector<double> out;
  for (size_t t = 0; t < j.size(); ++t) {
    if (!j[t].is_number()) throw_format(where + "[" + std::to_string(t) + "] = " + j[t].dump() + " is not a number");
    const double v = j[t].get<double>();
    try {
      check(v);
    } catch (const Error& e) {
      throw_format(where + "[" + std::to_string(t) + "]: " + e.what());
    }
    out.push_back(v);
  }
  return out;
}

// A tensor of `file` that must exist with dtype F32 (or F64 when allowed) and the given shape.
void check_tensor(const SafetensorsReader& file, const std::string& name, const std::vector<int64_t>& shape,
                  bool allow_f64) {
  if (!file.has(name)) throw_format(file.display_name() + ": missing tensor " + sq(name));
  const StTensorInfo& t = file.info(name);
  if (t.dtype != StDtype::kF32 && !(allow_f64 && t.dtype == StDtype::kF64)) {
    throw_format(file.display_name() + ": tensor " + sq(name) + " has dtype " + st_dtype_name(t.dtype) +
                 (allow_f64 ? "; expected F32 or F64" : "; expected F32"));
  }
  if (t.shape != shape) {
    throw_format(file.display_name() + ": tensor " + sq(name) + " has shape " + shape_text(t.shape) +
                 " but case.json declares " + shape_text(shape));
  }
}

// A gradient tensor: F32, or the case's model dtype (BF16 / F16) when it has a model copy.
void check_grad_tensor(const SafetensorsReader& file, const std::string& name, const std::vector<int64_t>& shape,
                       Precision precision) {
  if (precision != Precision::kFp32 && file.has(name) && file.info(name).dtype == st_dtype_of(precision)) {
    const StTensorInfo& t = file.info(name);
    if (t.shape != shape) {
      throw_format(file.display_name() + ": tensor " + sq(name) + " has shape " + shape_text(t.shape) +
                   " but case.json declares " + shape_text(shape));
    }
    return;
  }
  if (file.has(name) && file.info(name).dtype != StDtype::kF32) {
    throw_format(file.display_name() + ": tensor " + sq(name) + " has dtype " + st_dtype_name(file.info(name).dtype) +
                 "; expected F32" +
                 (precision == Precision::kFp32 ? std::string(" (BF16 / F16 gradients need case.json's precision bf16 / fp16)")
                                                : std::string(" or ") + st_dtype_name(st_dtype_of(precision)) +
                                                      " (the case's precision " + precision_name(precision) + ")"));
  }
  check_tensor(file, name, shape, /*allow_f64=*/false);
}

}  // namespace

namespace {
std::string strip_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}
}  // namespace

namespace {

std::string dump_or_nothing(const nlohmann::json& j, const char* key) {
  return j.contains(key) ? j[key].dump() : std::string("nothing");
}

// Each step needs its gradients in grads.safetensors, and each tensor costs that file's header
// (at most kMaxSafetensorsHeaderBytes) over 50 bytes ("step0/a":{"dtype":"F32","shape":[],
// "data_offsets":[0,4]}), so no loadable case has more steps than this. The bound is checked
// here because the per-step lists are sized from `steps` before grads.safetensors is opened:
// unchecked, 2^30 steps would allocate 16 GB for a 100-byte case.json (fuzz/regressions/).
int64_t parse_steps(const nlohmann::json& j, const std::string& case_path) {
  constexpr uint64_t kMaxSteps = kMaxSafetensorsHeaderBytes / 32;
  if (!j.contains("steps") || !j["steps"].is_number_unsigned() || j["steps"].get<uint64_t>() > kMaxSteps) {
    throw_format(case_path + ": steps must be a non-negative integer of at most " + std::to_string(kMaxSteps) +
                 ", got " + dump_or_nothing(j, "steps"));
  }
  return j["steps"].get<int64_t>();
}

void check_keys(const nlohmann::json& j, const std::set<std::string>& keys, const std::string& where,
                const std::string& expected, const std::string& hint = "") {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!keys.count(it.key())) throw_format(where + ": unknown key " + sq(it.key()) + " (expected " + expected + ")" + hint);
  }
}

// initial_step: the applied-step count the initial state was taken at. Bounded so that the
// count after the case's steps still fits the device's int32 counter.
int64_t parse_initial_step(const nlohmann::json& v, const std::string& where, int64_t steps) {
  const uint64_t max = static_cast<uint64_t>(INT32_MAX) - static_cast<uint64_t>(steps);
  if (!v.is_number_unsigned() || v.get<uint64_t>() > max) {
    throw_format(where + " must be a non-negative integer of at most 2^31 - 1 - steps = " + std::to_string(max) +
                 ", got " + v.dump());
  }
  return v.get<int64_t>();
}

void parse_format1(const nlohmann::json& j, const std::string& case_path, ReplayCase& rc) {
  check_keys(j, {"format", "name", "optimizer", "steps", "lr_per_step", "loss_scale_per_step", "params", "tolerance"},
             case_path, "format, name, optimizer, steps, lr_per_step, loss_scale_per_step, params, tolerance",
             j.contains("groups") || j.contains("initial_step") || j.contains("expected_fingerprint") ||
                     j.contains("precision") || j.contains("rounding") || j.contains("seed") || j.contains("no_grad_per_step")
                 ? std::string("; groups, initial_step, expected_fingerprint, precision, rounding, seed and no_grad_per_step "
                               "need format \"") +
                       kReplayFormat2 + "\""
                 : std::string());
  if (!j.contains("optimizer")) throw_format(case_path + ": missing key 'optimizer'");
  ReplayGroup g;
  g.config = parse_optimizer(j["optimizer"], case_path + ": optimizer");
  rc.steps = parse_steps(j, case_path);
  g.lr_per_step = j.contains("lr_per_step")
                      ? parse_per_step(j["lr_per_step"], "lr_per_step", rc.steps, case_path, &check_lr)
                      : std::vector<double>(static_cast<size_t>(rc.steps), g.config.lr);
  rc.loss_scale_per_step = j.contains("loss_scale_per_step")
                               ? parse_per_step(j["loss_scale_per_step"], "loss_scale_per_step", rc.steps, case_path,
                                                &check_loss_scale)
                               : std::vector<double>(static_cast<size_t>(rc.steps), 1.0);
  if (!j.contains("params")) throw_format(case_path + ": missing key 'params'");
  // The parameter list has the layout format; reuse its parser and its messages.
  rc.params = parse_layout(nlohmann::json{{"params", j["params"]}}.dump(), case_path).params;
  g.num_params = rc.params.size();
  rc.groups.push_back(std::move(g));
}

void parse_format2(const nlohmann::json& j, const std::string& case_path, ReplayCase& rc) {
  check_keys(j, {"format", "name", "steps", "loss_scale_per_step", "initial_step", "expected_fingerprint", "groups",
                 "precision", "rounding", "seed", "no_grad_per_step", "tolerance"},
             case_path,
             "format, name, steps, loss_scale_per_step, initial_step, expected_fingerprint, groups, precision, rounding, "
             "seed, no_grad_per_step, tolerance",
             j.contains("optimizer") || j.contains("params") || j.contains("lr_per_step")
                 ? std::string("; in format 2, optimizer, params and lr_per_step belong to each entry of groups")
                 : std::string());
  rc.steps = parse_steps(j, case_path);
  rc.precision = replay_keys::parse_precision_keys(j, case_path);
  rc.loss_scale_per_step = j.contains("loss_scale_per_step")
                               ? parse_per_step(j["loss_scale_per_step"], "loss_scale_per_step", rc.steps, case_path,
                                                &check_loss_scale)
                               : std::vector<double>(static_cast<size_t>(rc.steps), 1.0);
  const int64_t initial_step =
      j.contains("initial_step") ? parse_initial_step(j["initial_step"], case_path + ": initial_step", rc.steps) : 0;
  if (j.contains("expected_fingerprint")) {
    const nlohmann::json& f = j["expected_fingerprint"];
    if (!f.is_string() || !is_fingerprint_text(f.get<std::string>())) {
      throw_format(case_path + ": expected_fingerprint must be 16 lowercase hex digits (as `renaissance replay` prints), got " +
                   f.dump());
    }
    rc.expected_fingerprint = f.get<std::string>();
  }
  if (!j.contains("groups")) throw_format(case_path + ": missing key 'groups'");
  const nlohmann::json& groups = j["groups"];
  if (!groups.is_array() || groups.empty()) throw_format(case_path + ": groups must be a non-empty array of objects");
  std::map<std::string, size_t> group_of_name;
  for (size_t i = 0; i < groups.size(); ++i) {
    const nlohmann::json& gj = groups[i];
    const std::string key = "groups[" + std::to_string(i) + "]";
    const std::string where = case_path + ": " + key;
    if (!gj.is_object()) throw_format(where + " must be an object with optimizer and params");
    check_keys(gj, {"optimizer", "params", "lr_per_step", "initial_step", "initial_tensor_steps", "expected_tensor_steps"},
               where, "optimizer, params, lr_per_step, initial_step, initial_tensor_steps, expected_tensor_steps");
    if (!gj.contains("optimizer")) throw_format(where + ": missing key 'optimizer'");
    ReplayGroup g;
    g.config = parse_optimizer(gj["optimizer"], where + ".optimizer");
    g.lr_per_step = gj.contains("lr_per_step")
                        ? parse_per_step(gj["lr_per_step"], key + ".lr_per_step", rc.steps, case_path, &check_lr)
                        : std::vector<double>(static_cast<size_t>(rc.steps), g.config.lr);
    g.initial_step =
        gj.contains("initial_step") ? parse_initial_step(gj["initial_step"], where + ".initial_step", rc.steps) : initial_step;
    if (!gj.contains("params")) throw_format(where + ": missing key 'params'");
    std::vector<ParamSpec> params = parse_layout(nlohmann::json{{"params", gj["params"]}}.dump(), where).params;
    // Tensors in the case's files are named by parameter alone, so a name may appear once in the
    // whole case.
    for (size_t k = 0; k < params.size(); ++k) {
      auto seen = group_of_name.emplace(params[k].name, i);
      if (!seen.second) {
        throw_format(where + ": params[" + std::to_string(k) + "] " + sq(io::printable(params[k].name)) +
                     ": the name is also a parameter of groups[" + std::to_string(seen.first->second) +
                     "] (names must be unique in the case)");
      }
    }
    g.first_param = rc.params.size();
    g.num_params = params.size();
    // Per-tensor counts. The initial ones leave the case's steps room in the int32
    // counter, as initial_step does.
    if (gj.contains("initial_tensor_steps")) {
      g.initial_tensor_steps = replay_keys::parse_tensor_steps(gj["initial_tensor_steps"], where + ".initial_tensor_steps",
                                                               g.num_params, INT32_MAX - rc.steps);
    }
    if (gj.contains("expected_tensor_steps")) {
      g.expected_tensor_steps = replay_keys::parse_tensor_steps(gj["expected_tensor_steps"], where + ".expected_tensor_steps",
                                                                g.num_params, INT32_MAX);
    }
    for (ParamSpec& p : params) rc.params.push_back(std::move(p));
    rc.groups.push_back(std::move(g));
  }
  try {
    check_layout_limits(rc.params);  // the whole case, as one layout's limits
  } catch (const Error& e) {
    throw_format(case_path + ": groups: " + e.what());
  }
  if (j.contains("no_grad_per_step")) replay_keys::parse_no_grad(j["no_grad_per_step"], case_path, rc);
}

}  // namespace

const ReplayGroup& ReplayCase::group_of(size_t id) const {
  for (const ReplayGroup& g : groups) {
    if (id >= g.first_param && id < g.first_param + g.num_params) return g;
  }
  throw_invalid("parameter id " + std::to_string(id) + " is in no group of the case");
}

ReplayCase parse_replay_case_json(const std::string& json_text, const std::string& dir_in) {
  ReplayCase rc;
  const std::string dir = strip_trailing_slashes(dir_in);
  rc.dir = dir;
  const std::string case_path = dir + "/case.json";
  if (json_text.empty()) throw_format(case_path + ": empty file");
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw_format(case_path + ": not valid JSON");
  if (!j.is_object()) throw_format(case_path + ": must be a JSON object");

  const std::string format = j.contains("format") && j["format"].is_string() ? j["format"].get<std::string>() : "";
  if (format == kReplayFormat) {
    rc.format = 1;
  } else if (format == kReplayFormat2) {
    rc.format = 2;
  } else {
    throw_format(case_path + ": format must be \"" + kReplayFormat + "\" or \"" + kReplayFormat2 + "\", got " +
                 dump_or_nothing(j, "format"));
  }
  if (j.contains("name")) {
    if (!j["name"].is_string()) throw_format(case_path + ": name must be a string");
    rc.name = j["name"].get<std::string>();
  } else {
    const size_t slash = dir.find_last_of('/');
    rc.name = slash == std::string::npos ? dir : dir.substr(slash + 1);
  }
  if (rc.format == 1) parse_format1(j, case_path, rc);
  else parse_format2(j, case_path, rc);
  // The case's own tolerance for the comparison with expected.safetensors (used unless the caller
  // gives one): a reference that the library is not meant to meet within the default, such as a
  // float64 Newton–Schulz against the exact-mode one.
  if (j.contains("tolerance")) {
    const nlohmann::json& t = j["tolerance"];
    if (!t.is_number() || !std::isfinite(t.get<double>()) || !(t.get<double>() > 0.0)) {
      throw_format(case_path + ": tolerance must be a finite number > 0, got " + t.dump());
    }
    rc.tolerance = t.get<double>();
  }
  return rc;
}

namespace {

// init.safetensors: exactly the parameters (`names`), F32, declared shapes; in format 2 also
// m/NAME and v/NAME (the initial state) where the group's kind keeps it, for all or none of a
// group (rc.has_init_m, has_init_v say which).
void check_init_file(const SafetensorsReader& init, const std::set<std::string>& names, ReplayCase& rc) {
  for (const ParamSpec& p : rc.params) check_tensor(init, p.name, p.shape, /*allow_f64=*/false);
  for (const auto& kv : init.tensors()) {
    const std::string& n = kv.first;
    const bool state = rc.format == 2 && (n.compare(0, 2, "m/") == 0 || n.compare(0, 2, "v/") == 0);
    if (!names.count(state ? n.substr(2) : n)) {
      throw_format(init.display_name() + ": tensor " + sq(n) + " is not a parameter of case.json" +
                   (rc.format == 2 ? " (nor m/NAME, v/NAME of one)" : ""));
    }
  }
  rc.has_init_m.assign(rc.params.size(), false);
  rc.has_init_v.assign(rc.params.size(), false);
  for (size_t gi = 0; gi < rc.groups.size() && rc.format == 2; ++gi) {
    const ReplayGroup& g = rc.groups[gi];
    const PlanConfig families = plan_config_from_optimizer(g.config.kind);
    for (const char* prefix : {"m/", "v/"}) {
      const bool kept = prefix[0] == 'm' ? families.has(Family::kM) : families.has(Family::kV);
      size_t present = 0;
      for (size_t id = g.first_param; id < g.first_param + g.num_params; ++id) {
        if (init.has(prefix + rc.params[id].name)) ++present;
      }
      if (present == 0) continue;
      const std::string what = std::string("groups[") + std::to_string(gi) + "] (" + optimizer_kind_name(g.config.kind) + ")";
      if (!kept) {
        throw_format(init.display_name() + ": has " + prefix + "NAME tensors for " + what + ", whose kind keeps no " +
                     (prefix[0] == 'm' ? "M" : "V"));
      }
      if (present != g.num_params) {
        throw_format(init.display_name() + ": has " + prefix + "NAME for " + std::to_string(present) + " of the " +
                     std::to_string(g.num_params) + " parameters of " + what + " (all or none)");
      }
      for (size_t id = g.first_param; id < g.first_param + g.num_params; ++id) {
        check_tensor(init, prefix + rc.params[id].name, rc.params[id].shape, /*allow_f64=*/false);
        (prefix[0] == 'm' ? rc.has_init_m : rc.has_init_v)[id] = true;
      }
    }
  }
}

// grads.safetensors: step{t}/{name} for every step and parameter, F32 (or the model dtype),
// declared shapes; none for a parameter that had no gradient at that step (no_grad_per_step).
void check_grads_file(const ReplayCase& rc) {
  size_t wanted_count = 0;
  for (int64_t t = 0; t < rc.steps; ++t) {
    for (size_t id = 0; id < rc.params.size(); ++id) {
      const std::string name = ReplayCase::grad_name(t, rc.params[id].name);
      if (!rc.masked(t, id)) {
        check_grad_tensor(*rc.grads, name, rc.params[id].shape, rc.precision.precision);
        ++wanted_count;
      } else if (rc.grads->has(name)) {
        throw_format(rc.grads->display_name() + ": tensor " + sq(name) + " is there, but case.json's no_grad_per_step[" +
                     std::to_string(t) + "] says " + sq(rc.params[id].name) + " had no gradient at that step");
      }
    }
  }
  if (rc.grads->tensors().size() == wanted_count) return;
  std::set<std::string> wanted;
  for (int64_t t = 0; t < rc.steps; ++t) {
    for (size_t id = 0; id < rc.params.size(); ++id) {
      if (!rc.masked(t, id)) wanted.insert(ReplayCase::grad_name(t, rc.params[id].name));
    }
  }
  for (const auto& kv : rc.grads->tensors()) {
    if (!wanted.count(kv.first)) {
      throw_format(rc.grads->display_name() + ": unexpected tensor " + sq(kv.first) + " (case.json has " +
                   std::to_string(rc.steps) + " steps and names step{t}/{param} for t < steps)");
    }
  }
}

// expected.safetensors' model copy c/NAME: the case's dtype, the parameter's shape (compared bit
// for bit).
void check_expected_copy(const SafetensorsReader& expected, const std::string& n, const ReplayCase& rc) {
  const StTensorInfo& t = expected.info(n);
  for (const ParamSpec& p : rc.params) {
    if (p.name != n.substr(2)) continue;
    if (t.dtype != st_dtype_of(rc.precision.precision)) {
      throw_format(expected.display_name() + ": tensor " + sq(n) + " has dtype " + st_dtype_name(t.dtype) +
                   "; the model copy of a " + precision_name(rc.precision.precision) + " case is " +
                   st_dtype_name(st_dtype_of(rc.precision.precision)));
    }
    if (t.shape != p.shape) {
      throw_format(expected.display_name() + ": tensor " + sq(n) + " has shape " + shape_text(t.shape) +
                   " but case.json declares " + shape_text(p.shape));
    }
  }
}

// expected.safetensors (optional): every parameter, F32 or F64; m/NAME and v/NAME allowed where
// the parameter's group's optimizer keeps that state; c/NAME with a model copy. Read into rc.
void read_expected_file(const std::string& expected_path, const std::set<std::string>& names, ReplayCase& rc) {
  const SafetensorsReader expected(expected_path);
  std::map<std::string, OptimizerKind> kind_of;
  for (size_t id = 0; id < rc.params.size(); ++id) kind_of[rc.params[id].name] = rc.group_of(id).config.kind;
  for (const ParamSpec& p : rc.params) check_tensor(expected, p.name, p.shape, /*allow_f64=*/true);
  for (const auto& kv : expected.tensors()) {
    const std::string& n = kv.first;
    std::string base = n;
    bool state_ok = false;
    if (n.compare(0, 2, "c/") == 0 && rc.precision.precision != Precision::kFp32 && names.count(n.substr(2))) {
      check_expected_copy(expected, n, rc);
      continue;
    }
    if (n.compare(0, 2, "m/") == 0 || n.compare(0, 2, "v/") == 0) {
      base = n.substr(2);
      if (kind_of.count(base)) {
        const PlanConfig families = plan_config_from_optimizer(kind_of[base]);
        state_ok = n[0] == 'm' ? families.has(Family::kM) : families.has(Family::kV);
      }
    }
    if (!names.count(base) || (base != n && !state_ok)) {
      throw_format(expected.display_name() + ": unexpected tensor " + sq(n) +
                   " (expected parameter names, and m/NAME, v/NAME where " +
                   (kind_of.count(base) ? optimizer_kind_name(kind_of[base]) : "the kind") + " keeps that state" +
                   (rc.precision.precision != Precision::kFp32 ? ", c/NAME: the model copy" : ", c/NAME with precision bf16 / fp16") +
                   ")");
    }
    if (base != n) {
      for (const ParamSpec& p : rc.params) {
        if (p.name == base) check_tensor(expected, n, p.shape, true);
      }
    }
  }
  for (const auto& kv : expected.tensors()) {
    if (kv.first.compare(0, 2, "c/") == 0) rc.expected_copy[kv.first] = expected.read_encodings(kv.first, rc.precision.precision);
    else rc.expected[kv.first] = expected.read_f64(kv.first);
  }
  rc.has_expected = true;
}

}  // namespace

ReplayCase load_replay_case(const std::string& dir_in) {
  const std::string dir = strip_trailing_slashes(dir_in);
  const std::string case_path = dir + "/case.json";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw_io(case_path + ": cannot open (is " + sq(io::printable(dir_in)) + " a replay case directory?)");
  }
  ReplayCase rc = parse_replay_case_json(io::read_regular_file(case_path, "case file", io::kMaxJsonBytes), dir);
  const SafetensorsReader init(dir + "/init.safetensors");
  std::set<std::string> names;
  for (const ParamSpec& p : rc.params) names.insert(p.name);
  check_init_file(init, names, rc);
  rc.grads = std::make_shared<SafetensorsReader>(dir + "/grads.safetensors");
  check_grads_file(rc);
  const std::string expected_path = dir + "/expected.safetensors";
  if (optional_file_present(expected_path)) read_expected_file(expected_path, names, rc);

  // Read the initial weights and state last: every check above is cheap, this is the first bulk read.
  rc.init_m.resize(rc.params.size());
  rc.init_v.resize(rc.params.size());
  for (size_t id = 0; id < rc.params.size(); ++id) {
    rc.init.push_back(init.read_f32(rc.params[id].name));
    if (rc.has_init_m[id]) rc.init_m[id] = init.read_f32("m/" + rc.params[id].name);
    if (rc.has_init_v[id]) rc.init_v[id] = init.read_f32("v/" + rc.params[id].name);
  }
  return rc;
}

}  // namespace renaissance
