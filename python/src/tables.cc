// renaissance._core's views of the library's tables (docs/python.md): kinds() and
// hyperparameters(), one dict per row in table order, the keywords each kind reads, which
// module.cc's keyword checks use too, and torch_state_keys (the family and kind tables' torch
// keys). Registered from NB_MODULE through renaissance_register_tables.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "renaissance/hyperparameters.h"
#include "renaissance/kinds.h"
#include "renaissance/optimizer.h"
#include "renaissance/plan.h"

namespace nb = nanobind;

namespace renaissance {

// A dict of (key, value) pairs, in the order given (module.cc's result dicts use it too).
nb::dict dict_of(std::initializer_list<std::pair<const char*, nb::object>> items) {
  nb::dict d;
  for (const auto& [key, value] : items) d[key] = value;
  return d;
}

// The numbers of the hyperparameter table each kind reads (the fluent builders of optimizer.h
// expose the same ones), then weight_decay_mode where the kind accepts l2; a keyword the kind
// ignores is an error rather than a silent no-op. The table's flags (maximize) apply to every
// kind and are checked as bools.
std::vector<std::string> family_hyperparameters(const KindInfo& k) {
  std::vector<std::string> h;
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.number != nullptr && kind_reads(k.kind, row)) h.push_back(row.name);
  }
  if (k.allows_l2) h.push_back("weight_decay_mode");
  return h;
}

namespace {

// A kind table column (defaults, reference): the table's rows that have a per-kind value.
nb::dict hyper_dict(const Hyperparameters& h) {
  nb::dict d;
  for_each_kind_column(h, [&d](const char* name, double value) { d[name] = value; });
  return d;
}

// One dict per row of a table, in table order, filled by fill(row, dict).
template <typename Row, size_t N, typename Fill>
nb::list dict_per_row(const Row (&rows)[N], Fill fill) {
  nb::list out;
  for (const Row& row : rows) {
    nb::dict d;
    fill(row, d);
    out.append(d);
  }
  return out;
}

// The hyperparameter table (renaissance/hyperparameters.h), one dict per row in table order:
// what Python code checks and records by (the Recorder's fixed keys, a case's optional keys).
nb::list hyperparameters() {
  return dict_per_row(kHyperparameterTable, [](const HyperparameterInfo& row, nb::dict& d) {
    d["name"] = row.name;
    d["flag"] = row.flag;
    d["help"] = row.help;
    d["type"] = row.number != nullptr ? "number" : "flag";
    d["rule"] = hyper_rule_name(row.rule);
    nb::list kinds;
    for (const KindInfo& k : kKindTable) {
      if (kind_reads(k.kind, row)) kinds.append(k.name);
    }
    d["kinds"] = kinds;
    d["per_kind_default"] = row.kind_column != nullptr;
    if (row.number != nullptr) d["default"] = row.fixed_default;
    else d["default"] = row.fixed_default != 0.0;
    d["task_wide"] = row.task_wide;
    d["resume_may_change"] = row.resume_may_change;
    // Left out of a file (checkpoint META, a recorded case.json) while at its default.
    d["optional"] = row.meta == MetaPlace::kOptional;
  });
}

nb::list kinds() {
  nb::list out;
  for (const KindInfo& k : kKindTable) {
    out.append(dict_of({{"name", nb::cast(k.name)}, {"summary", nb::cast(k.summary)},
                        {"family", nb::cast(kind_family_name(k.family))}, {"has_m", nb::cast(k.has_m)},
                        {"has_v", nb::cast(k.has_v)}, {"torch_m", nb::cast(torch_m_name(k.torch_m))},
                        {"bias_correction", nb::cast(k.bias_correction)},
                        {"needs_momentum", nb::cast(k.needs_momentum)}, {"allows_l2", nb::cast(k.allows_l2)},
                        {"nesterov", nb::cast(k.nesterov)}, {"bytes_per_param", nb::cast(k.bytes_per_param)},
                        {"hyperparameters", nb::cast(family_hyperparameters(k))}, {"defaults", hyper_dict(k.defaults)},
                        {"reference", hyper_dict(k.reference)}}));
  }
  return out;
}

// torch's state keys of a group of a kind (plan.h's torch_state_keys): {family name: torch key}
// in Family order. group: "weight" or "bias_like".
nb::dict py_torch_state_keys(const std::string& kind_name, bool amsgrad, const std::string& group) {
  OptimizerKind kind;
  if (!parse_optimizer_kind(kind_name, &kind)) {
    throw nb::value_error(("torch_state_keys: unknown kind '" + kind_name + "'").c_str());
  }
  if (group != "weight" && group != "bias_like") {
    throw nb::value_error(("torch_state_keys: group '" + group + "': expected 'weight' or 'bias_like'").c_str());
  }
  nb::dict d;
  for (const TorchStateKey& k : torch_state_keys(kind, group == "weight" ? Group::kWeight : Group::kBiasLike, amsgrad)) {
    d[family_name(k.family)] = k.key;
  }
  return d;
}

}  // namespace
}  // namespace renaissance

void renaissance_register_tables(nb::module_& m) {
  using namespace renaissance;
  m.def("kinds", &kinds, "The kind table: one dict per optimizer kind, in table order.");
  m.def("hyperparameters", &hyperparameters,
        "The hyperparameter table: one dict per hyperparameter (name, flag, help, type, rule, kinds, default, "
        "task_wide, resume_may_change, optional), in table order.");
  m.def("torch_state_keys", &py_torch_state_keys, nb::arg("kind"), nb::arg("amsgrad") = false,
        nb::arg("group") = "weight",
        "torch's per-parameter state keys of a group ('weight' or 'bias_like') of a kind: {family: key}, "
        "e.g. {'M': 'momentum_buffer'} for sgd_momentum ('step' is no family).");
}
