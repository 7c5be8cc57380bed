// Optimizer configurations and the fluent builders SGD(), Adam(), AdamW(), LARS(), Lion(), LAMB(). The kinds
// themselves are described in renaissance/kinds.h. Hyperparameters are held as double
// (docs/math.md: derived scalars such as 1-β2 are formed in double from the configured values).
// Every setter validates its value and throws Error(kInvalidArgument) naming the parameter and
// the value.
#pragma once

#include <string>

#include "renaissance/kinds.h"
#include "renaissance/precision.h"

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
  // torch.optim.SGD's dampening (the SGD kinds only): the momentum buffer is m = β*m + (1-d)*ĝ'
  // after the first applied step, whose m is ĝ' (docs/math.md). Nesterov needs it 0.
  double dampening = 0.0;
  WeightDecayMode weight_decay_mode = WeightDecayMode::kDecoupled;
  // Global gradient-norm clipping for every kind (docs/math.md): 0 = off, else the max ‖ĝ‖.
  double max_grad_norm = 0.0;
  // torch's maximize: ascend the objective. The gradient is negated before everything else of
  // the update (weight decay, momentum, moments), so the step is bit for bit the minimizing step
  // on -G (docs/math.md). A per-group setting: the groups of one task may differ in it.
  bool maximize = false;
  // torch's amsgrad (adam and adamw only): the denominator reads the running maximum of V, held in
  // the VMAX family (docs/math.md). Task-wide: every hyperparameter group of a task holds the same.
  bool amsgrad = false;
  // Muon (docs/math.md, "Muon"): the auxiliary AdamW's lr and decoupled weight decay (the
  // bias-like group and the tensors marked ParamOptimizer::kAdamW), Nesterov
  // momentum, the Newton–Schulz steps, eps and coefficients, the lr adjustment (0 original,
  // 1 match_rms_adamw; task-wide) and the Newton–Schulz products' mode (muon_mode: 0 exact, 1 fast;
  // task-wide). Muon's lr, weight_decay and momentum are the fields above, and beta1, beta2, eps
  // the auxiliary AdamW's.
  double aux_lr = 3e-4;
  double aux_weight_decay = 0.0;
  bool nesterov = true;
  double ns_steps = 5;
  double ns_eps = 1e-7;
  double adjust_lr = 0;
  double ns_a = 3.4445;
  double ns_b = -4.7750;
  double ns_c = 2.0315;
  double muon_mode = 0;

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
// The same with a precision: a bf16/fp16 model copy writes 2 B more; model-dtype gradients read
// 2 B instead of 4 at every read of G (the check's, and the kind's: twice for LARS, once else).
// AdamW with bf16 gradients and copy: 28 B (+2 B for the check).
double bytes_per_param(OptimizerKind kind, bool check_finite, const PrecisionOptions& precision);

// Validators shared by the builders, Task::set_lr and Task::set_loss_scale.
void check_lr(double lr);
void check_loss_scale(double scale);
void check_max_grad_norm(double max_norm);  // finite, >= 0, a float32 that is not rounded to 0

// Validates one number of the hyperparameter table (renaissance/hyperparameters.h) by its name
// with the rule OptimizerConfig::validate applies; an unknown name or a flag is an error.
void check_hyperparameter(const char* name, double value);

// The setters the fluent builders share, each written once; a builder makes public the ones its
// kind reads (`using`). Each setter validates its value at once and names it in the error.
template <class Builder>
class BuilderSetters {
 protected:
  explicit BuilderSetters(OptimizerKind kind) : c_(default_config(kind)) {}
  Builder& lr(double v) { return set("lr", &OptimizerConfig::lr, v); }
  Builder& weight_decay(double v) { return set("weight_decay", &OptimizerConfig::weight_decay, v); }
  Builder& momentum(double v) { return set("momentum", &OptimizerConfig::momentum, v); }
  Builder& beta1(double v) { return set("beta1", &OptimizerConfig::beta1, v); }
  Builder& beta2(double v) { return set("beta2", &OptimizerConfig::beta2, v); }
  Builder& eps(double v) { return set("eps", &OptimizerConfig::eps, v); }
  Builder& trust_coefficient(double v) { return set("trust_coefficient", &OptimizerConfig::trust_coefficient, v); }
  Builder& max_grad_norm(double v) { return set("max_grad_norm", &OptimizerConfig::max_grad_norm, v); }
  Builder& dampening(double v) { return set("dampening", &OptimizerConfig::dampening, v); }
  Builder& maximize(bool v) {
    c_.maximize = v;
    return static_cast<Builder&>(*this);
  }
  Builder& amsgrad(bool v) {
    c_.amsgrad = v;
    return static_cast<Builder&>(*this);
  }
  Builder& aux_lr(double v) { return set("aux_lr", &OptimizerConfig::aux_lr, v); }
  Builder& aux_weight_decay(double v) { return set("aux_weight_decay", &OptimizerConfig::aux_weight_decay, v); }
  Builder& nesterov_flag(bool v) {
    c_.nesterov = v;
    return static_cast<Builder&>(*this);
  }
  Builder& ns_steps(int v) { return set("ns_steps", &OptimizerConfig::ns_steps, v); }
  Builder& ns_eps(double v) { return set("ns_eps", &OptimizerConfig::ns_eps, v); }
  Builder& ns_coefficients(double a, double b, double c) {
    set("ns_a", &OptimizerConfig::ns_a, a);
    set("ns_b", &OptimizerConfig::ns_b, b);
    return set("ns_c", &OptimizerConfig::ns_c, c);
  }
  // Muon's mode as its row's number (0 exact, 1 fast), checked like every setter's value.
  Builder& muon_mode_value(double v) { return set("muon_mode", &OptimizerConfig::muon_mode, v); }
  Builder& set_adjust_lr(double v) { return set("adjust_lr", &OptimizerConfig::adjust_lr, v); }

  OptimizerConfig c_;

 private:
  Builder& set(const char* name, double OptimizerConfig::*field, double v) {
    check_hyperparameter(name, v);
    c_.*field = v;
    return static_cast<Builder&>(*this);
  }
};

// Fluent builders. The kind follows from the settings: SGD().momentum(0.9) is sgd_momentum,
// .nesterov(true) makes it sgd_nesterov (an error without momentum or with dampening at config(),
// torch's rule). .dampening(d) is torch's; without momentum it has no effect (as in torch).
class SGD : public BuilderSetters<SGD> {
 public:
  SGD() : BuilderSetters(OptimizerKind::kSgd) {}
  using BuilderSetters::lr, BuilderSetters::momentum, BuilderSetters::weight_decay, BuilderSetters::max_grad_norm,
      BuilderSetters::maximize, BuilderSetters::dampening;
  SGD& nesterov(bool v) { nesterov_ = v; return *this; }
  SGD& weight_decay_mode(WeightDecayMode v) { c_.weight_decay_mode = v; return *this; }
  OptimizerConfig config() const;

 private:
  bool nesterov_ = false;
};

// Adam (L2 weight decay) and AdamW (decoupled): lr, beta1, beta2, eps, weight_decay, amsgrad.
template <OptimizerKind kKind>
class AdamFamily : public BuilderSetters<AdamFamily<kKind>> {
  using Base = BuilderSetters<AdamFamily<kKind>>;

 public:
  AdamFamily() : Base(kKind) {}
  using Base::lr, Base::beta1, Base::beta2, Base::eps, Base::weight_decay, Base::max_grad_norm, Base::maximize,
      Base::amsgrad;
  OptimizerConfig config() const { return this->c_; }
};
using Adam = AdamFamily<OptimizerKind::kAdam>;
using AdamW = AdamFamily<OptimizerKind::kAdamW>;

// LARS, and LARS-Nesterov with .nesterov(true).
class LARS : public BuilderSetters<LARS> {
 public:
  LARS() : BuilderSetters(OptimizerKind::kLars) {}
  using BuilderSetters::lr, BuilderSetters::momentum, BuilderSetters::weight_decay,
      BuilderSetters::trust_coefficient, BuilderSetters::eps, BuilderSetters::max_grad_norm, BuilderSetters::maximize;
  LARS& nesterov(bool v) { nesterov_ = v; return *this; }
  OptimizerConfig config() const;

 private:
  bool nesterov_ = false;
};

// Lion (kind lion): lr, beta1, beta2, weight_decay (decoupled).
class Lion : public BuilderSetters<Lion> {
 public:
  Lion() : BuilderSetters(OptimizerKind::kLion) {}
  using BuilderSetters::lr, BuilderSetters::beta1, BuilderSetters::beta2, BuilderSetters::weight_decay,
      BuilderSetters::max_grad_norm, BuilderSetters::maximize;
  OptimizerConfig config() const { return c_; }
};

// LAMB (kind lamb): lr, beta1, beta2, eps, weight_decay (added to the direction u).
class LAMB : public BuilderSetters<LAMB> {
 public:
  LAMB() : BuilderSetters(OptimizerKind::kLamb) {}
  using BuilderSetters::lr, BuilderSetters::beta1, BuilderSetters::beta2, BuilderSetters::eps,
      BuilderSetters::weight_decay, BuilderSetters::max_grad_norm, BuilderSetters::maximize;
  OptimizerConfig config() const { return c_; }
};

// How Muon adjusts its lr per matrix (docs/math.md, "Muon"): torch.optim.Muon's adjust_lr_fn.
enum class MuonAdjustLr { kOriginal = 0, kMatchRmsAdamW = 1 };
// How Muon computes Newton–Schulz's matrix products (docs/math.md, "Muon: fast mode"): exact
// (fixed-point integer products, the same bits on every backend) or fast (fp32 products on the
// CPU, bf16 inputs with fp32 accumulation on CUDA; not bitwise across backends).
enum class MuonMode { kExact = 0, kFast = 1 };

// Muon (kind muon): lr, weight_decay, momentum, nesterov, the Newton–Schulz steps, eps and
// coefficients, adjust_lr and mode for the weight group's matrices; aux_lr, aux_weight_decay, beta1,
// beta2, eps for the auxiliary AdamW of the bias-like group and of the tensors a layout marks
// "adamw" (torch.optim.Muon's and MuonWithAuxAdam's defaults; aux_weight_decay 0 as the Muon
// package's).
class Muon : public BuilderSetters<Muon> {
 public:
  Muon() : BuilderSetters(OptimizerKind::kMuon) {}
  using BuilderSetters::lr, BuilderSetters::weight_decay, BuilderSetters::momentum, BuilderSetters::beta1,
      BuilderSetters::beta2, BuilderSetters::eps, BuilderSetters::max_grad_norm, BuilderSetters::maximize,
      BuilderSetters::aux_lr, BuilderSetters::aux_weight_decay, BuilderSetters::ns_steps, BuilderSetters::ns_eps, BuilderSetters::ns_coefficients;
  Muon& nesterov(bool v) { return nesterov_flag(v); }
  // Checked like every setter's value (an enum cast from another number is refused here).
  Muon& adjust_lr(MuonAdjustLr v) { return set_adjust_lr(static_cast<double>(v)); }
  Muon& mode(MuonMode v) { return muon_mode_value(static_cast<double>(v)); }
  OptimizerConfig config() const { return c_; }
};

}  // namespace renaissance
