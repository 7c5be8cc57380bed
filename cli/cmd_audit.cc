// `renaissance audit` and `renaissance layouts`. The audit runs every optimizer kind on a fixed
// small layout, with a fixed seed and a NaN step, on every backend this machine has (the CPU
// twice: one thread and all cores), prints kind x backend -> fingerprint and whether they agree,
// and compares each fingerprint with the golden file the conformance suite recorded on a GPU
// (audit/golden/fingerprints.json, compiled into the binary; $RENAISSANCE_GOLDEN names
// another file, for the self-tests: read here, tools/program_env.h): MATCH, DIFFERS or NO GOLDEN. Exit 1 on DIFFERS, on backends
// that disagree, and on NO GOLDEN: an audit that could not compare a kind with the recorded GPU
// fingerprint has not vouched for it. Exit 2 stays for bad usage.
// The runs themselves are defined in audit/audit_cells.h, shared with the suite, so the
// audit's cells are golden cells by construction. A second table does the same for the suite's
// mixed-precision cells (bf16/fp16 model copy, nearest/stochastic rounding, fp32 or model-dtype
// gradients: audit_precision_cells()), recomputed with the suite's own cell_fingerprint(); a
// wrong rounding shows there, since the fp32 kind rows never round.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "audit/audit_cells.h"
#include "audit/cell_fingerprint.h"
#include "audit/golden.h"
#include "renaissance/error.h"
#include "renaissance/layout.h"
#include "tools/program_env.h"

namespace renaissance {
namespace cli {

namespace {

struct Column {
  std::string label;
  BackendKind backend;
  int threads;
  bool available;
};

// MATCH / DIFFERS against the recorded GPU fingerprint, or NO GOLDEN when there is nothing
// comparable: no recorded file, no cell for this --steps, or a cell recorded for another run.
std::string golden_status(const conformance::Golden& golden, const std::string& cell, const std::string& spec,
                          const std::string& fingerprint) {
  if (!golden.usable) return "NO GOLDEN";
  const auto it = golden.cells.find(cell);
  if (it == golden.cells.end() || it->second.spec != spec) return "NO GOLDEN";
  return it->second.fingerprint == fingerprint ? "MATCH" : "DIFFERS";
}

// " (recorded: --steps 4, 8)", from the steps the suite records.
std::string recorded_steps() {
  std::string s;
  for (int steps : conformance::kAuditGoldenSteps) s += (s.empty() ? " (recorded: --steps " : ", ") + std::to_string(steps);
  return s + ")";
}

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
  bool any_differs = false;
  std::vector<std::string> no_golden;  // kinds and cells the audit could not compare, with the reason
  const conformance::Golden golden = conformance::load_golden(program_env::golden_path_from_env());
  // The CPU columns' switches (RENAISSANCE_CPU_*): they must leave every fingerprint as it is.
  const CpuTuning cpu = program_env::cpu_tuning_from_env();
  auto backend_options = [&](const Column& c) {
    BackendOptions b;
    b.threads = c.threads;
    if (c.backend == BackendKind::kCpu) b.cpu = cpu;
    return b;
  };
  report["golden"] = {{"path", golden.path}, {"usable", golden.usable}, {"why_not", golden.why_not},
                      {"recorded_on", golden.usable ? golden.machine_line() : ""}};
  if (!o.json) {
    std::printf("audit: %d steps on a fixed layout (%zu tensors), seed 1, NaN injected at step %d\n", o.steps,
                conformance::audit_layout().size(), o.steps / 2);
    if (golden.usable) {
      std::printf("golden: %s (%s)\n", golden.path.c_str(), golden.machine_line().c_str());
    } else {
      std::printf("golden: NO GOLDEN: %s\n", golden.why_not.c_str());
    }
    std::printf("%-14s", "kind");
    for (const Column& c : columns) std::printf("  %-29s", c.label.c_str());
    std::printf("  agree\n");
  }
  // One row: the cell's fingerprint on every available column, compared with the golden file.
  // `label` is what the table and the NO GOLDEN lines name (a kind, or a precision cell).
  auto audit_row = [&](const std::string& label, const std::string& cell, const std::string& spec,
                       const std::function<std::string(const Column&)>& fingerprint, int width, nlohmann::json* row) {
    nlohmann::json row_golden = nlohmann::json::object();
    std::string first;
    bool agree = true;
    bool missing = false;
    if (!o.json) std::printf("%-*s", width, label.c_str());
    for (const Column& c : columns) {
      std::string fp = "n/a";
      std::string status = "NOT RUN";
      if (c.available) {
        fp = fingerprint(c);
        if (first.empty()) first = fp;
        agree = agree && fp == first;
        (*row)[c.label] = fp;
        status = golden_status(golden, cell, spec, fp);
        any_differs = any_differs || status == "DIFFERS";
        if (status == "NO GOLDEN" && !missing) {
          missing = true;
          std::string why = golden.why_not;
          if (golden.usable) {
            const auto it = golden.cells.find(cell);
            why = it == golden.cells.end() ? "the golden file has no cell " + cell +
                                                 (cell.rfind("audit.", 0) == 0 ? recorded_steps() : "")
                                           : "cell " + cell + " was recorded for a different run (spec changed)";
          }
          no_golden.push_back(label + ": " + why);
        }
      } else {
        (*row)[c.label] = nullptr;
      }
      row_golden[c.label] = status;
      if (!o.json) std::printf("  %-16s %-12s", fp.c_str(), status.c_str());
    }
    (*row)["golden"] = row_golden;
    (*row)["agree"] = agree;
    all_agree = all_agree && agree;
    if (!o.json) std::printf("  %s\n", agree ? "yes" : "NO");
  };
  for (int k = 0; k < kNumOptimizerKinds; ++k) {
    const OptimizerKind kind = static_cast<OptimizerKind>(k);
    SyntheticRun run = conformance::audit_run(kind, o.steps);
    const std::string cell = conformance::audit_cell_name(kind, o.steps);
    nlohmann::json row = {{"kind", optimizer_kind_name(kind)}, {"golden_cell", cell}};
    audit_row(optimizer_kind_name(kind), cell, conformance::audit_cell_spec(run), [&](const Column& c) {
      run.backend = c.backend;
      run.threads = c.threads;
      run.cpu = backend_options(c).cpu;
      return run_synthetic(run).fingerprint;
    }, 14, &row);
    rows.push_back(row);
  }
  // The mixed-precision cells, named as the suite names them (kind.layout.....bf16.nearest
  // [.grad_model]); their steps and inputs are the matrix's, not --steps.
  const std::vector<conformance::Cell> precision_cells = conformance::audit_precision_cells();
  size_t name_width = 4;
  for (const conformance::Cell& c : precision_cells) name_width = std::max(name_width, c.name.size());
  if (!o.json) {
    std::printf("mixed precision: %zu conformance cells (bf16/fp16 model copy, nearest/stochastic rounding, fp32 or "
                "model-dtype gradients; the matrix's own steps)\n%-*s",
                precision_cells.size(), static_cast<int>(name_width), "cell");
    for (const Column& c : columns) std::printf("  %-29s", c.label.c_str());
    std::printf("  agree\n");
  }
  nlohmann::json precision_rows = nlohmann::json::array();
  for (const conformance::Cell& cell : precision_cells) {
    nlohmann::json row = {{"golden_cell", cell.name}};
    audit_row(cell.name, cell.name, cell.spec(), [&](const Column& c) {
      return conformance::cell_fingerprint(cell, c.backend, nullptr, backend_options(c));
    }, static_cast<int>(name_width), &row);
    precision_rows.push_back(row);
  }
  report["precision_rows"] = precision_rows;
  report["rows"] = rows;
  report["agree"] = all_agree;
  report["golden_differs"] = any_differs;
  report["no_golden"] = no_golden;
  if (o.json) {
    std::printf("%s\n", report.dump().c_str());
  } else {
    if (!columns[2].available) std::printf("(cuda: n/a, no CUDA backend in this build or no device)\n");
    std::printf("%s\n", all_agree ? "all backends agree bit for bit" : "BACKENDS DISAGREE");
    if (any_differs) std::printf("GOLDEN MISMATCH: a fingerprint DIFFERS from the one recorded on the GPU\n");
    // (At most 12 lines: an unrecorded file would otherwise name every one of the 150-odd rows.)
    for (size_t i = 0; i < no_golden.size() && i < 12; ++i) std::printf("NO GOLDEN for %s\n", no_golden[i].c_str());
    if (no_golden.size() > 12) std::printf("NO GOLDEN for %zu more (--json lists them)\n", no_golden.size() - 12);
    if (!no_golden.empty()) {
      std::printf("AUDIT INCOMPLETE: %zu kind(s) or cell(s) could not be compared with the GPU recording\n",
                  no_golden.size());
    }
  }
  return all_agree && !any_differs && no_golden.empty() ? kExitOk : kExitComparisonFailed;
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
