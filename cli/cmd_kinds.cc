// `renaissance kinds [--json]`: the kind table (renaissance/kinds.h) as a user or a script sees
// it. Scripts (bench/compare_torch.py, conformance/render_report.py) read `--json` instead of
// keeping their own list of kinds and hyperparameters.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/kinds.h"
#include "renaissance/optimizer.h"

namespace renaissance {
namespace cli {

namespace {

// A kind table column: the hyperparameter table's rows that have a per-kind value.
nlohmann::json hyperparameters_json(const Hyperparameters& h) {
  nlohmann::json j = nlohmann::json::object();
  for_each_kind_column(h, [&j](const char* name, double value) { j[name] = value; });
  return j;
}

// The flag rows of the hyperparameter table the kind takes (maximize, amsgrad, ...).
nlohmann::json flags_json(OptimizerKind kind) {
  nlohmann::json j = nlohmann::json::array();
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.flag_field != nullptr && kind_reads(kind, row)) j.push_back(row.name);
  }
  return j;
}

}  // namespace

int cmd_kinds(bool json) {
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const KindInfo& k : kKindTable) {
      list.push_back({{"name", k.name},
                      {"summary", k.summary},
                      {"family", kind_family_name(k.family)},
                      {"state", {{"m", k.has_m}, {"v", k.has_v}}},
                      {"torch_m", torch_m_name(k.torch_m)},
                      {"norm_pass", norm_pass_name(k.norm)},
                      {"bias_correction", k.bias_correction},
                      {"needs_momentum", k.needs_momentum},
                      {"allows_l2", k.allows_l2},
                      {"nesterov", k.nesterov},
                      {"weight_update", range_op_name(k.weight_update)},
                      {"bias_update", range_op_name(k.bias_update)},
                      {"bytes_per_param", k.bytes_per_param},
                      {"defaults", hyperparameters_json(k.defaults)},
                      {"reference", hyperparameters_json(k.reference)},
                      {"bench", hyperparameters_json(k.bench)},
                      {"flags", flags_json(k.kind)}});
    }
    std::printf("%s\n", list.dump().c_str());
    return kExitOk;
  }
  std::printf("%-15s %-6s %-5s %-17s %9s  %s\n", "kind", "family", "state", "norm pass", "B/param", "summary");
  for (const KindInfo& k : kKindTable) {
    const char* state = k.has_v ? "m, v" : (k.has_m ? "m" : "-");
    std::printf("%-15s %-6s %-5s %-17s %9.0f  %s\n", k.name, kind_family_name(k.family), state, norm_pass_name(k.norm),
                k.bytes_per_param, k.summary);
  }
  std::printf("(B/param: ideal traffic of one fp32 step without the non-finite check, which adds 4)\n");
  // The flags only some kinds take, with those kinds (amsgrad: adam, adamw; one more state buffer).
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.flag_field == nullptr || row.families == kEveryFamily) continue;
    std::string kinds;
    for (const KindInfo& k : kKindTable) {
      if (kind_reads(k.kind, row)) kinds += std::string(kinds.empty() ? "" : ", ") + k.name;
    }
    std::printf("%s (%s): %s\n", row.flag, kinds.c_str(), row.help);
  }
  return kExitOk;
}

}  // namespace cli
}  // namespace renaissance
