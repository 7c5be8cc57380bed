// The runs `renaissance audit` performs, defined once here and used by both cli/cmd_audit.cc and
// the conformance suite: the suite records their CUDA fingerprints in the golden file under
// audit_cell_name(), and the audit recomputes exactly the same runs and compares. Defining them
// in one place is what makes the audit cells a subset of the golden cells by construction.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "audit/synthetic.h"
#include "audit/golden.h"
#include "audit/matrix.h"
#include "renaissance/optimizer.h"
#include "renaissance/param.h"

namespace renaissance {
namespace conformance {

// The step counts recorded in the golden file: the audit's default (8) and the one the CLI's own
// ctest entry uses (4). Any other --steps gives NO GOLDEN.
constexpr int kAuditGoldenSteps[] = {4, 8};

// Small, but covering every role, a zero-size tensor and weight tensors longer than one LARS
// reduction tile (4096 elements), so multi-tile reductions are part of the fingerprint.
inline std::vector<ParamSpec> audit_layout() {
  std::vector<ParamSpec> p = small_cnn_stem();
  p.insert(p.end(), {
                        {"empty.weight", {0, 8}, Role::kDeepConv},
                        {"fc.weight", {10, 64}, Role::kFcWeight},
                        {"fc.bias", {10}, Role::kFcBias},
                    });
  return p;
}

// One audit run (backend and threads are left to the caller: they must not change the bits).
inline audit::SyntheticRun audit_run(OptimizerKind kind, int steps) {
  audit::SyntheticRun run;
  run.params = audit_layout();
  run.config = default_config(kind);
  run.config.weight_decay = 0.01;  // exercise the weight group's decay on every kind
  run.steps = steps;
  run.nan_at = {steps / 2};
  run.seed = 1;
  run.loss_scale = 1024.0;
  run.measure_copy_bandwidth = false;
  return run;
}

inline std::string audit_cell_name(OptimizerKind kind, int steps) {
  return std::string("audit.") + optimizer_kind_name(kind) + ".steps" + std::to_string(steps);
}

// Canonical description of a layout: names, shapes, roles and optimizer marks, digested.
inline std::string layout_digest(const std::vector<ParamSpec>& params) {
  std::string text;
  int64_t numel = 0;
  for (const ParamSpec& p : params) {
    text += p.name + "[";
    for (int64_t d : p.shape) text += std::to_string(d) + ",";
    // The optimizer mark only where a layout sets it, so that every unmarked layout's digest stays.
    text += "]" + std::to_string(static_cast<int>(p.role)) + (p.optimizer == ParamOptimizer::kAdamW ? ":adamw" : "") + ";";
    numel += p.numel();
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%zu tensors/%lld params/%016llx", params.size(), static_cast<long long>(numel),
                static_cast<unsigned long long>(fnv1a64(text)));
  return buf;
}

// Every hyperparameter with 17 significant digits (round-trips a double exactly).
inline std::string config_spec(const OptimizerConfig& c) {
  char buf[320];
  std::snprintf(buf, sizeof(buf), "%s lr=%.17g wd=%.17g mode=%s momentum=%.17g beta1=%.17g beta2=%.17g eps=%.17g tc=%.17g",
                optimizer_kind_name(c.kind), c.lr, c.weight_decay,
                c.weight_decay_mode == WeightDecayMode::kL2 ? "l2" : "decoupled", c.momentum, c.beta1, c.beta2, c.eps,
                c.trust_coefficient);
  std::string spec = buf;
  // Only when clipping is on, so that every spec recorded before clipping existed is unchanged.
  if (c.max_grad_norm > 0.0) {
    std::snprintf(buf, sizeof(buf), " max_grad_norm=%.17g", c.max_grad_norm);
    spec += buf;
  }
  // Only with dampening, for the same reason.
  if (c.dampening != 0.0) {
    std::snprintf(buf, sizeof(buf), " dampening=%.17g", c.dampening);
    spec += buf;
  }
  // Only with amsgrad, for the same reason.
  if (c.amsgrad) spec += " amsgrad=1";
  // Only with an auxiliary AdamW weight decay (muon), for the same reason.
  if (c.aux_weight_decay != 0.0) {
    std::snprintf(buf, sizeof(buf), " aux_wd=%.17g", c.aux_weight_decay);
    spec += buf;
  }
  return spec;
}

inline std::string audit_cell_spec(const audit::SyntheticRun& run) {
  std::string nan_at;
  for (int64_t s : run.nan_at) nan_at += std::to_string(s) + ",";
  char buf[160];
  std::snprintf(buf, sizeof(buf), " steps=%d schedule=%d warmup=%d scale=%.17g seed=%llu nan_at=%s check_finite=%d",
                run.steps, static_cast<int>(run.schedule), run.warmup, run.loss_scale,
                static_cast<unsigned long long>(run.seed), nan_at.c_str(), run.check_finite ? 1 : 0);
  return "cli-synthetic/1 layout=" + layout_digest(run.params) + " " + config_spec(run.config) + buf;
}

// The mixed-precision cells the audit also recomputes: the suite's own small-tier cells with a
// bf16/fp16 model copy (every kind x layout x {bf16, fp16} x {nearest, stochastic} x gradients
// {fp32, model dtype}), run by cell_fingerprint() exactly as the suite records them, so they are
// golden cells by construction too. Their steps are the matrix's, whatever the audit's --steps.
// (The feature-axis cells among them are the suite's: the audit's table is the precision axis.)
inline std::vector<Cell> audit_precision_cells() {
  std::vector<Cell> out;
  for (Cell& c : cells(Tier::kSmall)) {
    if (c.precision.precision != Precision::kFp32 && !c.has_feature_axes()) out.push_back(std::move(c));
  }
  return out;
}

}  // namespace conformance
}  // namespace renaissance
