// An independent float64 reference of every optimizer kind, written with Eigen straight from
// docs/math.md (and deliberately not from core/.../math/update_rules.inc, so that a misreading
// of the design in the library is not copied here). The tests compare the library's float32
// results with it by relative L2 per tensor.
//
// Inputs are what the library sees: float32 initial weights and float32 gradients as the
// backward pass stored them (multiplied by the loss scale). Everything after that is double:
// the unscale ĝ = g / scale, the hyperparameters exactly as configured (0.999 is the double
// 0.999, not 0.99900001f), the norms and every update.
#pragma once

#include <Eigen/Core>
#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "renaissance/region.h"

namespace renaissance {
namespace oracle {

// The parameters with every tensor in hyperparameter group 0 (the one-configuration oracles).
inline std::vector<ParamSpec> ungrouped(std::vector<ParamSpec> params) {
  for (ParamSpec& p : params) p.hyper_group = 0;
  return params;
}

// What both oracles keep of each tensor besides its numbers: its hyperparameter group, whether
// it is in the weight group (a muon task's tensor marked "adamw", ParamSpec::optimizer, runs the
// auxiliary AdamW instead), its shape (Muon's matrix view) and its applied-step count.
struct TensorBook {
  int group = 0;
  bool weight = false;
  std::vector<int64_t> shape;
  int64_t steps = 0;
};

inline TensorBook tensor_book(const ParamSpec& p, const std::vector<OptimizerConfig>& configs, const char* who) {
  if (p.hyper_group < 0 || p.hyper_group >= static_cast<int>(configs.size())) {
    throw std::invalid_argument(std::string(who) + ": " + p.name + " is in a group without a configuration");
  }
  const bool aux_marked =
      configs[static_cast<size_t>(p.hyper_group)].kind == OptimizerKind::kMuon && p.optimizer == ParamOptimizer::kAdamW;
  return TensorBook{p.hyper_group, group_of(p.role) == Group::kWeight && !aux_marked, p.shape, 0};
}

// The state of one tensor. `trust` is the LARS trust ratio η (LAMB: r) of the last applied step
// (weight-group tensors of the norm kinds only; 0 before the first step).
struct TensorState {
  Eigen::ArrayXd w, m, v;
  Eigen::ArrayXd vmax;  // amsgrad: the running maximum of v (torch's max_exp_avg_sq)
  double trust = 0.0;  // muon: the adjusted lr of the last applied step
  // muon: Σ lr_adj·‖X‖ over the applied steps, the path the orthogonalised updates moved w along
  // (the bound of the exact-mode Newton–Schulz's error scales with it: test_oracle.cc).
  double muon_path = 0.0;
};

// Muon's matrix view of a weight-group tensor (docs/math.md): (shape[0], prod(rest)); a 1-D
// tensor of n elements is 1 x n, a scalar 1 x 1.
inline std::pair<int64_t, int64_t> muon_view(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (shape.size() < 2) return {1, numel};
  return {shape[0], shape[0] == 0 ? 0 : numel / shape[0]};
}

// torch.optim.Muon's lr adjustment in double: original lr·sqrt(max(1, A/B)), match_rms_adamw
// 0.2·lr·sqrt(max(A, B)).
inline double muon_adjusted_lr(double lr, int64_t rows, int64_t cols, double adjust_lr) {
  const double a = static_cast<double>(rows), b = static_cast<double>(cols);
  if (adjust_lr != 0.0) return 0.2 * lr * std::sqrt(std::max(a, b));
  return b > 0.0 ? lr * std::sqrt(std::max(1.0, a / b)) : lr;  // no columns (no elements): factor 1
}

// Newton–Schulz in float64 (torch.optim.Muon's iteration): X = u / max(‖u‖_F, eps), on uᵀ when
// rows > cols; steps times A = X Xᵀ, B = b·A + c·A·A, X = a·X + B·X; transposed back. u and the
// result are row-major rows x cols.
inline Eigen::ArrayXd newton_schulz_f64(const Eigen::ArrayXd& u, int64_t rows, int64_t cols, const OptimizerConfig& c) {
  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMajor x = Eigen::Map<const RowMajor>(u.data(), rows, cols);
  const bool tall = rows > cols;
  if (tall) x = RowMajor(x.transpose());
  x /= std::max(x.norm(), c.ns_eps);
  for (int s = 0; s < static_cast<int>(c.ns_steps); ++s) {
    const RowMajor a = x * x.transpose();
    const RowMajor b = c.ns_b * a + c.ns_c * (a * a);
    x = c.ns_a * x + b * x;
  }
  if (tall) x = RowMajor(x.transpose());
  return Eigen::Map<const Eigen::ArrayXd>(x.data(), rows * cols);
}

class OracleF64 {
 public:
  OracleF64(const OptimizerConfig& config, const std::vector<ParamSpec>& params,
            const std::vector<std::vector<float>>& initial_weights)
      : OracleF64(std::vector<OptimizerConfig>{config}, ungrouped(params), initial_weights) {}
  // Hyperparameter groups: tensor i follows group_configs[params[i].hyper_group]; the loss scale,
  // clipping (group 0's max_grad_norm) and the skip rule are task-wide.
  OracleF64(const std::vector<OptimizerConfig>& group_configs, const std::vector<ParamSpec>& params,
            const std::vector<std::vector<float>>& initial_weights)
      : configs_(group_configs), c_(group_configs.at(0)) {
    if (initial_weights.size() != params.size()) throw std::invalid_argument("oracle: one weight vector per param");
    for (size_t i = 0; i < params.size(); ++i) {
      const Eigen::Index n = static_cast<Eigen::Index>(params[i].numel());
      if (static_cast<Eigen::Index>(initial_weights[i].size()) != n) {
        throw std::invalid_argument("oracle: weight vector of " + params[i].name + " has the wrong size");
      }
      TensorState s;
      s.w = Eigen::Map<const Eigen::ArrayXf>(initial_weights[i].data(), n).cast<double>();
      s.m = Eigen::ArrayXd::Zero(n);
      s.v = Eigen::ArrayXd::Zero(n);
      s.vmax = Eigen::ArrayXd::Zero(n);
      tensors_.push_back(std::move(s));
      book_.push_back(tensor_book(params[i], configs_, "oracle"));
    }
  }

  // One optimizer step with the given learning rate and loss scale. Returns false, and changes
  // nothing (not even t), when any gradient element of any tensor is NaN or ±Inf.
  bool step(const std::vector<std::vector<float>>& grads, double lr, double loss_scale) {
    return step(grads, std::vector<double>(configs_.size(), lr), loss_scale, {});
  }
  // With lrs[h] for group h and a per-tensor mask (torch's `.grad is None`; empty: none masked):
  // a masked tensor's gradient is not looked at, it takes no part in the clip norm, and its state
  // and its own applied-step count (bias corrections, the first momentum step) stay as they were.
  bool step(const std::vector<std::vector<float>>& grads, const std::vector<double>& lrs, double loss_scale,
            const std::vector<int32_t>& mask) {
    if (grads.size() != tensors_.size()) throw std::invalid_argument("oracle: one gradient vector per param");
    auto masked = [&](size_t i) { return !mask.empty() && mask[i] != 0; };
    for (size_t i = 0; i < grads.size(); ++i) {
      if (masked(i)) continue;
      for (float x : grads[i]) {
        if (!std::isfinite(x)) return false;
      }
    }
    ++t_;  // t counts applied steps only
    std::vector<Eigen::ArrayXd> g_hat(tensors_.size());
    double sum_sq = 0.0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (masked(i)) continue;
      const Eigen::Index n = tensors_[i].w.size();
      if (static_cast<Eigen::Index>(grads[i].size()) != n) throw std::invalid_argument("oracle: gradient size");
      g_hat[i] = Eigen::Map<const Eigen::ArrayXf>(grads[i].data(), n).cast<double>() / loss_scale;
      sum_sq += g_hat[i].square().sum();
    }
    if (configs_[0].max_grad_norm > 0.0) {
      // torch.nn.utils.clip_grad_norm_: total over every parameter, coefficient clamped at 1.
      last_total_norm_ = std::sqrt(sum_sq);
      const double coefficient = std::min(1.0, configs_[0].max_grad_norm / (last_total_norm_ + 1e-6));
      for (auto& g : g_hat) g = g * coefficient;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (masked(i)) continue;
      c_ = configs_[static_cast<size_t>(book_[i].group)];
      tc_ = ++book_[i].steps;
      shape_ = book_[i].shape;
      update(tensors_[i], g_hat[i], lrs.at(static_cast<size_t>(book_[i].group)), book_[i].weight);
    }
    return true;
  }

  // ‖ĝ‖ over all parameters before clipping, of the last applied step (clipping on).
  double last_total_norm() const { return last_total_norm_; }

  int64_t t() const { return t_; }
  int64_t t(size_t id) const { return book_.at(id).steps; }  // tensor id's applied steps
  size_t size() const { return tensors_.size(); }
  const TensorState& tensor(size_t id) const { return tensors_.at(id); }
  bool is_weight_group(size_t id) const { return book_.at(id).weight; }

 private:
  void update(TensorState& s, const Eigen::ArrayXd& g_hat, double lr, bool weight_group) {
    // The bias-like group is never weight-decayed (and never LARS-adapted).
    const double wd = weight_group ? c_.weight_decay : 0.0;
    const bool l2 = c_.weight_decay_mode == WeightDecayMode::kL2;
    switch (c_.kind) {
      case OptimizerKind::kSgd:
        if (l2) {
          s.w = s.w - lr * (g_hat + wd * s.w);
        } else {
          s.w = s.w * (1.0 - lr * wd) - lr * g_hat;
        }
        break;
      case OptimizerKind::kSgdMomentum:
        sgd_momentum(s, g_hat, lr, wd, l2, /*nesterov=*/false);
        break;
      case OptimizerKind::kSgdNesterov:
        sgd_momentum(s, g_hat, lr, wd, l2, /*nesterov=*/true);
        break;
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        const bool decoupled = c_.kind == OptimizerKind::kAdamW;
        Eigen::ArrayXd g = g_hat;
        if (decoupled) {
          s.w = s.w * (1.0 - lr * wd);
        } else {
          g = g_hat + wd * s.w;  // Adam: L2 folded into the gradient
        }
        s.m = c_.beta1 * s.m + (1.0 - c_.beta1) * g;
        s.v = c_.beta2 * s.v + (1.0 - c_.beta2) * g.square();
        const double bc1 = 1.0 / (1.0 - std::pow(c_.beta1, static_cast<double>(tc_)));
        const double bc2 = 1.0 / (1.0 - std::pow(c_.beta2, static_cast<double>(tc_)));
        if (c_.amsgrad) {
          // torch.maximum(max_exp_avg_sq, exp_avg_sq): the denominator reads the running max.
          s.vmax = s.vmax.max(s.v);
          s.w = s.w - lr * (s.m * bc1) / ((s.vmax * bc2).sqrt() + c_.eps);
        } else {
          s.w = s.w - lr * (s.m * bc1) / ((s.v * bc2).sqrt() + c_.eps);
        }
        break;
      }
      case OptimizerKind::kLars:
      case OptimizerKind::kLarsNesterov: {
        const bool nesterov = c_.kind == OptimizerKind::kLarsNesterov;
        if (!weight_group) {
          // Bias-like group of LARS: plain momentum SGD (Nesterov for lars_nesterov), wd = 0.
          sgd_momentum(s, g_hat, lr, 0.0, /*l2=*/false, nesterov);
          break;
        }
        const double w_norm = std::sqrt(s.w.square().sum());
        const double g_norm = std::sqrt(g_hat.square().sum());
        double eta = 1.0;
        if (w_norm >= 1e-12 && g_norm >= 1e-12) {
          eta = c_.trust_coefficient * w_norm / (g_norm + wd * w_norm + c_.eps);
        }
        eta = std::min(eta, 100.0);
        s.trust = eta;
        const Eigen::ArrayXd p = g_hat + wd * s.w;
        s.m = c_.momentum * s.m + lr * eta * p;
        if (nesterov) {
          s.w = s.w - (c_.momentum * s.m + lr * eta * p);
        } else {
          s.w = s.w - s.m;
        }
        break;
      }
      case OptimizerKind::kLion: {
        const Eigen::ArrayXd c = c_.beta1 * s.m + (1.0 - c_.beta1) * g_hat;
        s.w = s.w * (1.0 - lr * wd) - lr * c.sign();  // Eigen's sign(0) is 0
        s.m = c_.beta2 * s.m + (1.0 - c_.beta2) * g_hat;
        break;
      }
      case OptimizerKind::kLamb: {
        s.m = c_.beta1 * s.m + (1.0 - c_.beta1) * g_hat;
        s.v = c_.beta2 * s.v + (1.0 - c_.beta2) * g_hat.square();
        const double bc1 = 1.0 - std::pow(c_.beta1, static_cast<double>(tc_));
        const double bc2 = 1.0 - std::pow(c_.beta2, static_cast<double>(tc_));
        const Eigen::ArrayXd u = (s.m / bc1) / ((s.v / bc2).sqrt() + c_.eps) + wd * s.w;
        double r = 1.0;  // the bias-like group is never adapted
        if (weight_group) {
          const double w_norm = std::sqrt(s.w.square().sum());
          const double u_norm = std::sqrt(u.square().sum());
          if (w_norm > 0.0 && u_norm > 0.0) r = w_norm / u_norm;
          s.trust = r;
        }
        s.w = s.w - lr * r * u;
        break;
      }
      case OptimizerKind::kMuon: {
        if (!weight_group) {
          // The auxiliary AdamW (torch.optim.AdamW): its own lr (aux_lr, not scheduled), betas,
          // eps and decoupled weight decay w *= 1 - aux_lr*aux_weight_decay, first.
          s.w = s.w * (1.0 - c_.aux_lr * c_.aux_weight_decay);
          s.m = c_.beta1 * s.m + (1.0 - c_.beta1) * g_hat;
          s.v = c_.beta2 * s.v + (1.0 - c_.beta2) * g_hat.square();
          const double bc1 = 1.0 / (1.0 - std::pow(c_.beta1, static_cast<double>(tc_)));
          const double bc2 = 1.0 / (1.0 - std::pow(c_.beta2, static_cast<double>(tc_)));
          s.w = s.w - c_.aux_lr * (s.m * bc1) / ((s.v * bc2).sqrt() + c_.eps);
          break;
        }
        // torch.optim.Muon: buf.lerp_(g, 1 - μ); u = g.lerp(buf, μ) (Nesterov) or buf.
        const double mu = c_.momentum;
        s.m = s.m + (1.0 - mu) * (g_hat - s.m);
        const Eigen::ArrayXd u = c_.nesterov ? Eigen::ArrayXd(g_hat + mu * (s.m - g_hat)) : s.m;
        const auto [rows, cols] = muon_view(shape_);
        const double lr_adj = muon_adjusted_lr(lr, rows, cols, c_.adjust_lr);
        s.trust = lr_adj;
        s.w = s.w * (1.0 - lr * c_.weight_decay);
        if (u.size() == 0) break;
        const Eigen::ArrayXd x = newton_schulz_f64(u, rows, cols, c_);
        s.w = s.w - lr_adj * x;
        s.muon_path += lr_adj * std::sqrt(x.square().sum());
        break;
      }
    }
  }

  // sgd_momentum / sgd_nesterov in either weight-decay mode (also LARS's bias-like group).
  void sgd_momentum(TensorState& s, const Eigen::ArrayXd& g_hat, double lr, double wd, bool l2, bool nesterov) {
    const double beta = c_.momentum;
    const Eigen::ArrayXd g = l2 ? Eigen::ArrayXd(g_hat + wd * s.w) : g_hat;
    // torch.optim.SGD: the first applied step's buffer is ĝ' itself, later ones are dampened.
    if (tc_ == 1) {
      s.m = g;
    } else {
      s.m = beta * s.m + (1.0 - c_.dampening) * g;
    }
    const Eigen::ArrayXd direction = nesterov ? Eigen::ArrayXd(beta * s.m + g) : s.m;
    if (l2) {
      s.w = s.w - lr * direction;
    } else {
      s.w = s.w * (1.0 - lr * wd) - lr * direction;
    }
  }

  // Each hyperparameter group's configuration, each tensor's book; c_ and tc_
  // are those of the tensor being updated (update() and sgd_momentum() read them).
  std::vector<OptimizerConfig> configs_;
  std::vector<TensorBook> book_;  // tensor_book() of every tensor
  OptimizerConfig c_;
  int64_t tc_ = 0;
  std::vector<int64_t> shape_;  // the shape of the tensor being updated (muon's matrix view)
  std::vector<TensorState> tensors_;
  int64_t t_ = 0;
  double last_total_norm_ = 0.0;
};

// ‖a - ref‖ / ‖ref‖ over one tensor, in double; the absolute ‖a - ref‖ when ref is all zero
// (an empty tensor gives 0). NaN in `a` gives NaN, which fails any `<=` bound.
inline double relative_l2(const std::vector<float>& a, const Eigen::ArrayXd& ref) {
  if (static_cast<Eigen::Index>(a.size()) != ref.size()) return INFINITY;
  const Eigen::ArrayXd x = Eigen::Map<const Eigen::ArrayXf>(a.data(), ref.size()).cast<double>();
  const double diff = std::sqrt((x - ref).square().sum());
  const double norm = std::sqrt(ref.square().sum());
  return norm > 0.0 ? diff / norm : diff;
}

}  // namespace oracle
}  // namespace renaissance
