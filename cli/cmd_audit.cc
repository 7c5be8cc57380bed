// `renaissance audit` and `renaissance layouts`. The audit runs every optimizer kind on a fixed
// small layout, with a fixed seed and a NaN step, on every backend this machine has (the CPU
// twice: one thread and all cores), and prints kind x backend -> fingerprint and whether they
// agree. The run is fully determined by the code, so a colleague can pin golden fingerprints.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "renaissance/error.h"
#include "renaissance/layout.h"

namespace renaissance {
namespace cli {

namespace {

// Small, but covering every role, a zero-size tensor and weight tensors longer than one LARS
// reduction tile (4096 elements), so multi-tile reductions are part of the fingerprint.
std::vector<ParamSpec> audit_layout() {
  return {
      {"conv1.weight", {16, 3, 3, 3}, Role::kFirstConv},
      {"bn1.weight", {16}, Role::kBnWeight},
      {"bn1.bias", {16}, Role::kBnBias},
      {"layer1.conv.weight", {32, 16, 3, 3}, Role::kDeepConv},
      {"layer1.bn.weight", {32}, Role::kBnWeight},
      {"layer1.bn.bias", {32}, Role::kBnBias},
      {"layer2.conv.weight", {64, 32, 3, 3}, Role::kDeepConv},
      {"empty.weight", {0, 8}, Role::kDeepConv},
      {"fc.weight", {10, 64}, Role::kFcWeight},
      {"fc.bias", {10}, Role::kFcBias},
  };
}

struct Column {
  std::string label;
  BackendKind backend;
  int threads;
  bool available;
};

}  // namespace

int cmd_audit(const AuditOptions& o) {
  if (o.steps < 1) throw_invalid("--steps " + std::to_string(o.steps) + ": must be >= 1");
  const int cores = omp_get_num_procs();
  std::vector<Column> columns = {
      {"cpu/1 thread", BackendKind::kCpu, 1, true},
      {"cpu/" + std::to_string(std::max(2, cores)) + " threads", BackendKind::kCpu, std::max(2, cores), true},
      {"cuda", BackendKind::kCuda, 0, backend_available(BackendKind::kCuda)},
  };
  nlohmann::json report = {{"layout", "audit"}, {"steps", o.steps}, {"seed", 1}, {"nan_at", {o.steps / 2}}};
  nlohmann::json rows = nlohmann::json::array();
  bool all_agree = true;
  if (!o.json) {
    std::printf("audit: %d steps on a fixed layout (%zu tensors), seed 1, NaN injected at step %d\n", o.steps,
                audit_layout().size(), o.steps / 2);
    std::printf("%-14s", "kind");
    for (const Column& c : columns) std::printf("  %-18s", c.label.c_str());
    std::printf("  agree\n");
  }
  for (int k = 0; k < kNumOptimizerKinds; ++k) {
    const OptimizerKind kind = static_cast<OptimizerKind>(k);
    SyntheticRun run;
    run.params = audit_layout();
    run.config = cli_default_config(kind);
    run.config.weight_decay = 0.01;  // exercise the weight group's decay on every kind
    run.steps = o.steps;
    run.nan_at = {o.steps / 2};
    run.seed = 1;
    run.loss_scale = 1024.0;
    run.measure_copy_bandwidth = false;
    nlohmann::json row = {{"kind", optimizer_kind_name(kind)}};
    std::string first;
    bool agree = true;
    if (!o.json) std::printf("%-14s", optimizer_kind_name(kind));
    for (const Column& c : columns) {
      std::string fp = "n/a";
      if (c.available) {
        run.backend = c.backend;
        run.threads = c.threads;
        fp = run_synthetic(run).fingerprint;
        if (first.empty()) first = fp;
        agree = agree && fp == first;
        row[c.label] = fp;
      } else {
        row[c.label] = nullptr;
      }
      if (!o.json) std::printf("  %-18s", fp.c_str());
    }
    row["agree"] = agree;
    all_agree = all_agree && agree;
    rows.push_back(row);
    if (!o.json) std::printf("  %s\n", agree ? "yes" : "NO");
  }
  report["rows"] = rows;
  report["agree"] = all_agree;
  if (o.json) {
    std::printf("%s\n", report.dump().c_str());
  } else {
    if (!columns[2].available) std::printf("(cuda: n/a, no CUDA backend in this build or no device)\n");
    std::printf("%s\n", all_agree ? "all backends agree bit for bit" : "BACKENDS DISAGREE");
  }
  return all_agree ? kExitOk : kExitComparisonFailed;
}

int cmd_layouts(bool json) {
  nlohmann::json list = nlohmann::json::array();
  if (!json) std::printf("%-20s %8s %14s %14s %14s\n", "layout", "tensors", "parameters", "weight group", "bias-like");
  for (const std::string& name : builtin_layout_names()) {
    const Layout layout = builtin_layout(name);
    int64_t weight = 0, bias = 0;
    for (const ParamSpec& p : layout.params) (group_of(p.role) == Group::kWeight ? weight : bias) += p.numel();
    if (json) {
      list.push_back({{"name", name}, {"tensors", layout.params.size()}, {"params", weight + bias},
                      {"weight_params", weight}, {"bias_like_params", bias}});
    } else {
      std::printf("%-20s %8zu %14lld %14lld %14lld\n", name.c_str(), layout.params.size(),
                  static_cast<long long>(weight + bias), static_cast<long long>(weight), static_cast<long long>(bias));
    }
  }
  if (json) std::printf("%s\n", list.dump().c_str());
  return kExitOk;
}

}  // namespace cli
}  // namespace renaissance
