// Task's scalar blocks (scalars.h): the host-owned slots of each hyperparameter group formed from
// its configuration (lr, loss scale, dampening, Muon's and its auxiliary AdamW's slots, the bias
// corrections after a set step count) and written to the backend.
#include "renaissance/task.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/kinds.h"
#include "renaissance/math/update_rules.h"
#include "renaissance/scalars.h"

namespace renaissance {

// kInvLossScale of a group's block: 1/scale formed in double and rounded to float once, negated
// for a maximizing group. IEEE multiplication commutes exactly with negation, so every read of
// G through this slot (math::unscale) gives the bits of the minimizing step on -G; the norms
// square ĝ and the non-finite check reads G itself, so neither sees the sign.
static float inv_loss_scale_slot(const OptimizerConfig& config, double loss_scale) {
  const float inv = static_cast<float>(1.0 / loss_scale);
  return config.maximize ? -inv : inv;
}

// The host-owned slots of one scalar block (scalars.h) from a group's configuration: fp32 slots
// [0, kBiasCorrection1) and fp64 slots [0, kGradNormD). Derived scalars are formed in double from
// the configured values and rounded once. Every writer of a block goes through here; the bias
// corrections and the last total norm are the device's and are not written.
static void host_scalar_slots(const OptimizerConfig& config, double lr, double loss_scale, float* f32,
                              double* f64) {
  // The table's slots: each number as configured (fp64) and rounded once (fp32).
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.number == nullptr) continue;
    // Muon's slots lie after the device's: late_scalar_slots writes them.
    if (row.f32_slot >= 0 && row.f32_slot < kFirstMuonScalarF32) f32[row.f32_slot] = static_cast<float>(config.*row.number);
    if (row.f64_slot >= 0) f64[row.f64_slot] = config.*row.number;
  }
  // The derived slots, formed in double from the configured values and rounded once.
  f32[kLr] = static_cast<float>(lr);  // the task's current lr (set_lr, schedules)
  f32[kDecayFactor] = static_cast<float>(1.0 - lr * config.weight_decay);
  f32[kOneMinusBeta1] = static_cast<float>(1.0 - config.beta1);
  f32[kOneMinusBeta2] = static_cast<float>(1.0 - config.beta2);
  f32[kInvLossScale] = inv_loss_scale_slot(config, loss_scale);
}
static_assert(kInvLossScale + 1 == kBiasCorrection1, "the host-owned fp32 slots come first");

// kOneMinusDampening, the one host-owned fp32 slot after the device's (scalars.h: not stored in
// checkpoints): 1 - dampening formed in double and rounded to float once (1.0f without dampening).
static float one_minus_dampening_slot(const OptimizerConfig& config) {
  return static_cast<float>(1.0 - config.dampening);
}

// Muon's host-owned fp32 slots, kFirstMuonScalarF32 to the end of a block (scalars.h: not stored
// in checkpoints), from a group's configuration: the table's rows as configured rounded once,
// 1 - momentum and 1 - aux_lr*aux_weight_decay formed in double, the Nesterov flag as 1.0f / 0.0f.
constexpr int kNumMuonScalarF32 = kNumScalarF32 - kFirstMuonScalarF32;
static void muon_scalar_slots(const OptimizerConfig& config, float* out) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.number != nullptr && row.f32_slot >= kFirstMuonScalarF32) {
      out[row.f32_slot - kFirstMuonScalarF32] = static_cast<float>(config.*row.number);
    }
  }
  out[kMuonOneMinusMomentum - kFirstMuonScalarF32] = static_cast<float>(1.0 - config.momentum);
  out[kNesterov - kFirstMuonScalarF32] = config.nesterov ? 1.0f : 0.0f;
  out[kAuxDecayFactor - kFirstMuonScalarF32] = static_cast<float>(1.0 - config.aux_lr * config.aux_weight_decay);
}
static_assert(kFirstMuonScalarF32 > kMomentumGradFactor, "Muon's slots come after the device's");
static_assert(kGradNormD == kMaxGradNormD + 1 && kNumScalarF64 == kGradNormD + 1, "kGradNormD is the last slot");
static_assert(kLr == 0 && kWeightDecay == 1 && kDecayFactor == 2, "the lr writers copy slots 0..2");

void Task::write_hyperparameters() {
  if (plan_.config().tensor_mask) return write_all_hyperparameters();
  for (int h = 0; h < hyper_groups(); ++h) write_group_hyperparameters(h);
}

// tensor_mask: the host-owned slots of every block (one per tensor) from its group, in two copies
// (fp32 slots before the bias corrections; fp64 slots before kGradNormD) whatever the number of
// tensors: Backend::upload_rows. The values are exactly write_group_hyperparameters'.
void Task::write_all_hyperparameters() {
  const size_t n = plan_.num_params();
  std::vector<float> f32(n * kBiasCorrection1);
  std::vector<double> f64(n * kGradNormD);
  for (size_t id = 0; id < n; ++id) {
    const int group = params_[id].hyper_group;
    const OptimizerConfig& config = group_config(group);
    host_scalar_slots(config, this->lr(group), loss_scale_, f32.data() + id * kBiasCorrection1,
                      f64.data() + id * kGradNormD);
  }
  backend_->upload_rows(plan_.region(S_SCALAR_FP32).offset, kNumScalarF32 * sizeof(float), f32.data(),
                        kBiasCorrection1 * sizeof(float), n);
  backend_->upload_rows(plan_.region(S_SCALAR_FP64).offset, kNumScalarF64 * sizeof(double), f64.data(),
                        kGradNormD * sizeof(double), n);
  std::vector<float> dampening(n);
  for (size_t id = 0; id < n; ++id) dampening[id] = one_minus_dampening_slot(group_config(params_[id].hyper_group));
  backend_->upload_rows(plan_.region(S_SCALAR_FP32).offset + kOneMinusDampening * sizeof(float),
                        kNumScalarF32 * sizeof(float), dampening.data(), sizeof(float), n);
  std::vector<float> muon(n * kNumMuonScalarF32);
  for (size_t id = 0; id < n; ++id) {
    muon_scalar_slots(group_config(params_[id].hyper_group), muon.data() + id * kNumMuonScalarF32);
  }
  backend_->upload_rows(plan_.region(S_SCALAR_FP32).offset + kFirstMuonScalarF32 * sizeof(float),
                        kNumScalarF32 * sizeof(float), muon.data(), kNumMuonScalarF32 * sizeof(float), n);
}

void Task::set_group_lrs(const std::vector<double>& lrs) {
  if (lrs.size() != groups_.size()) {
    throw_invalid("set_group_lrs(): " + std::to_string(lrs.size()) + " learning rates for " + std::to_string(groups_.size()) + " groups");
  }
  for (double lr : lrs) check_lr(lr);
  lrs_ = lrs;
  if (!compiled()) return;
  // Slots 0..2 (lr, wd, 1 - lr*wd) of every block in one copy.
  const bool mask = plan_.config().tensor_mask;
  const size_t blocks = static_cast<size_t>(plan_.scalar_blocks());
  std::vector<float> rows(blocks * 3);
  for (size_t b = 0; b < blocks; ++b) {
    const int group = mask ? (b < params_.size() ? params_[b].hyper_group : 0) : static_cast<int>(b);
    float f32[kBiasCorrection1];
    double f64[kGradNormD];
    host_scalar_slots(group_config(group), this->lr(group), loss_scale_, f32, f64);
    std::copy_n(f32, 3, rows.data() + b * 3);
  }
  backend_->upload_rows(plan_.region(S_SCALAR_FP32).offset, kNumScalarF32 * sizeof(float), rows.data(),
                        3 * sizeof(float), blocks);
}

// Block h of the scalar regions (scalars.h) from group h's configuration.
void Task::write_group_hyperparameters(int group) {
  if (plan_.config().tensor_mask) return write_all_hyperparameters();
  const OptimizerConfig& config = group_config(group);
  float f32[kBiasCorrection1];
  double f64[kGradNormD];
  host_scalar_slots(config, this->lr(group), loss_scale_, f32, f64);
  for (int b : blocks_of_group(group)) {
    backend_->upload(plan_.region(S_SCALAR_FP32).offset + b * kNumScalarF32 * sizeof(float), f32,
                     kBiasCorrection1 * sizeof(float));
    backend_->upload(plan_.region(S_SCALAR_FP64).offset + b * kNumScalarF64 * sizeof(double), f64,
                     kGradNormD * sizeof(double));
    const float dampening = one_minus_dampening_slot(config);
    backend_->upload(plan_.region(S_SCALAR_FP32).offset + (b * kNumScalarF32 + kOneMinusDampening) * sizeof(float),
                     &dampening, sizeof(float));
    float muon[kNumMuonScalarF32];
    muon_scalar_slots(config, muon);
    backend_->upload(plan_.region(S_SCALAR_FP32).offset + (b * kNumScalarF32 + kFirstMuonScalarF32) * sizeof(float),
                     muon, sizeof(muon));
  }
}

std::vector<int> Task::blocks_of_group(int group) const {
  if (!plan_.config().tensor_mask) return {group};
  std::vector<int> blocks;
  for (size_t id = 0; id < params_.size(); ++id) {
    if (params_[id].hyper_group == group) blocks.push_back(plan_.block_of(id));
  }
  return blocks;
}

// A task-wide float slot: the same value in every group's block (scalars.h).
void Task::write_f32_slot(int slot, float value) {
  for (int h = 0; h < plan_.scalar_blocks(); ++h) {
    backend_->upload(plan_.region(S_SCALAR_FP32).offset + (h * kNumScalarF32 + slot) * sizeof(float), &value,
                     sizeof(float));
  }
}

int32_t Task::read_i32_slot(int slot) {
  require_compiled("reading the step state");
  int32_t value = 0;
  backend_->download(plan_.region(S_SCALAR_INT32).offset + slot * sizeof(int32_t), &value, sizeof(value));
  return value;
}

void Task::set_lr(double lr) {
  check_lr(lr);
  set_group_lrs(std::vector<double>(groups_.size(), lr));
}

void Task::set_lr(int group, double lr) {
  check_group(group, "set_lr()");
  check_lr(lr);
  lrs_[group] = lr;
  if (compiled()) write_group_lr(group);
}

void Task::write_group_lr(int group) {
  if (plan_.config().tensor_mask) {  // every block in one copy
    return set_group_lrs(std::vector<double>(lrs_));
  }
  // lr, wd and 1 - lr*wd are slots 0..2: one small copy.
  float f32[kBiasCorrection1];
  double f64[kGradNormD];
  host_scalar_slots(group_config(group), this->lr(group), loss_scale_, f32, f64);
  for (int b : blocks_of_group(group)) {
    backend_->upload(plan_.region(S_SCALAR_FP32).offset + b * kNumScalarF32 * sizeof(float), f32, 3 * sizeof(float));
  }
}

void Task::set_loss_scale(double scale) {
  check_loss_scale(scale);
  loss_scale_ = scale;
  if (!compiled()) return;
  // Every block with its group's sign (a block per group, or with tensor_mask per tensor).
  const bool mask = plan_.config().tensor_mask;
  for (int b = 0; b < plan_.scalar_blocks(); ++b) {
    const size_t at = static_cast<size_t>(b);
    const int group = mask ? (at < params_.size() ? params_[at].hyper_group : 0) : b;
    const float value = inv_loss_scale_slot(group_config(group), scale);
    backend_->upload(plan_.region(S_SCALAR_FP32).offset + (at * kNumScalarF32 + kInvLossScale) * sizeof(float), &value,
                     sizeof(float));
  }
}

// Block b's corrections after t applied steps: math::advance_step's values for t (the next step
// recomputes them for t + 1 anyway), and the compiled arena's zeros for t = 0.
void Task::write_bias_corrections(int block, const OptimizerConfig& c, int32_t t) {
  if (!kind_info(config().kind).bias_correction) return;
  static_assert(kBiasCorrection2 == kBiasCorrection1 + 1, "the two corrections are adjacent");
  const float bc[2] = {t == 0 ? 0.0f : math::bias_correction(c.beta1, t),
                       t == 0 ? 0.0f : math::bias_correction(c.beta2, t)};
  backend_->upload(plan_.region(S_SCALAR_FP32).offset + (block * kNumScalarF32 + kBiasCorrection1) * sizeof(float),
                   bc, sizeof(bc));
}

}  // namespace renaissance
