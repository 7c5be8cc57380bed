// Layout JSON parsing and the built-in layouts. Layout files are hand-edited by users, so every
// error names the source, the parameter (by index and name) and the offending key and value.
#include "renaissance/layout.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/src/io/embedded_layouts.h"
#include "core/src/io/file_checks.h"
#include "renaissance/error.h"

namespace renaissance {

namespace {

std::string sq(const std::string& s) { return "'" + s + "'"; }

std::string role_list() {
  std::string s;
  for (int r = 0; r < kNumRoles; ++r) s += std::string(r ? ", " : "") + role_name(static_cast<Role>(r));
  return s;
}

}  // namespace

void check_layout_limits(const std::vector<ParamSpec>& params) {
  if (params.size() > kMaxParams) {
    throw_invalid(std::to_string(params.size()) + " parameters, more than the " + std::to_string(kMaxParams) + " allowed");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    const std::string at = "parameter " + std::to_string(i);
    if (p.name.size() > kMaxParamNameBytes) {
      throw_invalid(at + ": name of " + std::to_string(p.name.size()) + " bytes, more than the " +
                    std::to_string(kMaxParamNameBytes) + " allowed");
    }
    if (p.shape.size() > kMaxParamRank) {
      throw_invalid(at + " " + sq(io::printable(p.name)) + ": rank " + std::to_string(p.shape.size()) +
                    ", more than the " + std::to_string(kMaxParamRank) + " allowed");
    }
  }
}

int64_t Layout::total_numel() const {
  int64_t n = 0;
  for (const ParamSpec& p : params) n += p.numel();
  return n;
}

Layout parse_layout(const std::string& json_text, const std::string& source) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw_format(source + ": not valid JSON");
  if (!j.is_object()) throw_format(source + ": a layout must be a JSON object with \"name\" and \"params\"");
  for (auto it = j.begin(); it != j.end(); ++it) {
    // "source" and "description" document where a layout comes from; anything else is a typo.
    if (it.key() != "name" && it.key() != "params" && it.key() != "source" && it.key() != "description") {
      throw_format(source + ": unknown key " + sq(it.key()) + " (expected name, params, source, description)");
    }
  }
  Layout layout;
  if (j.contains("name")) {
    if (!j["name"].is_string()) throw_format(source + ": \"name\" must be a string");
    layout.name = j["name"].get<std::string>();
  }
  if (!j.contains("params")) throw_format(source + ": missing key \"params\"");
  const nlohmann::json& params = j["params"];
  if (!params.is_array()) throw_format(source + ": \"params\" must be an array");
  std::set<std::string> seen;
  // The whole layout's element count, bounded like one tensor's (validate_param_specs: its fp32
  // bytes fit int64), so that total_numel() and the arena size computed from it cannot overflow.
  int64_t total = 0;
  constexpr int64_t kMaxTotal = INT64_MAX / 4;
  for (size_t i = 0; i < params.size(); ++i) {
    const nlohmann::json& p = params[i];
    std::string where = source + ": params[" + std::to_string(i) + "]";
    if (!p.is_object()) throw_format(where + ": must be an object with name, shape, role (and optionally optimizer)");
    if (!p.contains("name") || !p["name"].is_string()) throw_format(where + ": missing or non-string \"name\"");
    ParamSpec spec;
    spec.name = p["name"].get<std::string>();
    where += " " + sq(io::printable(spec.name));
    if (spec.name.empty()) throw_format(where + ": empty name");
    if (!seen.insert(spec.name).second) throw_format(where + ": duplicate parameter name");
    for (auto it = p.begin(); it != p.end(); ++it) {
      if (it.key() != "name" && it.key() != "shape" && it.key() != "role" && it.key() != "optimizer") {
        throw_format(where + ": unknown key " + sq(it.key()) + " (expected name, shape, role, optimizer)");
      }
    }
    if (!p.contains("shape") || !p["shape"].is_array()) throw_format(where + ": missing or non-array \"shape\"");
    int64_t numel = 1;
    for (const nlohmann::json& d : p["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        throw_format(where + ": shape " + p["shape"].dump() + " must hold non-negative integers");
      }
      const int64_t extent = d.get<int64_t>();
      if (extent != 0 && numel > INT64_MAX / extent) throw_format(where + ": shape " + p["shape"].dump() + " is too large");
      numel *= extent;
      spec.shape.push_back(extent);
    }
    if (numel > kMaxTotal - total) {
      throw_format(where + ": shape " + p["shape"].dump() + " makes the layout's total size exceed " +
                   std::to_string(kMaxTotal) + " elements");
    }
    total += numel;
    if (!p.contains("role") || !p["role"].is_string()) throw_format(where + ": missing or non-string \"role\"");
    const std::string role = p["role"].get<std::string>();
    if (!parse_role(role.c_str(), &spec.role)) {
      throw_format(where + ": unknown role " + sq(role) + " (expected one of " + role_list() + ")");
    }
    // "optimizer": which optimizer of a muon task steps the tensor (param.h); other kinds ignore it.
    if (p.contains("optimizer")) {
      const nlohmann::json& o = p["optimizer"];
      const std::string mark = o.is_string() ? o.get<std::string>() : o.dump();
      if (o.is_string() && mark == "adamw") {
        spec.optimizer = ParamOptimizer::kAdamW;
      } else if (o.is_string() && mark == "muon") {
        if (group_of(spec.role) != Group::kWeight) {
          throw_format(where + ": \"optimizer\": \"muon\" on a " + role + " (Muon steps the weight roles only; "
                       "the bias-like roles run the auxiliary AdamW)");
        }
      } else {
        throw_format(where + ": unknown optimizer " + (o.is_string() ? sq(io::printable(mark)) : mark) +
                     " (expected \"muon\" or \"adamw\")");
      }
    }
    layout.params.push_back(std::move(spec));
  }
  try {
    check_layout_limits(layout.params);
    validate_param_specs(layout.params);
  } catch (const Error& e) {
    throw_format(source + ": " + e.what());
  }
  return layout;
}

Layout load_layout_file(const std::string& path) {
  return parse_layout(io::read_regular_file(path, "layout file", io::kMaxJsonBytes), io::printable(path));
}

std::vector<std::string> builtin_layout_names() {
  std::vector<std::string> names;
  for (size_t i = 0; i < detail::kNumEmbeddedLayouts; ++i) names.push_back(detail::kEmbeddedLayouts[i].name);
  std::sort(names.begin(), names.end());
  return names;
}

bool has_builtin_layout(const std::string& name) {
  for (size_t i = 0; i < detail::kNumEmbeddedLayouts; ++i) {
    if (name == detail::kEmbeddedLayouts[i].name) return true;
  }
  return false;
}

Layout builtin_layout(const std::string& name) {
  for (size_t i = 0; i < detail::kNumEmbeddedLayouts; ++i) {
    const detail::EmbeddedLayout& e = detail::kEmbeddedLayouts[i];
    if (name == e.name) {
      Layout layout = parse_layout(std::string(reinterpret_cast<const char*>(e.text), e.size), "builtin:" + name);
      if (layout.name.empty()) layout.name = name;
      return layout;
    }
  }
  std::string known;
  for (const std::string& n : builtin_layout_names()) known += (known.empty() ? "" : ", ") + n;
  throw_invalid("unknown model " + sq(name) + " (built-in layouts: " + known + "; or give a path to a .json file)");
}

Layout resolve_layout(const std::string& name_or_path) {
  if (has_builtin_layout(name_or_path)) return builtin_layout(name_or_path);
  // Anything that looks like a path is read as a file; a bare unknown word is a typo of a name.
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               name_or_path.find('.') != std::string::npos;
  if (!looks_like_path) builtin_layout(name_or_path);  // throws with the list of names
  Layout layout = load_layout_file(name_or_path);
  if (layout.name.empty()) layout.name = name_or_path;
  return layout;
}

}  // namespace renaissance
