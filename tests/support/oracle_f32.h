// An honest float32 implementation of every optimizer kind, used only to calibrate the oracle
// bounds: the relative error a correct float32 implementation of the formulas has against the
// float64 oracle (tests/support/oracle_f64.h), measured on the very inputs of each check. The library
// may be off by at most a small multiple of that (tests/runtime/test_oracle.cc, conformance/runner.cc),
// so the bound follows the regime (near eps, β close to 1, tiny or huge weights) instead of a
// constant that has to hold for the worst regime and is then loose everywhere else.
//
// "Honest" means: element math in float, one IEEE operation at a time (the build forbids FMA
// contraction), and the derived scalars (lr, 1 - lr*wd, 1 - β, 1/scale, the bias corrections,
// the LARS trust ratio from norms accumulated in double) formed in double and rounded to float
// once, as docs/math.md prescribes. Written from the formulas in oracle_f64.h, not from
// core/.../math/update_rules.inc: a breakage there must not move this reference with it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "renaissance/region.h"
#include "support/oracle_f64.h"  // ungrouped()

namespace renaissance {
namespace oracle {

struct TensorStateF32 {
  std::vector<float> w, m, v;
  std::vector<float> vmax;  // amsgrad: the running maximum of v
  float trust = 0.0f;  // LARS η of the last applied step (weight group)
};

class OracleF32 {
 public:
  OracleF32(const OptimizerConfig& config, const std::vector<ParamSpec>& params,
            const std::vector<std::vector<float>>& initial_weights)
      : OracleF32(std::vector<OptimizerConfig>{config}, ungrouped(params), initial_weights) {}
  // Hyperparameter groups, as OracleF64's.
  OracleF32(const std::vector<OptimizerConfig>& group_configs, const std::vector<ParamSpec>& params,
            const std::vector<std::vector<float>>& initial_weights)
      : configs_(group_configs), c_(group_configs.at(0)) {
    if (initial_weights.size() != params.size()) throw std::invalid_argument("oracle32: one weight vector per param");
    for (size_t i = 0; i < params.size(); ++i) {
      TensorStateF32 s;
      s.w = initial_weights[i];
      s.m.assign(s.w.size(), 0.0f);
      s.v.assign(s.w.size(), 0.0f);
      s.vmax.assign(s.w.size(), 0.0f);
      tensors_.push_back(std::move(s));
      book_.push_back(tensor_book(params[i], configs_, "oracle32"));
    }
  }

  // Same contract as OracleF64::step: false (and nothing changed) on a non-finite gradient.
  bool step(const std::vector<std::vector<float>>& grads, double lr, double loss_scale) {
    return step(grads, std::vector<double>(configs_.size(), lr), loss_scale, {});
  }
  // Per-group lrs and a per-tensor mask, as OracleF64's.
  bool step(const std::vector<std::vector<float>>& grads, const std::vector<double>& lrs, double loss_scale,
            const std::vector<int32_t>& mask) {
    auto masked = [&](size_t i) { return !mask.empty() && mask[i] != 0; };
    for (size_t i = 0; i < grads.size(); ++i) {
      if (masked(i)) continue;
      for (float x : grads[i]) {
        if (!std::isfinite(x)) return false;
      }
    }
    ++t_;
    const float inv_scale = static_cast<float>(1.0 / loss_scale);
    std::vector<std::vector<float>> gh(tensors_.size());
    double sum_sq = 0.0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (masked(i)) continue;
      gh[i].resize(grads[i].size());
      for (size_t k = 0; k < gh[i].size(); ++k) {
        gh[i][k] = grads[i][k] * inv_scale;
        sum_sq += static_cast<double>(gh[i][k]) * gh[i][k];
      }
    }
    if (configs_[0].max_grad_norm > 0.0) {
      // Clipping: the total in double, the coefficient rounded to float once, ĝ*coef in float.
      last_total_norm_ = std::sqrt(sum_sq);
      const float coefficient = static_cast<float>(std::min(1.0, configs_[0].max_grad_norm / (last_total_norm_ + 1e-6)));
      for (auto& g : gh) {
        for (float& x : g) x = x * coefficient;
      }
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (masked(i)) continue;
      c_ = configs_[static_cast<size_t>(book_[i].group)];
      tc_ = ++book_[i].steps;
      shape_ = book_[i].shape;
      double lr = lrs.at(static_cast<size_t>(book_[i].group));
      if (c_.kind == OptimizerKind::kMuon && !book_[i].weight) {
        // Muon's bias-like group is an AdamW with its own lr (aux_lr, not scheduled) and its own
        // decoupled weight decay (aux_weight_decay), which it applies as a weight group would.
        c_.kind = OptimizerKind::kAdamW;
        lr = c_.aux_lr;
        c_.weight_decay = c_.aux_weight_decay;
        update(tensors_[i], gh[i], lr, true);
        continue;
      }
      update(tensors_[i], gh[i], lr, book_[i].weight);
    }
    return true;
  }

  double last_total_norm() const { return last_total_norm_; }

  const TensorStateF32& tensor(size_t id) const { return tensors_.at(id); }

 private:
  void update(TensorStateF32& s, const std::vector<float>& gh, double lr_d, bool weight_group) {
    const double wd_d = weight_group ? c_.weight_decay : 0.0;
    const bool l2 = c_.weight_decay_mode == WeightDecayMode::kL2;
    const float lr = static_cast<float>(lr_d);
    const float wd = static_cast<float>(wd_d);
    const float decay = static_cast<float>(1.0 - lr_d * wd_d);
    const float mom = static_cast<float>(c_.momentum);
    const size_t n = s.w.size();
    switch (c_.kind) {
      case OptimizerKind::kSgd:
        for (size_t k = 0; k < n; ++k) {
          s.w[k] = l2 ? s.w[k] - lr * (gh[k] + wd * s.w[k]) : s.w[k] * decay - lr * gh[k];
        }
        break;
      case OptimizerKind::kSgdMomentum:
      case OptimizerKind::kSgdNesterov:
        sgd_momentum(s, gh, lr, wd, decay, mom, l2, c_.kind == OptimizerKind::kSgdNesterov);
        break;
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW: {
        const bool decoupled = c_.kind == OptimizerKind::kAdamW;
        const float b1 = static_cast<float>(c_.beta1), b2 = static_cast<float>(c_.beta2);
        const float omb1 = static_cast<float>(1.0 - c_.beta1), omb2 = static_cast<float>(1.0 - c_.beta2);
        const float eps = static_cast<float>(c_.eps);
        const float bc1 = static_cast<float>(1.0 / (1.0 - std::pow(c_.beta1, static_cast<double>(tc_))));
        const float bc2 = static_cast<float>(1.0 / (1.0 - std::pow(c_.beta2, static_cast<double>(tc_))));
        for (size_t k = 0; k < n; ++k) {
          float g = gh[k];
          if (decoupled) {
            s.w[k] = s.w[k] * decay;
          } else {
            g = g + wd * s.w[k];
          }
          s.m[k] = b1 * s.m[k] + omb1 * g;
          s.v[k] = b2 * s.v[k] + omb2 * (g * g);
          float second = s.v[k];
          if (c_.amsgrad) {
            // torch.maximum: a NaN on either side is the result (the running max's first).
            float& x = s.vmax[k];
            if (!std::isnan(x)) x = std::isnan(s.v[k]) || x < s.v[k] ? s.v[k] : x;
            second = x;
          }
          s.w[k] = s.w[k] - (lr * (s.m[k] * bc1)) / (std::sqrt(second * bc2) + eps);
        }
        break;
      }
      case OptimizerKind::kLars:
      case OptimizerKind::kLarsNesterov: {
        const bool nesterov = c_.kind == OptimizerKind::kLarsNesterov;
        if (!weight_group) {  // bias-like group: momentum SGD with the LARS lr, no decay
          sgd_momentum(s, gh, lr, 0.0f, 1.0f, mom, /*l2=*/false, nesterov);
          break;
        }
        double w_sq = 0, g_sq = 0;
        for (size_t k = 0; k < n; ++k) {
          w_sq += static_cast<double>(s.w[k]) * s.w[k];
          g_sq += static_cast<double>(gh[k]) * gh[k];
        }
        const double w_norm = std::sqrt(w_sq), g_norm = std::sqrt(g_sq);
        double eta = 1.0;
        if (w_norm >= 1e-12 && g_norm >= 1e-12) eta = c_.trust_coefficient * w_norm / (g_norm + wd_d * w_norm + c_.eps);
        s.trust = static_cast<float>(std::min(eta, 100.0));
        const float lr_eta = lr * s.trust;
        for (size_t k = 0; k < n; ++k) {
          const float p = gh[k] + wd * s.w[k];
          const float scaled = lr_eta * p;
          s.m[k] = mom * s.m[k] + scaled;
          s.w[k] = nesterov ? s.w[k] - (mom * s.m[k] + scaled) : s.w[k] - s.m[k];
        }
        break;
      }
      case OptimizerKind::kLion: {
        const float b1 = static_cast<float>(c_.beta1), b2 = static_cast<float>(c_.beta2);
        const float omb1 = static_cast<float>(1.0 - c_.beta1), omb2 = static_cast<float>(1.0 - c_.beta2);
        for (size_t k = 0; k < n; ++k) {
          const float c = b1 * s.m[k] + omb1 * gh[k];
          const float sgn = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
          s.w[k] = s.w[k] * decay - lr * sgn;
          s.m[k] = b2 * s.m[k] + omb2 * gh[k];
        }
        break;
      }
      case OptimizerKind::kLamb: {
        const float b1 = static_cast<float>(c_.beta1), b2 = static_cast<float>(c_.beta2);
        const float omb1 = static_cast<float>(1.0 - c_.beta1), omb2 = static_cast<float>(1.0 - c_.beta2);
        const float eps = static_cast<float>(c_.eps);
        const float bc1 = static_cast<float>(1.0 / (1.0 - std::pow(c_.beta1, static_cast<double>(tc_))));
        const float bc2 = static_cast<float>(1.0 / (1.0 - std::pow(c_.beta2, static_cast<double>(tc_))));
        std::vector<float> u(n);
        double w_sq = 0, u_sq = 0;
        for (size_t k = 0; k < n; ++k) {
          s.m[k] = b1 * s.m[k] + omb1 * gh[k];
          s.v[k] = b2 * s.v[k] + omb2 * (gh[k] * gh[k]);
          u[k] = (s.m[k] * bc1) / (std::sqrt(s.v[k] * bc2) + eps) + wd * s.w[k];
          w_sq += static_cast<double>(s.w[k]) * s.w[k];
          u_sq += static_cast<double>(u[k]) * u[k];
        }
        float r = 1.0f;
        if (weight_group) {
          const double w_norm = std::sqrt(w_sq), u_norm = std::sqrt(u_sq);
          r = (w_norm > 0.0 && u_norm > 0.0) ? static_cast<float>(w_norm / u_norm) : 1.0f;
          s.trust = r;
        }
        const float lr_r = lr * r;
        for (size_t k = 0; k < n; ++k) s.w[k] = s.w[k] - lr_r * u[k];
        break;
      }
      case OptimizerKind::kMuon: {
        // The weight group (the bias-like group ran as AdamW above). The element-wise parts in
        // float: torch.lerp's formula (|w| < 0.5 ? a + w*(b-a) : b - (b-a)*(1-w)), w1 = 1 - μ
        // formed in double; the Newton–Schulz in double rounded to float, so that this measures
        // the element-wise rounding alone (test_oracle.cc bounds the orthogonalisation apart).
        auto lerp = [](float a, float b, float w) {
          return (w < 0.5f && w > -0.5f) ? a + w * (b - a) : b - (b - a) * (1.0f - w);
        };
        const float w1 = static_cast<float>(1.0 - c_.momentum);
        Eigen::ArrayXd u(static_cast<Eigen::Index>(n));
        for (size_t k = 0; k < n; ++k) {
          s.m[k] = lerp(s.m[k], gh[k], w1);
          u[static_cast<Eigen::Index>(k)] = c_.nesterov ? lerp(gh[k], s.m[k], mom) : s.m[k];
        }
        const auto [rows, cols] = muon_view(shape_);
        const double adjust = muon_adjusted_lr(1.0, rows, cols, c_.adjust_lr);
        const float lr_adj = static_cast<float>(static_cast<double>(lr) * adjust);
        s.trust = lr_adj;
        if (n == 0) break;
        const Eigen::ArrayXd x = newton_schulz_f64(u, rows, cols, c_);
        for (size_t k = 0; k < n; ++k) {
          s.w[k] = s.w[k] * decay - lr_adj * static_cast<float>(x[static_cast<Eigen::Index>(k)]);
        }
        break;
      }
    }
  }

  void sgd_momentum(TensorStateF32& s, const std::vector<float>& gh, float lr, float wd, float decay, float mom,
                    bool l2, bool nesterov) const {
    // torch.optim.SGD's dampening: the first applied step copies ĝ', later ones add (1-d)*ĝ'.
    const float damp = static_cast<float>(1.0 - c_.dampening);
    for (size_t k = 0; k < s.w.size(); ++k) {
      const float g = l2 ? gh[k] + wd * s.w[k] : gh[k];
      s.m[k] = tc_ == 1 ? g : mom * s.m[k] + damp * g;
      const float dir = nesterov ? mom * s.m[k] + g : s.m[k];
      s.w[k] = l2 ? s.w[k] - lr * dir : s.w[k] * decay - lr * dir;
    }
  }

  // Each hyperparameter group's configuration, each tensor's book; c_ and tc_
  // are those of the tensor being updated (update() and sgd_momentum() read them).
  std::vector<OptimizerConfig> configs_;
  std::vector<TensorBook> book_;  // tensor_book() of every tensor
  OptimizerConfig c_;
  int64_t tc_ = 0;
  std::vector<int64_t> shape_;  // the shape of the tensor being updated (muon's matrix view)
  std::vector<TensorStateF32> tensors_;
  int64_t t_ = 0;
  double last_total_norm_ = 0.0;
};

// The bound for one checked quantity: at most kBoundFactor times the honest float32 error on
// the same inputs, never below kBoundFloor (a few ulps, for results an honest float32 run
// happens to get exactly right).
constexpr double kBoundFactor = 3.0;
constexpr double kBoundFloor = 1e-7;
inline double bound_from_f32(double honest_error) { return std::max(kBoundFloor, kBoundFactor * honest_error); }

// Muon's exact-mode Newton–Schulz against the float64 iteration: the relative Frobenius distance
// of the orthogonalised update X (docs/math.md, "Muon: Newton–Schulz in exact mode": at most
// 0.05 % measured with the diagonal split), as a bound on the part of a weight's error that its
// steps' lr_adj·X add (test_oracle.cc, conformance/runner.cc; measured there up to 6.1e-4 of the
// path, 3.5e-3 without the split).
constexpr double kMuonNsRelError = 1e-3;

}  // namespace oracle
}  // namespace renaissance
