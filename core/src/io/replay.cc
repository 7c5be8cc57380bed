// Replay cases: loading and validating a case directory, running it through the Task API and
// comparing the result with the float64 reference. The checks here are the user-facing ones for
// files written by other tools, so each names the file, the tensor or the key.
#include "renaissance/replay.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/src/io/file_checks.h"
#include "renaissance/error.h"
#include "renaissance/layout.h"

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

OptimizerConfig parse_optimizer(const nlohmann::json& o, const std::string& file) {
  const std::string where = file + ": optimizer";
  if (!o.is_object()) throw_format(where + " must be an object");
  if (!o.contains("kind") || !o["kind"].is_string()) throw_format(where + ".kind is missing or not a string (expected one of " + kind_list() + ")");
  const std::string kind_text = o["kind"].get<std::string>();
  OptimizerKind kind;
  if (!parse_optimizer_kind(kind_text, &kind)) {
    throw_format(where + ".kind: unknown optimizer kind " + sq(kind_text) + " (expected one of " + kind_list() + ")");
  }
  OptimizerConfig c = default_config(kind);
  const std::pair<const char*, double*> numbers[] = {
      {"lr", &c.lr},     {"weight_decay", &c.weight_decay}, {"momentum", &c.momentum},
      {"beta1", &c.beta1}, {"beta2", &c.beta2},             {"eps", &c.eps},
      {"trust_coefficient", &c.trust_coefficient}, {"max_grad_norm", &c.max_grad_norm}};
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
    bool known = false;
    for (const auto& n : numbers) {
      if (key == n.first) {
        if (!it.value().is_number()) throw_format(where + "." + key + " = " + it.value().dump() + " is not a number");
        *n.second = it.value().get<double>();
        known = true;
      }
    }
    if (!known) {
      throw_format(where + ": unknown key " + sq(key) +
                    " (expected kind, lr, weight_decay, momentum, beta1, beta2, eps, trust_coefficient, max_grad_norm, "
                   "weight_decay_mode)");
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
std::vector<double> parse_per_step(const nlohmann::json& j, const char* key, int64_t steps, const std::string& file,
                                   void (*check)(double)) {
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

}  // namespace

namespace {
std::string strip_trailing_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}
}  // namespace

ReplayCase parse_replay_case_json(const std::string& json_text, const std::string& dir_in) {
  ReplayCase rc;
  const std::string dir = strip_trailing_slashes(dir_in);
  rc.dir = dir;
  const std::string case_path = dir + "/case.json";
  if (json_text.empty()) throw_format(case_path + ": empty file");
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw_format(case_path + ": not valid JSON");
  if (!j.is_object()) throw_format(case_path + ": must be a JSON object");

  static const std::set<std::string> kKeys = {"format", "name", "optimizer", "steps", "lr_per_step",
                                              "loss_scale_per_step", "params"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!kKeys.count(it.key())) {
      throw_format(case_path + ": unknown key " + sq(it.key()) +
                   " (expected format, name, optimizer, steps, lr_per_step, loss_scale_per_step, params)");
    }
  }
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != kReplayFormat) {
    throw_format(case_path + ": format must be \"" + kReplayFormat + "\", got " +
                 (j.contains("format") ? j["format"].dump() : std::string("nothing")));
  }
  if (j.contains("name")) {
    if (!j["name"].is_string()) throw_format(case_path + ": name must be a string");
    rc.name = j["name"].get<std::string>();
  } else {
    const size_t slash = dir.find_last_of('/');
    rc.name = slash == std::string::npos ? dir : dir.substr(slash + 1);
  }
  if (!j.contains("optimizer")) throw_format(case_path + ": missing key 'optimizer'");
  rc.config = parse_optimizer(j["optimizer"], case_path);
  // Each step needs its gradients in grads.safetensors, and each tensor costs that file's header
  // (at most kMaxSafetensorsHeaderBytes) over 50 bytes ("step0/a":{"dtype":"F32","shape":[],
  // "data_offsets":[0,4]}), so no loadable case has more steps than this. The bound is checked
  // here because the per-step lists below are sized from `steps` before grads.safetensors is
  // opened: 2^30 steps used to allocate 16 GB for a 100-byte case.json (fuzz/regressions/).
  constexpr uint64_t kMaxSteps = kMaxSafetensorsHeaderBytes / 32;
  if (!j.contains("steps") || !j["steps"].is_number_unsigned() || j["steps"].get<uint64_t>() > kMaxSteps) {
    throw_format(case_path + ": steps must be a non-negative integer of at most " + std::to_string(kMaxSteps) +
                 ", got " + (j.contains("steps") ? j["steps"].dump() : std::string("nothing")));
  }
  rc.steps = j["steps"].get<int64_t>();
  rc.lr_per_step = j.contains("lr_per_step")
                       ? parse_per_step(j["lr_per_step"], "lr_per_step", rc.steps, case_path, &check_lr)
                       : std::vector<double>(static_cast<size_t>(rc.steps), rc.config.lr);
  rc.loss_scale_per_step = j.contains("loss_scale_per_step")
                               ? parse_per_step(j["loss_scale_per_step"], "loss_scale_per_step", rc.steps, case_path,
                                                &check_loss_scale)
                               : std::vector<double>(static_cast<size_t>(rc.steps), 1.0);
  if (!j.contains("params")) throw_format(case_path + ": missing key 'params'");
  // The parameter list has the layout format; reuse its parser and its messages.
  rc.params = parse_layout(nlohmann::json{{"params", j["params"]}}.dump(), case_path).params;
  return rc;
}

ReplayCase load_replay_case(const std::string& dir_in) {
  const std::string dir = strip_trailing_slashes(dir_in);
  const std::string case_path = dir + "/case.json";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw_io(case_path + ": cannot open (is " + sq(io::printable(dir_in)) + " a replay case directory?)");
  }
  ReplayCase rc = parse_replay_case_json(io::read_regular_file(case_path, "case file", io::kMaxJsonBytes), dir);

  // init.safetensors: exactly the parameters, F32, declared shapes.
  const SafetensorsReader init(dir + "/init.safetensors");
  std::set<std::string> names;
  for (const ParamSpec& p : rc.params) {
    names.insert(p.name);
    check_tensor(init, p.name, p.shape, /*allow_f64=*/false);
  }
  for (const auto& kv : init.tensors()) {
    if (!names.count(kv.first)) {
      throw_format(init.display_name() + ": tensor " + sq(kv.first) + " is not a parameter of case.json");
    }
  }

  // grads.safetensors: step{t}/{name} for every step and parameter, F32, declared shapes.
  rc.grads = std::make_shared<SafetensorsReader>(dir + "/grads.safetensors");
  for (int64_t t = 0; t < rc.steps; ++t) {
    for (const ParamSpec& p : rc.params) check_tensor(*rc.grads, ReplayCase::grad_name(t, p.name), p.shape, false);
  }
  if (rc.grads->tensors().size() != static_cast<size_t>(rc.steps) * rc.params.size()) {
    std::set<std::string> wanted;
    for (int64_t t = 0; t < rc.steps; ++t) {
      for (const ParamSpec& p : rc.params) wanted.insert(ReplayCase::grad_name(t, p.name));
    }
    for (const auto& kv : rc.grads->tensors()) {
      if (!wanted.count(kv.first)) {
        throw_format(rc.grads->display_name() + ": unexpected tensor " + sq(kv.first) + " (case.json has " +
                     std::to_string(rc.steps) + " steps and names step{t}/{param} for t < steps)");
      }
    }
  }

  // expected.safetensors (optional): every parameter, F32 or F64; m/NAME and v/NAME allowed
  // where the optimizer keeps that state.
  const std::string expected_path = dir + "/expected.safetensors";
  if (optional_file_present(expected_path)) {
    const SafetensorsReader expected(expected_path);
    const PlanConfig families = plan_config_from_optimizer(rc.config.kind);
    for (const ParamSpec& p : rc.params) check_tensor(expected, p.name, p.shape, /*allow_f64=*/true);
    for (const auto& kv : expected.tensors()) {
      const std::string& n = kv.first;
      std::string base = n;
      bool state_ok = false;
      if (n.compare(0, 2, "m/") == 0 || n.compare(0, 2, "v/") == 0) {
        base = n.substr(2);
        state_ok = n[0] == 'm' ? families.has_m : families.has_v;
      }
      if (!names.count(base) || (base != n && !state_ok)) {
        throw_format(expected.display_name() + ": unexpected tensor " + sq(n) +
                     " (expected parameter names, and m/NAME, v/NAME where " + optimizer_kind_name(rc.config.kind) +
                     " keeps that state)");
      }
      if (base != n) {
        for (const ParamSpec& p : rc.params) {
          if (p.name == base) check_tensor(expected, n, p.shape, true);
        }
      }
    }
    for (const auto& kv : expected.tensors()) rc.expected[kv.first] = expected.read_f64(kv.first);
    rc.has_expected = true;
  }

  // Read the initial weights last: every check above is cheap, this is the first bulk read.
  for (const ParamSpec& p : rc.params) rc.init.push_back(init.read_f32(p.name));
  return rc;
}

ReplayResult run_replay(const ReplayCase& rc, const TaskOptions& options) {
  Task task(rc.params, options);
  task.optimizer(rc.config);
  task.compile();
  for (size_t id = 0; id < rc.params.size(); ++id) task.set_weight(id, rc.init[id].data());
  for (int64_t t = 0; t < rc.steps; ++t) {
    task.set_lr(rc.lr_per_step[static_cast<size_t>(t)]);
    task.set_loss_scale(rc.loss_scale_per_step[static_cast<size_t>(t)]);
    for (size_t id = 0; id < rc.params.size(); ++id) {
      const std::vector<float> g = rc.grads->read_f32(ReplayCase::grad_name(t, rc.params[id].name));
      task.set_grad(id, g.data());
    }
    task.step();
  }
  ReplayResult r;
  r.backend = task.backend().describe();
  r.steps_applied = task.step_count();
  r.steps_skipped = task.skipped_steps();
  r.fingerprint = task.fingerprint();
  r.has_m = task.plan().has_family(Family::kM);
  r.has_v = task.plan().has_family(Family::kV);
  for (size_t id = 0; id < rc.params.size(); ++id) {
    const size_t n = static_cast<size_t>(rc.params[id].numel());
    std::vector<float> buf(n);
    task.read(Family::kW, id, buf.data());
    r.w.push_back(buf);
    if (r.has_m) {
      task.read(Family::kM, id, buf.data());
      r.m.push_back(buf);
    }
    if (r.has_v) {
      task.read(Family::kV, id, buf.data());
      r.v.push_back(buf);
    }
  }
  return r;
}

std::vector<TensorComparison> compare_replay(const ReplayCase& rc, const ReplayResult& result) {
  std::vector<TensorComparison> out;
  if (!rc.has_expected) return out;
  auto compare = [&](const std::string& name, const std::vector<float>& got) {
    auto it = rc.expected.find(name);
    if (it == rc.expected.end()) return;
    const std::vector<double>& ref = it->second;
    TensorComparison c;
    c.name = name;
    c.numel = static_cast<int64_t>(got.size());
    double diff2 = 0.0, ref2 = 0.0;
    for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
      const double d = static_cast<double>(got[i]) - ref[i];
      diff2 += d * d;
      ref2 += ref[i] * ref[i];
      c.max_abs = std::max(c.max_abs, std::fabs(d));
      if (!std::isfinite(got[i])) c.finite = false;
    }
    c.rel_l2 = ref2 > 0.0 ? std::sqrt(diff2) / std::sqrt(ref2) : std::sqrt(diff2);
    // A NaN anywhere must fail any tolerance, and comparisons with NaN are false.
    if (!c.finite || std::isnan(c.rel_l2)) c.rel_l2 = INFINITY;
    out.push_back(c);
  };
  for (size_t id = 0; id < rc.params.size(); ++id) compare(rc.params[id].name, result.w[id]);
  for (size_t id = 0; id < rc.params.size() && result.has_m; ++id) compare("m/" + rc.params[id].name, result.m[id]);
  for (size_t id = 0; id < rc.params.size() && result.has_v; ++id) compare("v/" + rc.params[id].name, result.v[id]);
  return out;
}

void write_replay_result(const std::string& path, const ReplayCase& rc, const ReplayResult& result) {
  std::vector<StTensorView> views;
  for (size_t id = 0; id < rc.params.size(); ++id) {
    const ParamSpec& p = rc.params[id];
    views.push_back({p.name, StDtype::kF32, p.shape, result.w[id].data()});
    if (result.has_m) views.push_back({"m/" + p.name, StDtype::kF32, p.shape, result.m[id].data()});
    if (result.has_v) views.push_back({"v/" + p.name, StDtype::kF32, p.shape, result.v[id].data()});
  }
  write_safetensors(path, views,
                    {{"format", "renaissance-replay-result/1"},
                     {"case", rc.name},
                     {"backend", result.backend},
                     {"steps_applied", std::to_string(result.steps_applied)},
                     {"steps_skipped", std::to_string(result.steps_skipped)},
                     {"fingerprint", result.fingerprint}});
}

}  // namespace renaissance
