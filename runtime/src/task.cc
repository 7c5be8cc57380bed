// Task: the user-facing executor. Owns the plan, the compiled step and the backend. This file:
// the optimizer configuration and its groups (validation), compile(), running the step, the step
// count and the tensor mask. The scalar slots are in task_scalars.cc, the state access in
// task_state_access.cc, the fingerprint in task_fingerprint.cc.
#include "renaissance/task.h"

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

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
  // What the compiled step holds (amsgrad's family, Muon's planned lr factors and mode), by name.
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (compiled() && row.fixed_after_compile && hyper_value(config, row) != hyper_value(this->config(), row)) {
      throw_invalid(std::string("cannot change ") + row.name + " after compile(); compile again");
    }
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

}  // namespace renaissance
