// Optimizer configurations and the fluent builders SGD(), Adam(), AdamW(), LARS(), Lion(), LAMB(). The kinds
// themselves are described in renaissance/kinds.h. Hyperparameters are held as double
// (docs/math.md: derived scalars such as 1-β2 are formed in double from the configured values).
// Every setter validates its value and throws Error(kInvalidArgument) naming the parameter and
// the value.
#pragma once

#include <string>

#include "renaissance/kinds.h"

namespace renaissance {

const char* optimizer_kind_name(OptimizerKind kind);  // "sgd", "adamw", ...
bool parse_optimizer_kind(const std::string& text, OptimizerKind* out);
// Every kind's name, in table order, joined by `separator` (for help texts and messages).
std::string optimizer_kind_names(const char* separator = ", ");

// How the SGD kinds apply weight decay: decoupled (default, w *= 1 - lr*wd) or L2 folded into
// the gradient (torch.optim.SGD semantics).
enum class WeightDecayMode { kDecoupled, kL2 };

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.01;
  double weight_decay = 0.0;
  double momentum = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double trust_coefficient = 0.001;
  WeightDecayMode weight_decay_mode = WeightDecayMode::kDecoupled;
  // Global gradient-norm clipping for every kind (docs/math.md): 0 = off, else the max ‖ĝ‖.
  double max_grad_norm = 0.0;

  // Rechecks every field against its kind (used by compile() and by file loaders).
  void validate() const;
};

// A configuration of `kind` with the given hyperparameters (decoupled weight decay).
OptimizerConfig make_config(OptimizerKind kind, const Hyperparameters& h);
// The library's defaults for a kind (kKindTable's `defaults` column).
OptimizerConfig default_config(OptimizerKind kind);
// The reference hyperparameters shared by tests, conformance and fuzzers (`reference` column).
OptimizerConfig reference_config(OptimizerKind kind);
// The benchmark hyperparameters (`bench` column), the same on the torch side of comparisons.
OptimizerConfig bench_config(OptimizerKind kind);

// Ideal device-memory traffic of one step per fp32 parameter (kKindTable), plus 4 B when the
// non-finite check reads G once more. The floor is this over the copy bandwidth.
double bytes_per_param(OptimizerKind kind, bool check_finite);

// Validators shared by the builders, Task::set_lr and Task::set_loss_scale.
void check_lr(double lr);
void check_loss_scale(double scale);
void check_max_grad_norm(double max_norm);  // finite, >= 0, a float32 that is not rounded to 0

// Fluent builders. The kind follows from the settings: SGD().momentum(0.9) is sgd_momentum,
// .nesterov(true) makes it sgd_nesterov (an error without momentum at compile()).
class SGD {
 public:
  SGD();
  SGD& lr(double v);
  SGD& momentum(double v);
  SGD& nesterov(bool v);
  SGD& weight_decay(double v);
  SGD& weight_decay_mode(WeightDecayMode v);
  SGD& max_grad_norm(double v);
  OptimizerConfig config() const;

 private:
  OptimizerConfig c_;
  bool nesterov_ = false;
};

class Adam {
 public:
  Adam();
  Adam& lr(double v);
  Adam& beta1(double v);
  Adam& beta2(double v);
  Adam& eps(double v);
  Adam& weight_decay(double v);
  Adam& max_grad_norm(double v);
  OptimizerConfig config() const { return c_; }

 protected:
  OptimizerConfig c_;
};

class AdamW : public Adam {
 public:
  AdamW();
  AdamW& lr(double v) { Adam::lr(v); return *this; }
  AdamW& beta1(double v) { Adam::beta1(v); return *this; }
  AdamW& beta2(double v) { Adam::beta2(v); return *this; }
  AdamW& eps(double v) { Adam::eps(v); return *this; }
  AdamW& weight_decay(double v) { Adam::weight_decay(v); return *this; }
  AdamW& max_grad_norm(double v) { Adam::max_grad_norm(v); return *this; }
};

class LARS {
 public:
  LARS();
  LARS& lr(double v);
  LARS& momentum(double v);
  LARS& nesterov(bool v);
  LARS& weight_decay(double v);
  LARS& trust_coefficient(double v);
  LARS& eps(double v);
  LARS& max_grad_norm(double v);
  OptimizerConfig config() const;

 private:
  OptimizerConfig c_;
  bool nesterov_ = false;
};

// Lion (kind lion): lr, beta1, beta2, weight_decay (decoupled).
class Lion {
 public:
  Lion();
  Lion& lr(double v);
  Lion& beta1(double v);
  Lion& beta2(double v);
  Lion& weight_decay(double v);
  Lion& max_grad_norm(double v);
  OptimizerConfig config() const { return c_; }

 private:
  OptimizerConfig c_;
};

// LAMB (kind lamb): lr, beta1, beta2, eps, weight_decay (added to the direction u).
class LAMB {
 public:
  LAMB();
  LAMB& lr(double v);
  LAMB& beta1(double v);
  LAMB& beta2(double v);
  LAMB& eps(double v);
  LAMB& weight_decay(double v);
  LAMB& max_grad_norm(double v);
  OptimizerConfig config() const { return c_; }

 private:
  OptimizerConfig c_;
};

}  // namespace renaissance
