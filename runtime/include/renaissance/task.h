// Task: the user API. Declare parameters, choose an optimizer, compile, then per step write
// gradients and call step(). Weights and state live in the backend's arena.
//
//   renaissance::Task task(params, {renaissance::BackendKind::kAuto});
//   task.optimizer(renaissance::AdamW().lr(1e-3).weight_decay(0.01));
//   task.compile();
//   float* w = task.weight(0);  // backend memory: host on CPU, device on CUDA
//   task.set_grad(0, host_grad); task.step();
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "renaissance/backend.h"
#include "renaissance/graph.h"
#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "renaissance/plan.h"
#include "renaissance/shard_layout.h"

namespace renaissance {

struct TaskOptions {
  BackendKind backend = BackendKind::kAuto;
  BackendOptions backend_options;
  // Skip the whole step when any gradient is NaN or ±Inf (reads G once more: 4 bytes/param).
  bool check_finite = true;
  // bf16/fp16: keep a model copy of the weights besides the fp32 masters, written by every
  // applied step (docs/math.md, "Mixed precision"); fp32 (default): no copy.
  PrecisionOptions precision;
  // Per-tensor mask (torch's `.grad is None`): an int32 per parameter that the caller
  // writes before a step (tensor_mask() / set_tensor_mask()) and the compiled step reads on the
  // device. A masked (nonzero) tensor's W, M, V and model copy are left bit for bit as they were,
  // its gradient is not looked at by the non-finite check, and its step count does not advance.
  // Each tensor keeps its own applied-step count t_i (tensor_steps()): Adam-family bias
  // corrections and the stochastic-rounding key use t_i; step_count() stays the task-wide count
  // of applied steps. Not yet with gradient-norm clipping or a state shard (Error); fp32 or model-dtype G. Off
  // (default): nothing changes (layout, bits, speed).
  bool tensor_mask = false;
  // Keep only this rank's slice of M and V (above); default: the whole state.
  StateShard state_shard;
  // Gradient table (step() reads autograd's own gradient tensors): a uint64 per
  // parameter in the arena's scalar area (gradient_table() / set_gradient_table()) holding the
  // address of that parameter's gradient, numel contiguous elements in G's encoding (fp32, or
  // bf16/fp16 with model_dtype_gradients), in the backend's memory (host on the CPU, device on
  // CUDA). Every op that reads G (check, norms, updates) reads it through the table on the device
  // at run time (CUDA: inside the captured graph; changing an entry needs no re-capture and no
  // host sync). compile() fills it with the arena's own G addresses, so a task that never writes
  // it steps exactly as without the flag; the results are bit for bit those of the same bytes in
  // G. Refused with a state shard (a sharded step reduces gradients in G). Off: nothing changes.
  bool gradient_table = false;
};

// Reads elements [first, first + count) of tensor `id` of family M or V into dst, from wherever
// they live (ShardedStep::read_state gathers them from their ranks: a collective call).
using StateReader = std::function<void(Family family, size_t id, uint64_t first, uint64_t count, float* dst)>;

// What a caller's run stores with a checkpoint besides the optimizer state, so that a resume can
// reproduce the run exactly: the library keeps the values, the caller gives them
// meaning (the CLI: its lr schedule, the schedule's horizon and warm-up, the synthetic seed).
struct RunSettings {
  std::string schedule = "constant";
  int64_t schedule_steps = 0;
  int64_t warmup = 0;
  uint64_t seed = 0;
};

// The configuration a checkpoint holds (its header and META section), decoded and validated
// without a task, so that a resume can build its task from it.
struct CheckpointInfo {
  uint32_t version = 0;
  OptimizerConfig config;
  double lr = 0.0;  // the lr of the last step taken
  double loss_scale = 1.0;
  bool check_finite = true;
  int64_t step = 0;     // applied steps
  int64_t skipped = 0;  // skipped steps
  RunSettings run;
  PrecisionOptions precision;  // the model copy's dtype, rounding and seed (fp32: version 2, none)
};
// Throws Error (kIo, kFormat) naming the path and what is wrong.
CheckpointInfo read_checkpoint_info(const std::string& path);

class Task {
 public:
  explicit Task(std::vector<ParamSpec> params, TaskOptions options = {});
  ~Task();
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;

  Task& optimizer(const OptimizerConfig& config);
  // Any fluent builder (SGD(), Adam(), AdamW(), LARS(), Lion(), LAMB()).
  template <class Builder, class = decltype(std::declval<const Builder&>().config())>
  Task& optimizer(const Builder& b) { return optimizer(b.config()); }

  // H hyperparameter groups in one task (one graph, launches independent of H): configs[h] is
  // the configuration of the parameters whose ParamSpec::hyper_group is h. The groups may differ
  // only in the hyperparameter table's rows that are not task-wide (hyperparameters.h: lr,
  // weight_decay, momentum, betas, eps, trust_coefficient and maximize):
  // kind (which encodes momentum on/off and nesterov), weight_decay_mode and max_grad_norm are
  // task-wide and must agree, else Error(kInvalidArgument) naming the group and the field. The
  // loss scale, check_finite and the step counter are task-wide too. After compile() only H
  // configs with the compiled kind are accepted (no re-capture). optimizer(config) is H = 1.
  Task& optimizer_groups(const std::vector<OptimizerConfig>& configs);
  int hyper_groups() const { return static_cast<int>(groups_.size()); }
  const OptimizerConfig& group_config(int group) const;  // its lr is the configured one
  // Sets group h's scalars (same kind, mode and clipping as the task); takes effect at the next
  // step without re-capture.
  void set_group_hyper(int group, const OptimizerConfig& config);

  // Plans the arena, builds the step graphs and hands them to the backend. Weights, gradients
  // and state start at zero.
  void compile();
  bool compiled() const { return backend_ != nullptr; }

  size_t num_params() const { return params_.size(); }
  const ParamSpec& param(size_t id) const { return params_.at(id); }
  // The id of the parameter called `name`; throws when there is none.
  size_t find(const std::string& name) const;

  // Pointers into the backend's memory (host for CPU, device for CUDA). grad() throws when the
  // gradients are in the model dtype; grad_data() points at G whatever its dtype (grad_dtype()).
  float* weight(size_t id);
  float* grad(size_t id);
  void* grad_data(size_t id);
  // The encoding of G: kFp32, or the model dtype with PrecisionOptions::model_dtype_gradients.
  Precision grad_dtype() const;
  // Model-dtype gradients only (else Error(kInvalidArgument)): numel encodings of parameter id's
  // gradient in or out, bit for bit, one per uint16_t (a 1-byte encoding in the low byte).
  void write_grad_encoded(size_t id, const uint16_t* src);
  void read_grad_encoded(size_t id, uint16_t* dst);
  // Host copies of one tensor (numel floats) in or out of any allocated family. With model-dtype
  // gradients, write(kG) rounds each float to nearest even in the model dtype and read(kG)
  // widens exactly.
  void write(Family family, size_t id, const float* src);
  void read(Family family, size_t id, float* dst);
  void set_weight(size_t id, const float* src) { write(Family::kW, id, src); }
  void set_grad(size_t id, const float* src) { write(Family::kG, id, src); }
  void get_weight(size_t id, float* dst) { read(Family::kW, id, dst); }
  // The model copy of parameter id (numel encodings, one per uint16_t as above); throws without one.
  // Writing masters with write()/set_weight()/synthesize_weights() sets their copy to the masters
  // rounded to nearest even; a write through weight() leaves the copy as it was.
  void read_model_copy(size_t id, uint16_t* dst);

  // Fills every G tensor with math::synthetic_gradient(seed, step, id, i, amplitude), on the
  // backend (no host copy); with model-dtype gradients each value rounded to nearest even in the
  // model dtype (the same bits on every backend). Padding stays zero.
  void synthesize_gradients(uint64_t seed, uint64_t step, float amplitude);
  // The same generator into every W tensor (synthetic initial weights), on the backend.
  void synthesize_weights(uint64_t seed, uint64_t step, float amplitude);
  // Sets element `index` of parameter id's gradient (a NaN there makes the non-finite check skip
  // the step; with model-dtype gradients `value` is rounded to nearest even, so 1e6 is fp16 inf);
  // throws when the index is outside the tensor.
  void poison_gradient(size_t id, uint64_t index, float value);

  void set_lr(double lr);             // every hyperparameter group
  void set_lr(int group, double lr);  // one group
  // Every group's lr (lrs[h] for group h) in ONE host-to-device copy whatever H (and, with
  // tensor_mask, whatever the number of tensors): what an lr schedule over many groups calls.
  void set_group_lrs(const std::vector<double>& lrs);
  void set_loss_scale(double scale);
  double lr() const { return lrs_[0]; }  // group 0's
  double lr(int group) const;
  double loss_scale() const { return loss_scale_; }

  void step();
  // Orders each later step() with a caller's CUDA stream (Backend::set_launch_stream); a no-op
  // on the CPU. Holds for the compiled backend: compile() again forgets it.
  void set_launch_stream(void* stream);
  // Runs `count` steps and returns each one's time in ms (CUDA: events; CPU: steady clock).
  std::vector<double> timed_steps(int count);
  int64_t step_count();          // applied steps
  // Sets the applied-step count to t (0 <= t < 2^31) as if t steps had been applied: the step
  // slot and, for the kinds with bias corrections, 1/(1-beta^t) as the device computes them.
  // With set_weight and write(kM/kV) this resumes a run from its state (replay `initial_step`).
  void set_step_count(int64_t t);
  // tensor_mask only (else Error): the device's mask array (num_params int32, host memory on the
  // CPU, device memory on CUDA; 0 = update, nonzero = skip), a host copy into it, and each
  // tensor's applied-step count (set_tensor_steps sets counts and bias corrections, like
  // set_step_count does per tensor). The mask persists across steps until written again.
  //
  // While the task knows that no entry of the mask is set and every tensor's count equals the
  // task's, step() runs the unmasked program (compile_unmasked_step: the speed and the bits of a
  // task without the mask); the first step with a mask that may be set runs the masked program
  // (CUDA: a second graph, captured then) and the task stays there until the counts are known to
  // be equal again (set_step_count, set_tensor_steps or load make them so) with the mask known
  // clear. set_tensor_mask() tells the task what it wrote;
  // tensor_mask() hands out the array, so the task assumes a set mask from then on, unless the
  // caller says what it wrote with tensor_mask_written().
  int32_t* tensor_mask();
  void set_tensor_mask(const std::vector<int32_t>& mask);
  // After writing the array through tensor_mask() (or a view of it, e.g. renaissance.torch):
  // whether any entry is nonzero. The step's bits do not depend on it, only its speed, as long as
  // `any_set` is true whenever an entry is set.
  void tensor_mask_written(bool any_set);
  // Whether the next step() runs the masked program (false without tensor_mask).
  bool masked_program_next() const;
  // A sharded step (ShardedStep::step) ran the masked program instead of step(): a masked
  // tensor's count may now stay behind, as after step() (program_for_step).
  void note_masked_step() { steps_equal_ = false; }
  // The program the next step() runs: compiled_step(), or a tensor_mask task's unmasked program
  // (graph.h) while it applies. A tensor_mask task prepares its masked program on the first step()
  // that runs it: what a benchmark times through Backend::timed_steps after one step().
  const CompiledStep& step_program() const;
  // gradient_table only (else Error): the table itself (num_params uint64 addresses in the
  // backend's memory, read by the next step), a host copy into it, and the arena's own G
  // addresses back into it (what compile() writes). While an entry points outside the arena,
  // writes into the arena's G (set_grad, synthesize_gradients, poison_gradient) are not what the
  // step reads for that parameter. Each address must stay valid until the step that reads it ran.
  uint64_t* gradient_table();
  void set_gradient_table(const std::vector<uint64_t>& addresses);
  void reset_gradient_table();
  std::vector<int64_t> tensor_steps();
  void set_tensor_steps(const std::vector<int64_t>& steps);
  int64_t skipped_steps();       // steps skipped for a non-finite gradient
  // Counts one step that the caller decided to skip without running it (a loss scaler's
  // found_inf, a scale without a finite reciprocal) as the core counts its own non-finite
  // skips: skipped_steps() + 1; nothing else changes (W, M, V, step counts, last_step_skipped()).
  void count_skipped_step();
  bool last_step_skipped();
  // The total gradient norm ‖ĝ‖ (ĝ = g*(1/scale), before clipping) that the last step computed
  // on the device, copied to the host on request. Only a step with max_grad_norm > 0 computes
  // it: 0 before the first such step. A skipped step leaves it as it was.
  double last_grad_norm();

  // xxHash3 of W, M, V (each tensor in id order, per family) and the step count: identical on
  // every machine and backend for the same run. 16 hex digits.
  std::string fingerprint();
  // The same hash over the tensors `ids` only, in that order: what a task holding just those
  // tensors (in that order) and this step count prints, e.g. one hyperparameter group's
  // fingerprint, which renaissance.torch combines as one task per group would.
  std::string fingerprint(const std::vector<size_t>& ids);

  // Checkpoints (runtime/src/checkpoint.cc): save writes a temporary file in the same folder,
  // fsyncs it and renames it over `path`; load validates everything before touching state, so a
  // failed load leaves the task bit-for-bit as it was. Both throw Error on failure.
  // Both refuse a layout beyond the limits of layout.h (rank, name length, count), the same
  // limits on both sides. load also restores run_settings() and refuses a checkpoint whose
  // check-finite flag differs from the task's (the compiled step differs).
  void save(const std::string& path);
  // The same file with M and V read through `state`; every rank of a sharded step calls it (the
  // reads are collective) and only the one with write_file writes (ShardedStep::save).
  void save(const std::string& path, const StateReader& state, bool write_file);
  // fingerprint() with M and V read through `state` (a sharded task: ShardedStep::fingerprint);
  // with `ids`, fingerprint(ids)'s hash (one hyperparameter group's tensors).
  std::string fingerprint(const StateReader& state);
  std::string fingerprint(const std::vector<size_t>& ids, const StateReader& state);
  void load(const std::string& path);
  void set_run_settings(const RunSettings& settings) { run_settings_ = settings; }
  const RunSettings& run_settings() const { return run_settings_; }

  const MemoryPlan& plan() const { return plan_; }
  const CompiledStep& compiled_step() const { return step_; }
  const OptimizerConfig& config() const { return groups_[0]; }
  Backend& backend();

 private:
  void require_compiled(const char* what) const;
  void synthesize(Family family, uint64_t seed, uint64_t step, float amplitude);
  void write_hyperparameters();
  void write_group_hyperparameters(int group);
  void write_group_lr(int group);
  void write_all_hyperparameters();
  void check_group(int group, const char* what) const;
  void write_f32_slot(int slot, float value);
  void refresh_model_copy(size_t id);
  uint16_t round_to_grad_dtype(float value) const;
  int32_t read_i32_slot(int slot);
  // The scalar blocks that hold group h's values (h itself, or with tensor_mask its tensors').
  std::vector<int> blocks_of_group(int group) const;
  void require_mask(const char* what) const;
  void require_gradient_table(const char* what) const;
  void write_bias_corrections(int block, const OptimizerConfig& c, int32_t t);
  void require_whole_state(const char* what) const;
  // The one definition of the fingerprint's bytes: W, M, V of `ids` (per family, in that order)
  // in pieces, the model copy, the step count; M and V come through `read_mv`.
  std::string hash_state(const std::vector<size_t>& ids, const StateReader& read_mv);
  // Writes elements [first, first + count) of tensor id of M or V; a sliced task keeps the part
  // inside its slice and drops the rest (every rank is given the whole tensor).
  void write_state_part(Family family, size_t id, uint64_t first, uint64_t count, const float* src);

  std::vector<ParamSpec> params_;
  TaskOptions options_;
  bool have_optimizer_ = false;
  // Every group's configuration and current lr, group 0's included (never empty): group 0's are
  // config() and lr(), what META of a checkpoint holds.
  std::vector<OptimizerConfig> groups_{OptimizerConfig{}};
  std::vector<double> lrs_{0.0};
  double loss_scale_ = 1.0;
  RunSettings run_settings_;
  MemoryPlan plan_;
  CompiledStep step_;
  // tensor_mask only: the program step() runs while no tensor is masked (graph.h), prepared at
  // compile(); step_ (the masked program) is prepared on its first use (alternate_prepared_).
  // mask_clear_: the host knows every mask entry is 0; steps_equal_: it knows every tensor's
  // count equals the task's (both hold after compile(): the arena starts at zero).
  CompiledStep unmasked_step_;
  bool alternate_prepared_ = false;
  bool mask_clear_ = true;
  bool steps_equal_ = true;
  // The program the next step runs (step_, or unmasked_step_); prepares step_ when first needed
  // and, when it is the masked one, forgets that the counts are equal.
  const CompiledStep& program_for_step();
  std::unique_ptr<Backend> backend_;
};

}  // namespace renaissance
