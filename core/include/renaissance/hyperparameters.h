// The table of hyperparameters: everything the surfaces need to know about one, in one place.
//
// Every surface derives what it needs from kHyperparameterTable: the builders' and the Python
// binding's validation (check_hyperparameter, OptimizerConfig::validate), the CLI's `run`
// options and their --help lines, the Python keywords each kind accepts and
// `renaissance.hyperparameters()`, the order of the fields in a checkpoint's META, the keys of a
// replay case's optimizer object, the --json output and the host-written scalar slots of a
// Task's block (scalars.h). Adding one is a row here, its field in OptimizerConfig, and the math
// that reads it (docs/adding-a-kind.md, "Adding a hyperparameter").
#pragma once

#include <string>

#include "renaissance/kinds.h"
#include "renaissance/optimizer.h"
#include "renaissance/scalars.h"

namespace renaissance {

enum class Hyperparameter {
  kLr,
  kWeightDecay,
  kMomentum,
  kBeta1,
  kBeta2,
  kEps,
  kTrustCoefficient,
  kMaxGradNorm,
  kMaximize,
  kDampening,
  kAmsgrad,
  kAuxLr,
  kNesterov,
  kNsSteps,
  kNsEps,
  kAdjustLr,
  kNsA,
  kNsB,
  kNsC,
  kAuxWeightDecay,
  kMuonMode,
};
constexpr int kNumHyperparameters = 21;

// The validation rule of a value (check_hyperparameter names the hyperparameter and the value).
enum class HyperRule {
  kLr,            // finite, >= 0, a float32
  kNonNegative,   // finite, >= 0
  kUnitInterval,  // in [0, 1)
  kPositive,      // finite, > 0
  kMaxGradNorm,   // finite, >= 0, a float32 that does not round to 0
  kFloat32,       // finite as a float32 (|x| <= FLT_MAX), any sign
  kFlag,          // true or false (a bool field, not a number)
  kSteps,         // a whole number in [1, 100]
  kChoice,        // the index of one of the row's `choices` (a whole number in [0, count))
};

// Where a checkpoint's META section holds the value (docs/checkpoint-format.md). The places keep
// the byte layout of every version: a new hyperparameter is kOptional, so that files without it
// load with its default and files that leave it at its default keep their bytes.
enum class MetaPlace {
  kHead,      // an f64 right after the weight-decay mode, in table order
  kTail,      // an f64 after the run settings, in table order
  kOptional,  // after the tail, in table order (a flag as u32 0/1, a number as f64), written only
              // up to the last one that differs from its default; a shorter META means defaults
};

// Which builder families read a hyperparameter (KindFamily bits).
constexpr unsigned family_bit(KindFamily f) { return 1u << static_cast<int>(f); }
constexpr unsigned kSgdFamily = family_bit(KindFamily::kSgd), kAdamFamily = family_bit(KindFamily::kAdam),
                   kLarsFamily = family_bit(KindFamily::kLars), kLionFamily = family_bit(KindFamily::kLion),
                   kLambFamily = family_bit(KindFamily::kLamb), kMuonFamily = family_bit(KindFamily::kMuon);
constexpr unsigned kEveryFamily = kSgdFamily | kAdamFamily | kLarsFamily | kLionFamily | kLambFamily | kMuonFamily;

struct HyperparameterInfo {
  Hyperparameter id;
  const char* name;  // the key of case.json, the Python keyword, the --json key, error messages
  const char* flag;  // the `renaissance run` option
  const char* help;  // its --help line (docs/cli.md)
  HyperRule rule;
  double OptimizerConfig::*number;  // the field of a number (nullptr for a flag)
  bool OptimizerConfig::*flag_field;  // the field of a flag (rule kFlag; nullptr for a number)
  // The default: the kind table's column (kKindTable's defaults, reference, bench) where it has
  // one, else `fixed_default` for every kind.
  double Hyperparameters::*kind_column;
  double fixed_default;
  unsigned families;        // the families whose builders and Python keywords take it
  bool task_wide;           // every hyperparameter group of one task holds the same value
  bool resume_may_change;   // `run --resume` accepts a new value with --override NAME
  MetaPlace meta;
  int f32_slot;  // the fp32 slot of the scalar block holding float(value), -1 for none
  int f64_slot;  // the fp64 slot holding the value, -1 for none
  // kChoice only: the names of the values 0, 1, ..., separated by '|' (the CLI takes a name).
  const char* choices = nullptr;
  // The compiled step holds the value (a family of the plan, a factor planned per tensor, a
  // node's mode), not a scalar slot: Task::optimizer() refuses to change it after compile() and a
  // checkpoint must hold the task's value. Such a row is task-wide and fixed for a resume.
  bool fixed_after_compile = false;
};

inline constexpr HyperparameterInfo kHyperparameterTable[] = {
    // lr's fp32 slot holds the task's current lr (set_lr, schedules), which starts at this value.
    {Hyperparameter::kLr, "lr", "--lr", "Base learning rate (default: the kind's)", HyperRule::kLr,
     &OptimizerConfig::lr, nullptr, &Hyperparameters::lr, 0.0, kEveryFamily, false, true, MetaPlace::kHead, kLr,
     -1},
    {Hyperparameter::kWeightDecay, "weight_decay", "--weight-decay", "Weight decay of the weight group",
     HyperRule::kNonNegative, &OptimizerConfig::weight_decay, nullptr, &Hyperparameters::weight_decay, 0.0,
     kEveryFamily, false, true, MetaPlace::kHead, kWeightDecay, kWeightDecayD},
    {Hyperparameter::kMomentum, "momentum", "--momentum", "Momentum (SGD momentum kinds, LARS, Muon)",
     HyperRule::kUnitInterval, &OptimizerConfig::momentum, nullptr, &Hyperparameters::momentum, 0.0,
     kSgdFamily | kLarsFamily | kMuonFamily, false, true, MetaPlace::kHead, kMomentum, -1},
    {Hyperparameter::kBeta1, "beta1", "--beta1", "Adam beta1 (Muon: the auxiliary AdamW's)", HyperRule::kUnitInterval,
     &OptimizerConfig::beta1, nullptr, &Hyperparameters::beta1, 0.0,
     kAdamFamily | kLionFamily | kLambFamily | kMuonFamily, false, true, MetaPlace::kHead, kBeta1, kBeta1D},
    {Hyperparameter::kBeta2, "beta2", "--beta2", "Adam beta2 (Muon: the auxiliary AdamW's)", HyperRule::kUnitInterval,
     &OptimizerConfig::beta2, nullptr, &Hyperparameters::beta2, 0.0,
     kAdamFamily | kLionFamily | kLambFamily | kMuonFamily, false, true, MetaPlace::kHead, kBeta2, kBeta2D},
    {Hyperparameter::kEps, "eps", "--eps", "Adam / LARS epsilon (Muon: the auxiliary AdamW's)", HyperRule::kPositive,
     &OptimizerConfig::eps, nullptr, &Hyperparameters::eps, 0.0, kAdamFamily | kLarsFamily | kLambFamily | kMuonFamily,
     false, true, MetaPlace::kHead, kEps, kEpsD},
    {Hyperparameter::kTrustCoefficient, "trust_coefficient", "--trust-coefficient", "LARS trust coefficient",
     HyperRule::kPositive, &OptimizerConfig::trust_coefficient, nullptr, &Hyperparameters::trust_coefficient, 0.0,
     kLarsFamily, false, true, MetaPlace::kHead, -1, kTrustCoefficientD},
    {Hyperparameter::kMaxGradNorm, "max_grad_norm", "--max-grad-norm",
     "Clip the global gradient norm to X, every kind (default 0: off)", HyperRule::kMaxGradNorm,
     &OptimizerConfig::max_grad_norm, nullptr, nullptr, 0.0, kEveryFamily, true, true, MetaPlace::kTail, -1,
     kMaxGradNormD},
    // A maximizing group's sign lives in its 1/scale slot (kInvLossScale, written with the loss
    // scale), not in a slot of its own.
    {Hyperparameter::kMaximize, "maximize", "--maximize",
     "Maximize instead of minimize, every kind (torch's maximize: the gradient is negated first)", HyperRule::kFlag,
     nullptr, &OptimizerConfig::maximize, nullptr, 0.0, kEveryFamily, false, false, MetaPlace::kOptional, -1, -1},
    // torch checks no dampening; this library asks for a float32-finite value. Its fp32 slot holds
    // 1 - dampening (kOneMinusDampening, written by Task), not the value, so the row names none.
    {Hyperparameter::kDampening, "dampening", "--dampening",
     "SGD momentum dampening (torch's: the momentum adds (1-X)*g after the first step; default 0)",
     HyperRule::kFloat32, &OptimizerConfig::dampening, nullptr, nullptr, 0.0, kSgdFamily, false, true,
     MetaPlace::kOptional, -1, -1},
    // A flag of the plan, not of the math's scalars: it adds the VMAX family (region.h), whose
    // presence the update reads. One value per task, fixed for a run (a resume cannot turn it on).
    {Hyperparameter::kAmsgrad, "amsgrad", "--amsgrad",
     "AMSGrad, adam and adamw (torch's amsgrad: the denominator reads the running max of v)", HyperRule::kFlag,
     nullptr, &OptimizerConfig::amsgrad, nullptr, 0.0, kAdamFamily, true, false, MetaPlace::kOptional, -1, -1, nullptr,
     true},
    // Muon's own (docs/math.md, "Muon"); their fp32 slots come after the device's (scalars.h) and
    // are not stored in a checkpoint's SCAL: the host forms them again from the configuration.
    {Hyperparameter::kAuxLr, "aux_lr", "--aux-lr",
     "Muon: the auxiliary AdamW's lr, bias-like parameters (default 3e-4; --lr is Muon's)", HyperRule::kLr,
     &OptimizerConfig::aux_lr, nullptr, nullptr, 3e-4, kMuonFamily, false, true, MetaPlace::kOptional, kAuxLr, -1},
    {Hyperparameter::kNesterov, "nesterov", "--nesterov",
     "Muon: Nesterov momentum (default on; --no-nesterov turns it off)", HyperRule::kFlag, nullptr,
     &OptimizerConfig::nesterov, nullptr, 1.0, kMuonFamily, false, false, MetaPlace::kOptional, -1, -1},
    {Hyperparameter::kNsSteps, "ns_steps", "--ns-steps", "Muon: Newton-Schulz steps, 1 to 100 (default 5)",
     HyperRule::kSteps, &OptimizerConfig::ns_steps, nullptr, nullptr, 5.0, kMuonFamily, false, true,
     MetaPlace::kOptional, kNsSteps, -1},
    {Hyperparameter::kNsEps, "ns_eps", "--ns-eps", "Muon: eps of the Newton-Schulz normalisation (default 1e-7)",
     HyperRule::kPositive, &OptimizerConfig::ns_eps, nullptr, nullptr, 1e-7, kMuonFamily, false, true,
     MetaPlace::kOptional, kNsEps, -1},
    // Task-wide: each matrix's lr factor is planned at compile() (MemoryPlan::muon_matrices).
    {Hyperparameter::kAdjustLr, "adjust_lr", "--adjust-lr",
     "Muon: lr adjustment, original (lr*sqrt(max(1,A/B))) or match_rms_adamw (0.2*lr*sqrt(max(A,B)))",
     HyperRule::kChoice, &OptimizerConfig::adjust_lr, nullptr, nullptr, 0.0, kMuonFamily, true, false,
     MetaPlace::kOptional, -1, -1, "original|match_rms_adamw", true},
    {Hyperparameter::kNsA, "ns_a", "--ns-a", "Muon: Newton-Schulz coefficient a (default 3.4445)", HyperRule::kFloat32,
     &OptimizerConfig::ns_a, nullptr, nullptr, 3.4445, kMuonFamily, false, true, MetaPlace::kOptional, kNsA, -1},
    {Hyperparameter::kNsB, "ns_b", "--ns-b", "Muon: Newton-Schulz coefficient b (default -4.7750)", HyperRule::kFloat32,
     &OptimizerConfig::ns_b, nullptr, nullptr, -4.7750, kMuonFamily, false, true, MetaPlace::kOptional, kNsB, -1},
    {Hyperparameter::kNsC, "ns_c", "--ns-c", "Muon: Newton-Schulz coefficient c (default 2.0315)", HyperRule::kFloat32,
     &OptimizerConfig::ns_c, nullptr, nullptr, 2.0315, kMuonFamily, false, true, MetaPlace::kOptional, kNsC, -1},
    // Decoupled (AdamW's w *= 1 - aux_lr*wd); its factor is kAuxDecayFactor, formed by Task.
    {Hyperparameter::kAuxWeightDecay, "aux_weight_decay", "--aux-weight-decay",
     "Muon: the auxiliary AdamW's decoupled weight decay, with aux_lr (default 0)", HyperRule::kNonNegative,
     &OptimizerConfig::aux_weight_decay, nullptr, nullptr, 0.0, kMuonFamily, false, true, MetaPlace::kOptional,
     kAuxWeightDecay, -1},
    // Task-wide and planned at compile(): the compiler writes it into MUON_ORTHOGONALIZE's node
    // (MuonDesc::mode), so no scalar slot holds it (docs/math.md, "Muon: fast mode").
    {Hyperparameter::kMuonMode, "muon_mode", "--muon-mode",
     "Muon: Newton-Schulz products, exact (fixed-point, the same bits on every backend) or fast (fp32 on the CPU, "
     "bf16 with fp32 accumulation on CUDA; not bitwise across backends)",
     HyperRule::kChoice, &OptimizerConfig::muon_mode, nullptr, nullptr, 0.0, kMuonFamily, true, false,
     MetaPlace::kOptional, -1, -1, "exact|fast", true},
};

// A forgotten row, or rows out of enum order, is a compile error.
static_assert(sizeof(kHyperparameterTable) / sizeof(kHyperparameterTable[0]) == kNumHyperparameters,
              "kHyperparameterTable needs one row per Hyperparameter");
constexpr bool hyperparameter_table_consistent() {
  MetaPlace last = MetaPlace::kHead;
  for (int i = 0; i < kNumHyperparameters; ++i) {
    const HyperparameterInfo& h = kHyperparameterTable[i];
    if (static_cast<int>(h.id) != i) return false;
    // Exactly one field, of the rule's type.
    if ((h.rule == HyperRule::kFlag) != (h.flag_field != nullptr) || (h.number == nullptr) == (h.flag_field == nullptr)) {
      return false;
    }
    // META is written in table order: head rows, then tail rows, then optional rows.
    if (static_cast<int>(h.meta) < static_cast<int>(last)) return false;
    last = h.meta;
    if (h.meta == MetaPlace::kOptional && h.kind_column != nullptr) return false;  // a reader knows its default
    // Only the slots the host writes per block (Task's host_scalar_slots): fp32 before
    // kInvLossScale (formed with the loss scale) or Muon's (kFirstMuonScalarF32 on, not stored in
    // checkpoints), fp64 before kGradNormD (the device's).
    if (h.f32_slot >= kInvLossScale && h.f32_slot < kFirstMuonScalarF32) return false;
    if (h.f64_slot >= kGradNormD) return false;
    if ((h.rule == HyperRule::kChoice) != (h.choices != nullptr)) return false;
    if (h.fixed_after_compile && (!h.task_wide || h.resume_may_change)) return false;
  }
  return true;
}
static_assert(hyperparameter_table_consistent(),
              "kHyperparameterTable: rows in enum order, one field each, META places in order, optional rows with a fixed "
              "default, host slots only, rows fixed after compile task-wide and fixed for a resume");

constexpr const HyperparameterInfo& hyperparameter_info(Hyperparameter h) {
  return kHyperparameterTable[static_cast<int>(h)];
}
// The rule's name as `renaissance.hyperparameters()` reports it ("lr", "non_negative", ...).
const char* hyper_rule_name(HyperRule rule);

// The row called `name` ("lr", ...), or nullptr.
const HyperparameterInfo* find_hyperparameter(const std::string& name);

// Whether the kind's builder (and its Python keywords) takes the hyperparameter: the rows of its
// family, except that momentum and dampening act on the momentum buffer M, so a kind without M
// (sgd) reads neither (SGD with a momentum is kind sgd_momentum).
constexpr bool kind_reads(OptimizerKind kind, const HyperparameterInfo& h) {
  if (!kind_info(kind).has_m && (h.id == Hyperparameter::kMomentum || h.id == Hyperparameter::kDampening)) return false;
  return (h.families & family_bit(kind_info(kind).family)) != 0;
}

// The kinds whose builders take the row, in kind table order ("sgd, sgd_momentum, sgd_nesterov").
std::string kinds_reading(const HyperparameterInfo& h);
// Refuses a value of the row set on a kind that does not read it (kind_reads): one that the
// step would take and ignore. A configuration holds every row for every kind, so the kind's own
// default (hyper_default: its kind table column, else the row's fixed default) stays accepted:
// that is what a kind's configuration holds when nothing set the row (and what a recorded
// case.json writes out). Throws ErrorKind::kInvalidArgument in torch's words: "adam does not
// take momentum (0.5 given; the kinds that do: ...)". OptimizerConfig::validate applies it to
// every row, so Task, checkpoints and the replay loader refuse by it.
void check_kind_takes(OptimizerKind kind, const HyperparameterInfo& h, double value);
// A value of the row as text: a choice's name, a flag's on / off, a number's shortest decimal.
std::string hyper_value_text(const HyperparameterInfo& h, double v);

// A row's value in a configuration, as a double (a flag: 0 or 1), and the setter.
inline double hyper_value(const OptimizerConfig& c, const HyperparameterInfo& h) {
  return h.number != nullptr ? c.*h.number : (c.*h.flag_field ? 1.0 : 0.0);
}
inline void set_hyper_value(OptimizerConfig& c, const HyperparameterInfo& h, double v) {
  if (h.number != nullptr) c.*h.number = v;
  else c.*h.flag_field = v != 0.0;
}
// fn(name, value) for every row with a kind table column, in table order, its value taken from
// `h` (one column of a kind: defaults, reference or bench).
template <typename Fn>
void for_each_kind_column(const Hyperparameters& h, Fn fn) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.kind_column != nullptr) fn(row.name, h.*row.kind_column);
  }
}
// The row's default for a kind (the kind table's column, else the fixed default).
inline double hyper_default(OptimizerKind kind, const HyperparameterInfo& h) {
  return h.kind_column != nullptr ? kind_info(kind).defaults.*h.kind_column : h.fixed_default;
}

}  // namespace renaissance
