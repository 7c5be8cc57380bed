// The META, PREC and LAYT codec of checkpoints (checkpoint_codec.h): the bytes Task::save writes
// for them and the decoding and checks of Task::load and read_checkpoint_info.
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime/src/checkpoint_codec.h"  // after xxhash.h (checkpoint_framing.h)
#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/precision.h"

namespace renaissance {
namespace checkpoint_format {

namespace {

// LAYT's per-parameter role word: the role in bits 0-7, the optimizer mark (ParamOptimizer) in
// bits 8 and up, so that a layout without marks writes the bytes it always wrote.
constexpr uint32_t kLayoutMarkShift = 8;
constexpr uint32_t kLayoutRoleMask = (1u << kLayoutMarkShift) - 1;
uint32_t layout_role_word(const ParamSpec& p) {
  return static_cast<uint32_t>(p.role) | (static_cast<uint32_t>(p.optimizer) << kLayoutMarkShift);
}
const char* mark_name(ParamOptimizer mark) { return mark == ParamOptimizer::kAdamW ? "adamw" : "by role"; }

// "a " or "an " before an initialism such as "bf16" / "fp16" (its first letter read by name).
std::string article(const std::string& initialism) {
  return std::string("aefhilmnorsx").find(initialism.at(0)) != std::string::npos ? "an " : "a ";
}

std::string precision_text(const PrecisionOptions& p) {
  if (p.precision == Precision::kFp32) return "no model copy (fp32)";
  std::string s = article(precision_name(p.precision)) + precision_name(p.precision) +
                  " model copy rounded " + (p.rounding == Rounding::kStochastic ? "stochastically" : "to nearest even");
  if (p.rounding == Rounding::kStochastic) s += " with seed " + std::to_string(p.seed);
  return s;
}

// The hyperparameters META holds at `place`, in table order (hyperparameters.h, MetaPlace).
void read_meta_hyperparameters(Cursor& c, MetaPlace place, OptimizerConfig* cfg) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.meta != place) continue;
    if (place == MetaPlace::kOptional && c.remaining() == 0) {
      set_hyper_value(*cfg, row, row.fixed_default);
      continue;
    }
    if (row.number != nullptr) {
      cfg->*row.number = c.f64();
      // The writer stops at the last optional row that differs from its default, so a number at
      // its default that ends the file was not written by it (a flag at 0 there is read, as it always was).
      if (place == MetaPlace::kOptional && c.remaining() == 0 && cfg->*row.number == row.fixed_default) {
        std::ostringstream os;
        os << row.name << " " << row.fixed_default << " is written by leaving the field out";
        c.fail(os.str());
      }
      continue;
    }
    const uint32_t flag = c.u32();
    if (flag > 1) c.fail(std::string(row.name) + " flag " + std::to_string(flag) + " is neither 0 nor 1");
    cfg->*row.flag_field = flag == 1;
  }
}

// ... and written: the optional ones only up to the last that differs from its default, so a
// configuration at its defaults keeps the bytes of a file from before those fields.
void write_meta_hyperparameters(Bytes& b, MetaPlace place, const OptimizerConfig& cfg) {
  int end = 0;
  for (int i = 0; i < kNumHyperparameters; ++i) {
    const HyperparameterInfo& row = kHyperparameterTable[i];
    if (row.meta == place && (place != MetaPlace::kOptional || hyper_value(cfg, row) != row.fixed_default)) end = i + 1;
  }
  for (int i = 0; i < end; ++i) {
    const HyperparameterInfo& row = kHyperparameterTable[i];
    if (row.meta != place) continue;
    if (row.number != nullptr) b.f64(cfg.*row.number);
    else b.u32(cfg.*row.flag_field ? 1 : 0);
  }
}

}  // namespace

void encode_meta(const CheckpointInfo& info, Bytes* out) {
  Bytes& meta = *out;
  meta.str(optimizer_kind_name(info.config.kind));
  meta.u32(static_cast<uint32_t>(info.config.weight_decay_mode));
  write_meta_hyperparameters(meta, MetaPlace::kHead, info.config);
  meta.f64(info.lr);
  meta.f64(info.loss_scale);
  meta.i64(info.step);
  meta.i64(info.skipped);
  meta.u32(info.check_finite ? 1 : 0);
  meta.str(info.run.schedule);
  meta.i64(info.run.schedule_steps);
  meta.i64(info.run.warmup);
  meta.u64(info.run.seed);
  write_meta_hyperparameters(meta, MetaPlace::kTail, info.config);
  write_meta_hyperparameters(meta, MetaPlace::kOptional, info.config);  // none at their defaults: no bytes
}

void decode_meta(Cursor& c, CheckpointInfo* info) {
  const std::string kind_name = c.str();
  const uint32_t mode = c.u32();
  OptimizerConfig& cfg = info->config;
  read_meta_hyperparameters(c, MetaPlace::kHead, &cfg);
  info->lr = c.f64();
  info->loss_scale = c.f64();
  info->step = c.i64();
  info->skipped = c.i64();
  const uint32_t check_finite = c.u32();
  info->run.schedule = c.str();
  info->run.schedule_steps = c.i64();
  info->run.warmup = c.i64();
  info->run.seed = c.u64();
  read_meta_hyperparameters(c, MetaPlace::kTail, &cfg);
  // Group 0's optional hyperparameters (maximize: a u32 0/1; dampening: an f64), written up to
  // the last one off its default; a file that ends before one, as every file written before it
  // existed, holds its default.
  read_meta_hyperparameters(c, MetaPlace::kOptional, &cfg);
  c.expect_end();
  if (!parse_optimizer_kind(kind_name, &cfg.kind)) c.fail("unknown optimizer kind '" + io::printable(kind_name) + "'");
  if (mode > static_cast<uint32_t>(WeightDecayMode::kL2)) c.fail("unknown weight decay mode " + std::to_string(mode));
  cfg.weight_decay_mode = static_cast<WeightDecayMode>(mode);
  if (check_finite > 1) c.fail("check-finite flag " + std::to_string(check_finite) + " is neither 0 nor 1");
  info->check_finite = check_finite == 1;
  try {
    cfg.validate();
    check_lr(info->lr);
    check_loss_scale(info->loss_scale);
  } catch (const Error& e) {
    c.fail(std::string("invalid hyperparameters: ") + e.what());
  }
  if (info->step < 0 || info->step > std::numeric_limits<int32_t>::max() || info->skipped < 0 ||
      info->skipped > std::numeric_limits<int32_t>::max()) {
    c.fail("step counts out of range (" + std::to_string(info->step) + " applied, " + std::to_string(info->skipped) +
           " skipped)");
  }
  if (info->run.schedule.size() > kMaxScheduleName || info->run.schedule_steps < 0 || info->run.warmup < 0 ||
      info->run.schedule_steps > std::numeric_limits<int32_t>::max() ||
      info->run.warmup > std::numeric_limits<int32_t>::max()) {
    c.fail("run settings out of range");
  }
}

void check_meta_matches(const std::string& path, const CheckpointInfo& info, const OptimizerConfig& task,
                        bool check_finite) {
  const OptimizerConfig& cfg = info.config;
  if (cfg.kind != task.kind) {
    throw_invalid("checkpoint " + path + ": checkpoint is for optimizer " + optimizer_kind_name(cfg.kind) +
                  ", task uses " + optimizer_kind_name(task.kind));
  }
  // The hyperparameters the compiled step holds (amsgrad, Muon's adjust_lr and mode).
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    const double file = hyper_value(cfg, row), mine = hyper_value(task, row);
    if (!row.fixed_after_compile || file == mine) continue;
    if (row.flag_field != nullptr) {
      throw_invalid("checkpoint " + path + ": checkpoint was made " + (file != 0.0 ? "with " : "without ") + row.name +
                    ", task runs " + (mine != 0.0 ? "with" : "without") + " it");
    }
    throw_invalid("checkpoint " + path + ": checkpoint was made with " + row.name + " " + hyper_value_text(row, file) +
                  ", task runs " + row.name + " " + hyper_value_text(row, mine));
  }
  // Any other switch of a family (kFamilyTable's FamilyNeed): the file's families are the task's.
  const PlanConfig file_families = plan_config_from_optimizer(cfg), task_families = plan_config_from_optimizer(task);
  for (const FamilyInfo& f : kFamilyTable) {
    if (file_families.has(f.family) == task_families.has(f.family)) continue;
    throw_invalid("checkpoint " + path + ": checkpoint was made " + (file_families.has(f.family) ? "with" : "without") +
                  " the " + f.name + " family, task runs " + (task_families.has(f.family) ? "with" : "without") + " it");
  }
  if (cfg.weight_decay_mode != task.weight_decay_mode) {
    auto mode_name = [](WeightDecayMode m) { return m == WeightDecayMode::kL2 ? "l2" : "decoupled"; };
    throw_invalid("checkpoint " + path + ": checkpoint uses weight decay mode " + mode_name(cfg.weight_decay_mode) +
                  ", task uses " + mode_name(task.weight_decay_mode));
  }
  if ((cfg.max_grad_norm > 0.0) != (task.max_grad_norm > 0.0)) {
    throw_invalid("checkpoint " + path + ": checkpoint was made " + (cfg.max_grad_norm > 0.0 ? "with" : "without") +
                  " gradient-norm clipping, task runs " + (task.max_grad_norm > 0.0 ? "with" : "without") + " it");
  }
  if (info.check_finite != check_finite) {
    throw_invalid("checkpoint " + path + ": checkpoint was made " + (info.check_finite ? "with" : "without") +
                  " the non-finite check, task runs " + (check_finite ? "with" : "without") + " it");
  }
}

void encode_precision(const PrecisionOptions& p, Bytes* out) {
  out->u32(static_cast<uint32_t>(p.precision));
  out->u32(static_cast<uint32_t>(p.rounding));
  out->u64(p.seed);
}

// PRECISION: the copy's dtype and the stochastic-rounding key (the step is in SCALARS). A
// version-3 file always has a bf16 or fp16 copy: fp32 checkpoints are version 2.
void decode_precision(Cursor& c, PrecisionOptions* p) {
  const uint32_t precision = c.u32();
  const uint32_t rounding = c.u32();
  p->seed = c.u64();
  c.expect_end();
  Precision copy = Precision::kFp32;
  if (!precision_from_code(precision, &copy) || copy == Precision::kFp32) {
    std::string known;
    for (const PrecisionRow& row : kPrecisionRows) {
      if (row.value == Precision::kFp32) continue;
      known += std::string(known.empty() ? "neither " : " nor ") + std::to_string(static_cast<int>(row.value)) + " (" +
               row.name + ")";
    }
    c.fail("model copy precision " + std::to_string(precision) + " is " + known);
  }
  if (rounding > static_cast<uint32_t>(Rounding::kStochastic)) {
    c.fail("rounding " + std::to_string(rounding) + " is neither 0 (nearest) nor 1 (stochastic)");
  }
  p->precision = copy;
  p->rounding = static_cast<Rounding>(rounding);
}

// Refuses a checkpoint whose model copy would not continue the task's run: another dtype, another
// rounding, or (stochastic rounding only: nearest does not draw) another seed of the key.
void check_precision(const std::string& path, const PrecisionOptions& file, const PrecisionOptions& task) {
  const bool same = file.precision == task.precision &&
                    (file.precision == Precision::kFp32 ||
                     (file.rounding == task.rounding && (file.rounding == Rounding::kNearest || file.seed == task.seed)));
  if (!same) {
    throw_invalid("checkpoint " + path + ": checkpoint has " + precision_text(file) + ", task has " +
                  precision_text(task));
  }
}

void encode_layout(const std::vector<ParamSpec>& params, Bytes* out) {
  Bytes& layout = *out;
  layout.u64(params.size());
  for (const ParamSpec& p : params) {
    layout.str(p.name);
    layout.u32(layout_role_word(p));
    layout.u32(static_cast<uint32_t>(p.shape.size()));
    for (int64_t d : p.shape) layout.i64(d);
  }
}

// LAYOUT: the file's parameters are the task's (count, then name, shape and role of each; the
// role's word holds the optimizer mark in its bits 8 and up, 0 for ParamOptimizer::kRole).
void check_layout(Cursor& c, const std::string& path, const std::vector<ParamSpec>& params) {
  const uint64_t count = c.u64();
  const std::string differs = "checkpoint " + path + ": checkpoint layout differs from the task's";
  if (count != params.size()) {
    throw_invalid(differs + ": " + std::to_string(count) + " parameters (checkpoint) vs " +
                  std::to_string(params.size()) + " (task)");
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    const std::string name = c.str();
    const uint32_t role = c.u32();
    const uint32_t rank = c.u32();
    if (rank > kMaxParamRank || rank * uint64_t{8} > c.remaining()) c.fail("malformed payload (rank " + std::to_string(rank) + ")");
    std::vector<int64_t> shape(rank);
    for (auto& e : shape) e = c.i64();
    const std::string at = differs + " at parameter " + std::to_string(i);
    if (name != p.name) throw_invalid(at + ": name '" + name + "' (checkpoint) vs '" + p.name + "' (task)");
    const std::string named = at + " '" + p.name + "'";
    if (shape != p.shape) {
      throw_invalid(named + ": shape " + shape_text(shape) + " (checkpoint) vs " + shape_text(p.shape) + " (task)");
    }
    const uint32_t role_bits = role & kLayoutRoleMask, mark = role >> kLayoutMarkShift;
    if (role_bits != static_cast<uint32_t>(p.role)) {
      const std::string seen = role_bits < static_cast<uint32_t>(kNumRoles) ? role_name(static_cast<Role>(role_bits))
                                                                            : "#" + std::to_string(role_bits);
      throw_invalid(named + ": role " + seen + " (checkpoint) vs " + role_name(p.role) + " (task)");
    }
    if (mark != static_cast<uint32_t>(p.optimizer)) {
      const std::string seen = mark <= 1 ? mark_name(static_cast<ParamOptimizer>(mark)) : "#" + std::to_string(mark);
      throw_invalid(named + ": optimizer " + seen + " (checkpoint) vs " + mark_name(p.optimizer) + " (task)");
    }
  }
  c.expect_end();
}

}  // namespace checkpoint_format
}  // namespace renaissance
