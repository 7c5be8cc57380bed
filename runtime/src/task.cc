// Task: the user-facing executor. Owns the plan, the compiled step and the backend, and keeps
// the scalar regions in sync with the configured hyperparameters.
#include "renaissance/task.h"

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/kinds.h"
#include "renaissance/math/precision.h"
#include "renaissance/math/update_rules.h"
#include "renaissance/scalars.h"
#include "renaissance/sharded_step.h"

namespace renaissance {

Task::Task(std::vector<ParamSpec> params, TaskOptions options)
    : params_(std::move(params)), options_(options) {
  validate_param_specs(params_);
}

Task::~Task() = default;

Task& Task::optimizer(const OptimizerConfig& config) {
  config.validate();
  if (compiled() && hyper_groups() != 1) {
    throw_invalid("optimizer(): the task was compiled with " + std::to_string(hyper_groups()) +
                  " hyperparameter groups; use optimizer_groups() or compile again");
  }
  if (compiled() && (config.kind != this->config().kind || config.weight_decay_mode != this->config().weight_decay_mode)) {
    throw_invalid(std::string("cannot change the optimizer from ") + optimizer_kind_name(this->config().kind) +
                  " to " + optimizer_kind_name(config.kind) + " after compile()");
  }
  // The value of max_grad_norm is a scalar slot; turning clipping on or off changes the graph.
  if (compiled() && (config.max_grad_norm > 0.0) != (this->config().max_grad_norm > 0.0)) {
    throw_invalid("cannot turn gradient-norm clipping on or off after compile(); compile again");
  }
  have_optimizer_ = true;
  groups_.assign(1, config);
  lrs_.assign(1, config.lr);
  if (compiled()) write_hyperparameters();
  return *this;
}

namespace {

// What every group of one task must share (the compiled graph's shape); names the field.
void check_same_structure(const OptimizerConfig& base, const OptimizerConfig& c, size_t h) {
  const std::string where = "hyperparameter group " + std::to_string(h) + ": ";
  if (c.kind != base.kind) {
    throw_invalid(where + "kind " + optimizer_kind_name(c.kind) + " differs from group 0's " +
                  optimizer_kind_name(base.kind) + " (kind, including momentum on/off and nesterov, is task-wide)");
  }
  if (c.weight_decay_mode != base.weight_decay_mode) {
    throw_invalid(where + "weight_decay_mode differs from group 0's (it is task-wide)");
  }
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (!row.task_wide || hyper_value(c, row) == hyper_value(base, row)) continue;
    const std::string why = row.id == Hyperparameter::kMaxGradNorm ? "gradient-norm clipping" : row.name;
    throw_invalid(where + row.name + " " + std::to_string(hyper_value(c, row)) + " differs from group 0's " +
                  std::to_string(hyper_value(base, row)) + " (" + why + " is task-wide)");
  }
}

}  // namespace

Task& Task::optimizer_groups(const std::vector<OptimizerConfig>& configs) {
  if (configs.empty()) throw_invalid("optimizer_groups(): needs at least one configuration");
  if (configs.size() > static_cast<size_t>(INT32_MAX / kNumScalarF64)) throw_invalid("optimizer_groups(): too many groups");
  for (size_t h = 0; h < configs.size(); ++h) {
    configs[h].validate();
    check_same_structure(configs[0], configs[h], h);
  }
  if (compiled()) {
    if (configs.size() != groups_.size()) {
      throw_invalid("optimizer_groups(): the task was compiled with " + std::to_string(groups_.size()) +
                    " hyperparameter groups, got " + std::to_string(configs.size()) + "; compile again");
    }
    check_same_structure(config(), configs[0], 0);
  }
  groups_ = configs;
  lrs_.resize(configs.size());
  for (size_t h = 0; h < configs.size(); ++h) lrs_[h] = configs[h].lr;
  have_optimizer_ = true;
  if (compiled()) write_hyperparameters();
  return *this;
}

namespace {

// One host table of the plan into its arena region (nothing for an empty table).
template <typename T>
void upload_table(Backend* backend, const MemoryPlan& plan, Region region, const std::vector<T>& rows) {
  if (!rows.empty()) backend->upload(plan.region(region).offset, rows.data(), rows.size() * sizeof(T));
}

// The plan's host tables the step reads from the arena: the norm tiles and tensors, the
// hyperparameter items and tensor blocks, and the tensor tables (plan.h: a model copy's and a
// gradient table's lookups).
void upload_plan_tables(const MemoryPlan& plan, Backend* backend) {
  if (plan.config().has(Family::kN)) {
    upload_table(backend, plan, T_NORM_TILES, plan.norm_tiles());
    upload_table(backend, plan, T_NORM_TENSORS, plan.norm_tensors());
  }
  upload_table(backend, plan, T_HYPER_ITEMS, plan.hyper_items());
  upload_table(backend, plan, T_TENSOR_BLOCKS, plan.tensor_blocks());
  upload_table(backend, plan, T_TENSOR_LIST, plan.table_tensors());
  upload_table(backend, plan, T_TENSOR_CHUNKS, plan.table_chunks());
  upload_table(backend, plan, T_MUON_MATRICES, plan.muon_matrices());
}

}  // namespace

void Task::check_group(int group, const char* what) const {
  if (group < 0 || group >= hyper_groups()) {
    throw_invalid(std::string(what) + ": hyperparameter group " + std::to_string(group) + " is out of range (the task has " +
                  std::to_string(hyper_groups()) + ")");
  }
}

const OptimizerConfig& Task::group_config(int group) const {
  check_group(group, "group_config()");
  return groups_[group];
}

double Task::lr(int group) const {
  check_group(group, "lr()");
  return lrs_[group];
}

void Task::set_group_hyper(int group, const OptimizerConfig& config) {
  check_group(group, "set_group_hyper()");
  config.validate();
  check_same_structure(this->config(), config, static_cast<size_t>(group));
  groups_[group] = config;
  lrs_[group] = config.lr;
  if (compiled()) write_group_hyperparameters(group);
}

void Task::compile() {
  if (!have_optimizer_) throw_invalid("compile(): no optimizer configured; call optimizer() first");
  const PrecisionOptions& precision = options_.precision;
  // The only combination these options can break (precision.h): fp32 with stochastic rounding.
  if (!precision_combination_valid(gradient_precision(precision), precision.precision, precision.rounding)) {
    throw_invalid("compile(): stochastic rounding needs a bf16 or fp16 model copy (precision is fp32)");
  }
  // The flag means nothing without a 2-byte model dtype (gradient_precision reads fp32 then).
  if (precision.precision == Precision::kFp32 && precision.model_dtype_gradients) {
    throw_invalid("compile(): model-dtype gradients need a bf16 or fp16 precision (precision is fp32)");
  }
  PlanConfig plan_config = plan_config_from_optimizer(config());
  plan_config.precision = precision.precision;
  plan_config.model_dtype_gradients = precision.model_dtype_gradients;
  plan_config.hyper_groups = hyper_groups();
  plan_config.tensor_mask = options_.tensor_mask;
  plan_config.gradient_table = options_.gradient_table;
  if (options_.gradient_table && options_.state_shard.world_size > 0) {
    throw_invalid("compile(): gradient_table is for single-device tasks; a state shard (sharded step) reduces the "
                  "gradients in the arena's G");
  }
  if (config().amsgrad && options_.state_shard.world_size > 0) {
    throw_invalid("compile(): amsgrad is not supported by the sharded step (its VMAX state is not sharded); use an "
                  "unsharded task");
  }
  if (plan_config.muon && options_.state_shard.world_size > 0) {
    throw_invalid("compile(): muon is not supported by the sharded step yet (its matrices are not partitioned); use "
                  "an unsharded task");
  }
  plan_ = MemoryPlan(params_, plan_config);
  // A rank of a sharded step: the plan again with M and V cut to its slice of this one.
  if (options_.state_shard.world_size > 0) plan_ = MemoryPlan(params_, slice_plan_config(plan_, options_.state_shard));
  step_ = compile_step(plan_, config(), options_.check_finite, precision);
  // tensor_mask: the unmasked program runs until a step may have a masked tensor (task.h).
  unmasked_step_ = options_.tensor_mask ? compile_unmasked_step(plan_, config(), options_.check_finite, precision)
                                        : CompiledStep{};
  alternate_prepared_ = false;
  mask_clear_ = true;
  steps_equal_ = true;
  backend_.reset();
  std::unique_ptr<Backend> backend = create_backend(options_.backend, options_.backend_options);
  backend->allocate_arena(plan_.arena_bytes());
  upload_plan_tables(plan_, backend.get());
  backend_ = std::move(backend);
  if (options_.gradient_table) reset_gradient_table();  // the arena's own G until written
  write_hyperparameters();
  // The clip coefficient is 1 until a clipping step writes it (and stays 1 without clipping).
  write_f32_slot(kClipCoefficient, 1.0f);
  // The momentum's gradient factor is formed by every applied step before its update; 1 until then.
  write_f32_slot(kMomentumGradFactor, 1.0f);
  // A sliced task never runs the whole step (its M/V spans leave the slice): ShardedStep
  // prepares the backend with its sub-steps instead.
  if (!plan_.state_sliced()) backend_->prepare(options_.tensor_mask ? unmasked_step_ : step_);
}

void Task::require_compiled(const char* what) const {
  if (!compiled()) throw_invalid(std::string(what) + ": the task is not compiled; call compile() first");
}

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
// 1 - momentum formed in double, the Nesterov flag as 1.0f / 0.0f.
constexpr int kNumMuonScalarF32 = kNumScalarF32 - kFirstMuonScalarF32;
static void muon_scalar_slots(const OptimizerConfig& config, float* out) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.number != nullptr && row.f32_slot >= kFirstMuonScalarF32) {
      out[row.f32_slot - kFirstMuonScalarF32] = static_cast<float>(config.*row.number);
    }
  }
  out[kMuonOneMinusMomentum - kFirstMuonScalarF32] = static_cast<float>(1.0 - config.momentum);
  out[kNesterov - kFirstMuonScalarF32] = config.nesterov ? 1.0f : 0.0f;
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

size_t Task::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return i;
  }
  throw_invalid("no parameter named '" + name + "'");
}

float* Task::weight(size_t id) {
  require_compiled("weight()");
  return reinterpret_cast<float*>(static_cast<char*>(backend_->arena()) + plan_.tensor_offset(Family::kW, id));
}

float* Task::grad(size_t id) {
  require_compiled("grad()");
  if (grad_dtype() != Precision::kFp32) {
    throw_invalid("grad(): the gradients are held in the model dtype (" + std::string(precision_name(grad_dtype())) +
                  "); use grad_data()");
  }
  return static_cast<float*>(grad_data(id));
}

void* Task::grad_data(size_t id) {
  require_compiled("grad_data()");
  return static_cast<char*>(backend_->arena()) + plan_.tensor_offset(Family::kG, id);
}

Precision Task::grad_dtype() const {
  return gradient_precision(options_.precision);
}

uint16_t Task::round_to_grad_dtype(float value) const {
  return math::f32_to_half_rne(precision_bf16_coded(grad_dtype()), value);
}

void Task::write_grad_encoded(size_t id, const uint16_t* src) {
  require_compiled("write_grad_encoded()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  if (grad_dtype() == Precision::kFp32) throw_invalid("write_grad_encoded(): the gradients are fp32 (use write)");
  const uint64_t count = static_cast<uint64_t>(plan_.tensor(id).numel);
  if (count != 0) backend_->upload(plan_.tensor_offset(Family::kG, id), src, count * sizeof(uint16_t));
}

void Task::read_grad_encoded(size_t id, uint16_t* dst) {
  require_compiled("read_grad_encoded()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  if (grad_dtype() == Precision::kFp32) throw_invalid("read_grad_encoded(): the gradients are fp32 (use read)");
  const uint64_t count = static_cast<uint64_t>(plan_.tensor(id).numel);
  if (count != 0) backend_->download(plan_.tensor_offset(Family::kG, id), dst, count * sizeof(uint16_t));
}

void Task::write(Family family, size_t id, const float* src) {
  require_compiled("write()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  const uint64_t count = family_info(family).extent == FamilyExtent::kPerTensor ? 1 : static_cast<uint64_t>(plan_.tensor(id).numel);
  if (count == 0) return;
  if (family_info(family).optimizer_state) {
    return write_state_part(family, id, 0, count, src);
  }
  if (family == Family::kG && grad_dtype() != Precision::kFp32) {
    // Model-dtype gradients: each float rounded to nearest even in the model dtype.
    std::vector<uint16_t> h(count);
    for (uint64_t i = 0; i < count; ++i) h[i] = round_to_grad_dtype(src[i]);
    return write_grad_encoded(id, h.data());
  }
  backend_->upload(plan_.tensor_offset(family, id), src, count * sizeof(float));
  if (family == Family::kW) refresh_model_copy(id);
}

// The copy of freshly written masters: rounded to nearest even on the host (math/precision.h).
void Task::refresh_model_copy(size_t id) {
  if (!plan_.has_model_copy()) return;
  const size_t n = static_cast<size_t>(plan_.tensor(id).numel);
  std::vector<float> w(n);
  std::vector<uint16_t> c(n);
  read(Family::kW, id, w.data());
  const bool bf16 = precision_bf16_coded(options_.precision.precision);
  for (size_t i = 0; i < n; ++i) c[i] = math::f32_to_half_rne(bf16, w[i]);
  if (n != 0) backend_->upload(plan_.model_copy_offset(id), c.data(), n * sizeof(uint16_t));
}

void Task::read_model_copy(size_t id, uint16_t* dst) {
  require_compiled("read_model_copy()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  if (!plan_.has_model_copy()) throw_invalid("read_model_copy(): the task has no model copy (precision fp32)");
  const uint64_t count = static_cast<uint64_t>(plan_.tensor(id).numel);
  if (count != 0) backend_->download(plan_.model_copy_offset(id), dst, count * sizeof(uint16_t));
}

void Task::read(Family family, size_t id, float* dst) {
  require_compiled("read()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  const uint64_t count = family_info(family).extent == FamilyExtent::kPerTensor ? 1 : static_cast<uint64_t>(plan_.tensor(id).numel);
  if (count == 0) return;
  if (family_info(family).optimizer_state &&
      !plan_.holds_state(plan_.tensor(id).offset_in_family, count)) {
    throw_invalid(std::string("read(") + family_name(family) + ", '" + params_[id].name + "'): the tensor lies outside "
                  "the slice [" + std::to_string(plan_.state_begin()) + ", " + std::to_string(plan_.state_end()) +
                  ") of the optimizer state this rank holds; ShardedStep::read_state gathers it");
  }
  if (family == Family::kG && grad_dtype() != Precision::kFp32) {
    // Model-dtype gradients widen exactly (math/precision.h).
    std::vector<uint16_t> h(count);
    read_grad_encoded(id, h.data());
    const bool bf16 = precision_bf16_coded(grad_dtype());
    for (uint64_t i = 0; i < count; ++i) dst[i] = math::half_to_f32(bf16, h[i]);
    return;
  }
  backend_->download(plan_.tensor_offset(family, id), dst, count * sizeof(float));
}

// Fills every tensor of `family` with math::synthetic_gradient(seed, step, id, i, amplitude) on
// the backend (no host copy); padding stays zero.
void Task::synthesize(Family family, uint64_t seed, uint64_t step, float amplitude) {
  std::vector<GradientTarget> targets;
  targets.reserve(params_.size());
  for (size_t id = 0; id < params_.size(); ++id) {
    const uint64_t count = static_cast<uint64_t>(plan_.tensor(id).numel);
    if (count > 0) {
      targets.push_back({plan_.tensor_offset(family, id), count, id,
                         family == Family::kG ? grad_dtype() : Precision::kFp32});
    }
  }
  backend_->fill_synthetic_gradients(targets, seed, step, amplitude);
  if (family == Family::kW) {
    for (size_t id = 0; id < params_.size(); ++id) refresh_model_copy(id);
  }
}

void Task::synthesize_gradients(uint64_t seed, uint64_t step, float amplitude) {
  require_compiled("synthesize_gradients()");
  synthesize(Family::kG, seed, step, amplitude);
}

void Task::synthesize_weights(uint64_t seed, uint64_t step, float amplitude) {
  require_compiled("synthesize_weights()");
  // The gradient generator aimed at W: the same counter-based values, produced on the backend.
  synthesize(Family::kW, seed, step, amplitude);
}

void Task::poison_gradient(size_t id, uint64_t index, float value) {
  require_compiled("poison_gradient()");
  const uint64_t numel = static_cast<uint64_t>(param(id).numel());
  if (index >= numel) {
    throw_invalid("poison_gradient(): index " + std::to_string(index) + " is outside parameter '" + param(id).name +
                  "' (" + std::to_string(numel) + " elements)");
  }
  if (grad_dtype() != Precision::kFp32) {
    const uint16_t h = round_to_grad_dtype(value);
    return backend_->upload(plan_.tensor_offset(Family::kG, id) + index * sizeof(uint16_t), &h, sizeof(h));
  }
  backend_->upload(plan_.tensor_offset(Family::kG, id) + index * sizeof(float), &value, sizeof(value));
}

void Task::step() {
  require_whole_state("step()");
  backend_->execute(program_for_step());
}

const CompiledStep& Task::step_program() const {
  return options_.tensor_mask && !masked_program_next() ? unmasked_step_ : step_;
}

const CompiledStep& Task::program_for_step() {
  if (!masked_program_next()) return step_program();
  if (!alternate_prepared_) {
    backend_->prepare_alternate(step_);
    alternate_prepared_ = true;
  }
  // A masked tensor's count stays behind (the device decides, the host cannot tell without a sync).
  steps_equal_ = false;
  return step_;
}

bool Task::masked_program_next() const { return options_.tensor_mask && compiled() && !(mask_clear_ && steps_equal_); }

void Task::set_launch_stream(void* stream) {
  require_compiled("set_launch_stream()");
  backend_->set_launch_stream(stream);
}

std::vector<double> Task::timed_steps(int count) {
  require_whole_state("timed_steps()");
  if (count < 0) throw_invalid("timed_steps: count must be >= 0, got " + std::to_string(count));
  return backend_->timed_steps(program_for_step(), count);
}

int64_t Task::step_count() { return read_i32_slot(kStep); }

void Task::set_step_count(int64_t t) {
  require_compiled("set_step_count()");
  if (t < 0 || t > INT32_MAX) throw_invalid("set_step_count(" + std::to_string(t) + "): must be in [0, 2^31)");
  const int32_t t32 = static_cast<int32_t>(t);
  backend_->upload(plan_.region(S_SCALAR_INT32).offset + kStep * sizeof(int32_t), &t32, sizeof(t32));
  // The corrections a run has after t applied steps: math::advance_step's values for t (the
  // next step recomputes them for t + 1 anyway), and the compiled arena's zeros for t = 0.
  if (options_.tensor_mask) {
    set_tensor_steps(std::vector<int64_t>(params_.size(), t));
    return;
  }
  for (int h = 0; h < hyper_groups(); ++h) write_bias_corrections(h, group_config(h), t32);
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

void Task::require_mask(const char* what) const {
  require_compiled(what);
  if (!options_.tensor_mask) throw_invalid(std::string(what) + ": the task was built without TaskOptions::tensor_mask");
}

int32_t* Task::tensor_mask() {
  require_mask("tensor_mask()");
  mask_clear_ = false;  // the caller may write anything through it (tensor_mask_written says what)
  return reinterpret_cast<int32_t*>(static_cast<char*>(backend_->arena()) + plan_.region(S_TENSOR_INT32).offset);
}

void Task::set_tensor_mask(const std::vector<int32_t>& mask) {
  require_mask("set_tensor_mask()");
  if (mask.size() != params_.size()) {
    throw_invalid("set_tensor_mask(): " + std::to_string(mask.size()) + " entries for " + std::to_string(params_.size()) + " parameters");
  }
  if (!mask.empty()) backend_->upload(plan_.region(S_TENSOR_INT32).offset, mask.data(), mask.size() * sizeof(int32_t));
  mask_clear_ = std::all_of(mask.begin(), mask.end(), [](int32_t m) { return m == 0; });
}

void Task::tensor_mask_written(bool any_set) {
  require_mask("tensor_mask_written()");
  mask_clear_ = !any_set;
}

std::vector<int64_t> Task::tensor_steps() {
  require_mask("tensor_steps()");
  std::vector<int32_t> steps(params_.size());
  if (!steps.empty()) {
    backend_->download(plan_.region(S_TENSOR_INT32).offset + params_.size() * sizeof(int32_t), steps.data(),
                       steps.size() * sizeof(int32_t));
  }
  return std::vector<int64_t>(steps.begin(), steps.end());
}

void Task::set_tensor_steps(const std::vector<int64_t>& steps) {
  require_mask("set_tensor_steps()");
  if (steps.size() != params_.size()) {
    throw_invalid("set_tensor_steps(): " + std::to_string(steps.size()) + " entries for " + std::to_string(params_.size()) + " parameters");
  }
  std::vector<int32_t> t32(steps.size());
  for (size_t id = 0; id < steps.size(); ++id) {
    if (steps[id] < 0 || steps[id] > INT32_MAX) throw_invalid("set_tensor_steps(): step " + std::to_string(steps[id]) + " must be in [0, 2^31)");
    t32[id] = static_cast<int32_t>(steps[id]);
  }
  if (t32.empty()) return;
  backend_->upload(plan_.region(S_TENSOR_INT32).offset + t32.size() * sizeof(int32_t), t32.data(), t32.size() * sizeof(int32_t));
  for (size_t id = 0; id < t32.size(); ++id) write_bias_corrections(plan_.block_of(id), group_config(params_[id].hyper_group), t32[id]);
  const int64_t t = step_count();
  steps_equal_ = std::all_of(t32.begin(), t32.end(), [t](int32_t s) { return s == t; });
}
int64_t Task::skipped_steps() { return read_i32_slot(kSkippedSteps); }

void Task::count_skipped_step() {
  const int32_t skipped = read_i32_slot(kSkippedSteps);
  if (skipped == INT32_MAX) throw_invalid("count_skipped_step(): 2^31 - 1 skipped steps already counted");
  const int32_t next = skipped + 1;
  backend_->upload(plan_.region(S_SCALAR_INT32).offset + kSkippedSteps * sizeof(int32_t), &next, sizeof(next));
}
bool Task::last_step_skipped() { return read_i32_slot(kHasNonFinite) != 0; }

double Task::last_grad_norm() {
  require_compiled("last_grad_norm()");
  double value = 0.0;
  backend_->download(plan_.region(S_SCALAR_FP64).offset + kGradNormD * sizeof(double), &value, sizeof(value));
  return value;
}

Backend& Task::backend() {
  require_compiled("backend()");
  return *backend_;
}

std::string Task::fingerprint() {
  std::vector<size_t> ids(params_.size());
  for (size_t id = 0; id < ids.size(); ++id) ids[id] = id;
  return fingerprint(ids);
}

std::string Task::fingerprint(const std::vector<size_t>& ids) {
  require_compiled("fingerprint()");
  for (size_t id : ids) {
    if (id >= params_.size()) throw_invalid("fingerprint(): parameter id " + std::to_string(id) + " is out of range");
  }
  require_whole_state("fingerprint()");
  return hash_state(ids, [this](Family family, size_t id, uint64_t first, uint64_t count, float* dst) {
    backend_->download(plan_.tensor_offset(family, id) + first * sizeof(float), dst, count * sizeof(float));
  });
}

// The bytes every fingerprint hashes, in its order (the step_state families in kFamilyTable's
// order, W, M, V, VMAX, each tensor by tensor in `ids` order; the model copy; the step count), in
// pieces: the streaming hash does not depend on how the bytes are split, and a gathered read
// holds one piece at a time.
std::string Task::hash_state(const std::vector<size_t>& ids, const StateReader& read_mv) {
  const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> holder(XXH3_createState(), &XXH3_freeState);
  XXH3_state_t* state = holder.get();
  XXH3_64bits_reset(state);
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  std::vector<float> buffer;
  for (Family family : kFamiliesInOrder) {
    if (!family_info(family).step_state || !plan_.has_family(family)) continue;
    for (size_t id : ids) {
      const uint64_t numel = static_cast<uint64_t>(plan_.tensor(id).numel);
      for (uint64_t first = 0; first < numel; first += kPiece) {
        const uint64_t n = std::min(kPiece, numel - first);
        buffer.resize(static_cast<size_t>(n));
        if (!family_info(family).optimizer_state) {
          backend_->download(plan_.tensor_offset(family, id) + first * sizeof(float), buffer.data(), n * sizeof(float));
        } else {
          read_mv(family, id, first, n, buffer.data());
        }
        XXH3_64bits_update(state, buffer.data(), n * sizeof(float));
      }
    }
  }
  // The model copy, when there is one (fp32 fingerprints are unchanged by its existence).
  if (plan_.has_model_copy()) {
    std::vector<uint16_t> copy;
    for (size_t id : ids) {
      copy.resize(static_cast<size_t>(plan_.tensor(id).numel));
      read_model_copy(id, copy.data());
      XXH3_64bits_update(state, copy.data(), copy.size() * sizeof(uint16_t));
    }
  }
  const int64_t t = step_count();
  XXH3_64bits_update(state, &t, sizeof(t));
  // tensor_mask: each tensor's count is state too, but only where it says more than t: counts that
  // all equal t add no bytes, so such a task prints what the same run without the mask prints
  // (and a replay case recorded through renaissance.torch still matches). Else the counts of
  // `ids` in that order, as int64.
  if (options_.tensor_mask && !ids.empty()) {
    const std::vector<int64_t> all = tensor_steps();
    if (std::any_of(ids.begin(), ids.end(), [&](size_t id) { return all[id] != t; })) {
      for (size_t id : ids) XXH3_64bits_update(state, &all[id], sizeof(all[id]));
    }
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  char text[17];
  std::snprintf(text, sizeof(text), "%016" PRIx64, hash);
  return text;
}

}  // namespace renaissance
