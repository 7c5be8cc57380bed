// Validation and fluent builders of the optimizer configurations (every bad hyperparameter is
// rejected with an error naming the parameter and the value); the per-kind columns come from
// kKindTable (renaissance/kinds.h).
#include "renaissance/optimizer.h"

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"

namespace renaissance {

namespace {

[[noreturn]] void reject(const char* name, double value, const char* rule) {
  std::ostringstream os;
  os.precision(17);
  os << "invalid " << name << " = " << value << ": " << rule;
  throw_invalid(os.str());
}

void check_non_negative(const char* name, double v) {
  if (!std::isfinite(v) || v < 0.0) reject(name, v, "must be finite and >= 0");
}
void check_unit_interval(const char* name, double v) {
  if (!std::isfinite(v) || v < 0.0 || v >= 1.0) reject(name, v, "must be in [0, 1)");
}
void check_positive(const char* name, double v) {
  if (!std::isfinite(v) || v <= 0.0) reject(name, v, "must be finite and > 0");
}

}  // namespace

OptimizerConfig make_config(OptimizerKind kind, const Hyperparameters& h) {
  OptimizerConfig c;
  c.kind = kind;
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    set_hyper_value(c, row, row.kind_column != nullptr ? h.*row.kind_column : row.fixed_default);
  }
  return c;
}

OptimizerConfig default_config(OptimizerKind kind) { return make_config(kind, kind_info(kind).defaults); }
OptimizerConfig reference_config(OptimizerKind kind) { return make_config(kind, kind_info(kind).reference); }
OptimizerConfig bench_config(OptimizerKind kind) { return make_config(kind, kind_info(kind).bench); }

double bytes_per_param(OptimizerKind kind, bool check_finite) {
  return kind_info(kind).bytes_per_param + (check_finite ? 4.0 : 0.0);
}

double bytes_per_param(OptimizerKind kind, bool check_finite, const PrecisionOptions& precision) {
  double bytes = bytes_per_param(kind, check_finite);
  if (precision.precision == Precision::kFp32) return bytes;
  const double encoded = precision_bytes(precision.precision);
  bytes += encoded;  // the copy's write
  if (precision.model_dtype_gradients) {
    const double kind_reads = kind_info(kind).norm == NormPass::kLarsTrustRatio ? 2.0 : 1.0;
    bytes -= (4.0 - encoded) * (kind_reads + (check_finite ? 1.0 : 0.0));
  }
  return bytes;
}

namespace {
// The step computes in float32: a value finite as a double can still round to inf (1e39) or to
// 0 (eps 1e-50), and a derived scalar can overflow even when its inputs do not.
bool f32_finite(double v) { return std::isfinite(v) && std::fabs(v) <= static_cast<double>(FLT_MAX); }
void check_f32(const char* name, double v, bool nonzero) {
  if (!f32_finite(v)) reject(name, v, "is not finite as a float32 (|x| <= 3.4028235e38)");
  if (nonzero && v != 0.0 && static_cast<float>(v) == 0.0f) reject(name, v, "rounds to 0 as a float32");
}
// Every hyperparameter and every scalar the step derives from them, as write_hyperparameters
// forms them (lr is the base lr: schedules only scale it down).
void check_float32_domain(const OptimizerConfig& c) {
  check_f32("lr", c.lr, false);
  check_f32("weight_decay", c.weight_decay, false);
  check_f32("eps", c.eps, true);
  check_f32("trust_coefficient", c.trust_coefficient, true);
  check_f32("1 - lr * weight_decay", 1.0 - c.lr * c.weight_decay, false);
  check_f32("lr * weight_decay", c.lr * c.weight_decay, false);
  check_f32("1 - dampening", 1.0 - c.dampening, false);
  check_f32("aux_lr", c.aux_lr, false);
  check_f32("aux_weight_decay", c.aux_weight_decay, false);
  check_f32("1 - aux_lr * aux_weight_decay", 1.0 - c.aux_lr * c.aux_weight_decay, false);
  check_f32("ns_eps", c.ns_eps, true);
}

}  // namespace

void check_max_grad_norm(double max_norm) {
  check_non_negative("max_grad_norm", max_norm);
  check_f32("max_grad_norm", max_norm, true);
}

void check_lr(double lr) { check_non_negative("lr", lr); check_f32("lr", lr, false); }

namespace {
// A number of the table by its row's rule (a flag has no rule to check: it is a bool).
void check_rule(const HyperparameterInfo& row, double v) {
  switch (row.rule) {
    case HyperRule::kLr:  // lr and aux_lr: each named in its own error
      check_non_negative(row.name, v);
      return check_f32(row.name, v, false);
    case HyperRule::kNonNegative: return check_non_negative(row.name, v);
    case HyperRule::kUnitInterval: return check_unit_interval(row.name, v);
    case HyperRule::kPositive: return check_positive(row.name, v);
    case HyperRule::kMaxGradNorm: return check_max_grad_norm(v);
    case HyperRule::kFloat32: return check_f32(row.name, v, false);
    case HyperRule::kFlag: return;
    case HyperRule::kSteps:
      if (!(v >= 1.0 && v <= 100.0) || v != std::floor(v)) reject(row.name, v, "must be a whole number from 1 to 100");
      return;
    case HyperRule::kChoice: {
      int count = 1;
      for (const char* p = row.choices; *p != '\0'; ++p) count += *p == '|';
      if (!(v >= 0.0 && v < count) || v != std::floor(v)) {
        reject(row.name, v, (std::string("must be one of ") + row.choices + " (0 to " + std::to_string(count - 1) + ")").c_str());
      }
      return;
    }
  }
}
}  // namespace
void check_loss_scale(double scale) {
  check_positive("loss scale", scale);
  check_f32("loss scale", scale, true);
  check_f32("1 / loss scale", 1.0 / scale, true);
}

void OptimizerConfig::validate() const {
  if (static_cast<int>(kind) < 0 || static_cast<int>(kind) >= kNumOptimizerKinds) {
    throw_invalid("unknown optimizer kind #" + std::to_string(static_cast<int>(kind)));
  }
  // Each number by its rule, in table order; the float32-only rows (dampening) come after the
  // kind's own rules and clipping's float32 check last, as they always have.
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.number != nullptr && row.rule != HyperRule::kMaxGradNorm && row.rule != HyperRule::kFloat32) {
      check_rule(row, this->*row.number);
    }
  }
  const KindInfo& info = kind_info(kind);
  if (info.needs_momentum && momentum <= 0.0) {
    reject("momentum", momentum, (std::string(info.name) + " requires momentum > 0").c_str());
  }
  if (weight_decay_mode == WeightDecayMode::kL2 && !info.allows_l2) {
    throw_invalid(std::string("weight_decay_mode l2 applies to the SGD kinds only, not ") +
                  optimizer_kind_name(kind));
  }
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.rule == HyperRule::kFloat32) check_rule(row, this->*row.number);
  }
  // A hyperparameter the kind does not read keeps the kind's default: any other value would be
  // taken and then ignored (the CLI refuses such an option at any value, the Python keywords
  // by name).
  for (const HyperparameterInfo& row : kHyperparameterTable) check_kind_takes(kind, row, hyper_value(*this, row));
  if (kind == OptimizerKind::kSgdNesterov && dampening != 0.0) {
    reject("dampening", dampening, "Nesterov momentum requires a momentum and zero dampening");
  }
  check_float32_domain(*this);
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.rule == HyperRule::kMaxGradNorm) check_rule(row, this->*row.number);
  }
}

std::string kinds_reading(const HyperparameterInfo& h) {
  std::string kinds;
  for (const KindInfo& k : kKindTable) {
    if (kind_reads(k.kind, h)) kinds += std::string(kinds.empty() ? "" : ", ") + k.name;
  }
  return kinds;
}

void check_kind_takes(OptimizerKind kind, const HyperparameterInfo& h, double value) {
  if (kind_reads(kind, h) || value == hyper_default(kind, h)) return;
  throw_invalid(std::string(optimizer_kind_name(kind)) + " does not take " + h.name + " (" + hyper_value_text(h, value) +
                " given; the kinds that do: " + kinds_reading(h) + ")");
}

std::string hyper_value_text(const HyperparameterInfo& h, double v) {
  if (h.rule == HyperRule::kFlag) return v != 0.0 ? "on" : "off";
  if (h.rule == HyperRule::kChoice && v >= 0.0 && v == std::floor(v)) {
    const std::string choices = h.choices;
    size_t at = 0;
    for (double index = 0.0; at != std::string::npos; index += 1.0) {
      const size_t bar = choices.find('|', at);
      if (index == v) return choices.substr(at, bar == std::string::npos ? std::string::npos : bar - at);
      at = bar == std::string::npos ? bar : bar + 1;
    }
  }
  // The shortest decimal that reads back as v (0.1, not 0.10000000000000001).
  std::ostringstream os;
  for (int digits = 1; digits <= 17; ++digits) {
    os.str("");
    os.precision(digits);
    os << v;
    if (std::strtod(os.str().c_str(), nullptr) == v) break;
  }
  return os.str();
}

const HyperparameterInfo* find_hyperparameter(const std::string& name) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

void check_hyperparameter(const char* name, double v) {
  const HyperparameterInfo* row = find_hyperparameter(name);
  if (row == nullptr || row->number == nullptr) throw_invalid("unknown hyperparameter '" + std::string(name) + "'");
  check_rule(*row, v);
}

OptimizerConfig SGD::config() const {
  OptimizerConfig c = c_;
  if (nesterov_) {
    if (c.momentum <= 0.0) reject("momentum", c.momentum, "nesterov requires momentum > 0");
    if (c.dampening != 0.0) reject("dampening", c.dampening, "Nesterov momentum requires a momentum and zero dampening");
    c.kind = OptimizerKind::kSgdNesterov;
  } else {
    c.kind = c.momentum > 0.0 ? OptimizerKind::kSgdMomentum : OptimizerKind::kSgd;
    // torch.optim.SGD ignores dampening without momentum (no buffer); kind sgd does not take it.
    if (c.kind == OptimizerKind::kSgd) c.dampening = 0.0;
  }
  return c;
}

OptimizerConfig LARS::config() const {
  OptimizerConfig c = c_;
  c.kind = nesterov_ ? OptimizerKind::kLarsNesterov : OptimizerKind::kLars;
  if (nesterov_ && c.momentum <= 0.0) reject("momentum", c.momentum, "nesterov requires momentum > 0");
  return c;
}

}  // namespace renaissance
