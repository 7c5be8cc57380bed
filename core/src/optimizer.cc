// Validation and fluent builders of the optimizer configurations (DESIGN.md §3: every bad
// hyperparameter is rejected with an error naming the parameter and the value).
#include "renaissance/optimizer.h"

#include <cmath>
#include <sstream>

#include "renaissance/error.h"

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

bool is_sgd_family(OptimizerKind k) {
  return k == OptimizerKind::kSgd || k == OptimizerKind::kSgdMomentum ||
         k == OptimizerKind::kSgdNesterov;
}

}  // namespace

OptimizerConfig default_config(OptimizerKind kind) {
  OptimizerConfig c;
  switch (kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kSgdMomentum:
    case OptimizerKind::kSgdNesterov: c = SGD().config(); break;
    case OptimizerKind::kAdam: c = Adam().config(); break;
    case OptimizerKind::kAdamW: c = AdamW().config(); break;
    case OptimizerKind::kLars:
    case OptimizerKind::kLarsNesterov: c = LARS().config(); break;
  }
  c.kind = kind;
  return c;
}

double bytes_per_param(OptimizerKind kind, bool check_finite) {
  double bytes = 0.0;
  switch (kind) {
    case OptimizerKind::kSgd: bytes = 12.0; break;  // read w, g; write w
    case OptimizerKind::kSgdMomentum:
    case OptimizerKind::kSgdNesterov: bytes = 20.0; break;  // + read and write m
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: bytes = 28.0; break;  // + read and write v
    case OptimizerKind::kLars:
    case OptimizerKind::kLarsNesterov: bytes = 28.0; break;  // momentum update + norm pass over w, g
  }
  return bytes + (check_finite ? 4.0 : 0.0);
}

void check_lr(double lr) { check_non_negative("lr", lr); }
void check_loss_scale(double scale) { check_positive("loss scale", scale); }

void OptimizerConfig::validate() const {
  check_lr(lr);
  check_non_negative("weight_decay", weight_decay);
  check_unit_interval("momentum", momentum);
  check_unit_interval("beta1", beta1);
  check_unit_interval("beta2", beta2);
  check_positive("eps", eps);
  check_positive("trust_coefficient", trust_coefficient);
  if ((kind == OptimizerKind::kSgdMomentum || kind == OptimizerKind::kSgdNesterov) && momentum <= 0.0) {
    reject("momentum", momentum,
           kind == OptimizerKind::kSgdNesterov ? "nesterov requires momentum > 0"
                                               : "sgd_momentum requires momentum > 0");
  }
  if (kind == OptimizerKind::kLarsNesterov && momentum <= 0.0) {
    reject("momentum", momentum, "nesterov requires momentum > 0");
  }
  if (weight_decay_mode == WeightDecayMode::kL2 && !is_sgd_family(kind)) {
    throw_invalid(std::string("weight_decay_mode l2 applies to the SGD kinds only, not ") +
                  optimizer_kind_name(kind));
  }
}

// ---- SGD ----
SGD::SGD() { c_.kind = OptimizerKind::kSgd; c_.lr = 0.01; }
SGD& SGD::lr(double v) { check_lr(v); c_.lr = v; return *this; }
SGD& SGD::momentum(double v) { check_unit_interval("momentum", v); c_.momentum = v; return *this; }
SGD& SGD::nesterov(bool v) { nesterov_ = v; return *this; }
SGD& SGD::weight_decay(double v) { check_non_negative("weight_decay", v); c_.weight_decay = v; return *this; }
SGD& SGD::weight_decay_mode(WeightDecayMode v) { c_.weight_decay_mode = v; return *this; }
OptimizerConfig SGD::config() const {
  OptimizerConfig c = c_;
  if (nesterov_) {
    if (c.momentum <= 0.0) reject("momentum", c.momentum, "nesterov requires momentum > 0");
    c.kind = OptimizerKind::kSgdNesterov;
  } else {
    c.kind = c.momentum > 0.0 ? OptimizerKind::kSgdMomentum : OptimizerKind::kSgd;
  }
  return c;
}

// ---- Adam / AdamW ----
Adam::Adam() { c_.kind = OptimizerKind::kAdam; c_.lr = 1e-3; }
Adam& Adam::lr(double v) { check_lr(v); c_.lr = v; return *this; }
Adam& Adam::beta1(double v) { check_unit_interval("beta1", v); c_.beta1 = v; return *this; }
Adam& Adam::beta2(double v) { check_unit_interval("beta2", v); c_.beta2 = v; return *this; }
Adam& Adam::eps(double v) { check_positive("eps", v); c_.eps = v; return *this; }
Adam& Adam::weight_decay(double v) { check_non_negative("weight_decay", v); c_.weight_decay = v; return *this; }
AdamW::AdamW() { c_.kind = OptimizerKind::kAdamW; c_.weight_decay = 0.01; }

// ---- LARS ----
LARS::LARS() { c_.kind = OptimizerKind::kLars; c_.lr = 0.1; c_.momentum = 0.9; }
LARS& LARS::lr(double v) { check_lr(v); c_.lr = v; return *this; }
LARS& LARS::momentum(double v) { check_unit_interval("momentum", v); c_.momentum = v; return *this; }
LARS& LARS::nesterov(bool v) { nesterov_ = v; return *this; }
LARS& LARS::weight_decay(double v) { check_non_negative("weight_decay", v); c_.weight_decay = v; return *this; }
LARS& LARS::trust_coefficient(double v) { check_positive("trust_coefficient", v); c_.trust_coefficient = v; return *this; }
LARS& LARS::eps(double v) { check_positive("eps", v); c_.eps = v; return *this; }
OptimizerConfig LARS::config() const {
  OptimizerConfig c = c_;
  c.kind = nesterov_ ? OptimizerKind::kLarsNesterov : OptimizerKind::kLars;
  if (nesterov_ && c.momentum <= 0.0) reject("momentum", c.momentum, "nesterov requires momentum > 0");
  return c;
}

}  // namespace renaissance
