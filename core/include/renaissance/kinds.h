// The table of optimizer kinds: everything that tells one kind from another, in one place.
//
// Every other part of the project derives what it needs from kKindTable: the names and the
// parser, the state families of the memory plan, the compiler's update op per group and its
// norm pass, the ideal traffic per parameter, validation rules, the library defaults, and the
// reference hyperparameters that the tests, the conformance suite, the fuzzers and the
// benchmarks share. `renaissance kinds --json` prints the table for scripts (bench/,
// conformance/render_report.py). docs/adding-a-kind.md lists the files a new kind touches.
#pragma once

#include <cstddef>

#include "renaissance/name_table.h"
#include "renaissance/ops.h"

namespace renaissance {

enum class OptimizerKind {
  kSgd,
  kSgdMomentum,
  kSgdNesterov,
  kAdam,
  kAdamW,
  kLars,
  kLarsNesterov,
  kLion,
  kLamb,
  kMuon,
};
constexpr int kNumOptimizerKinds = 10;

// The hyperparameters a configuration holds (each kind reads the ones it needs).
struct Hyperparameters {
  double lr;
  double weight_decay;
  double momentum;
  double beta1;
  double beta2;
  double eps;
  double trust_coefficient;
};

// Which per-tensor norm pass a kind runs before its update (docs/design.md, "Norm passes").
enum class NormPass {
  kNone,
  kLarsTrustRatio,  // ‖w‖², ‖ĝ‖² per weight-group tensor -> the LARS trust ratio in N
  kLambTrustRatio,  // phase 1 updates m, v; ‖w‖², ‖u‖² per weight-group tensor -> LAMB's r in N
  // Muon: momentum into the update U, then Newton–Schulz per weight-group matrix, which writes
  // each tensor's adjusted lr into N (no norm tiles are summed: the tiles only drive the update).
  kMuonOrthogonalize,
};

// Which builder family a kind belongs to: it decides which hyperparameters the kind reads.
enum class KindFamily { kSgd, kAdam, kLars, kLion, kLamb, kMuon };

// What torch calls a kind's M, per group: torch's momentum optimizers (SGD, Muon; LARS after
// them) keep it as `momentum_buffer`, its Adam-like ones (Adam, AdamW; Lion and LAMB after them)
// as `exp_avg`. The keys themselves are the family table's (region.h: FamilyInfo::torch_state,
// and torch_state_momentum in a momentum-buffer group); torch_state_keys (plan.h) combines both.
enum class TorchM {
  kExpAvg,          // both groups
  kMomentumBuffer,  // both groups
  // The weight group's M is a momentum buffer, the bias-like group's an exp_avg (muon: the
  // weight group is torch.optim.Muon, the bias-like group its auxiliary AdamW).
  kMomentumBufferInWeightGroup,
};

struct KindInfo {
  OptimizerKind kind;
  const char* name;     // the spelling in files, on the command line and in the fingerprint specs
  const char* summary;  // one line for --help and `renaissance kinds`
  KindFamily family;
  bool has_m;            // first moment / momentum buffer M
  bool has_v;            // second moment V
  TorchM torch_m;        // torch's name of M per group (kSgd: torch.optim.SGD's, though it keeps no M)
  NormPass norm;
  bool bias_correction;  // ADVANCE_STEP also advances 1/(1-β1^t), 1/(1-β2^t)
  bool needs_momentum;   // momentum must be > 0
  bool allows_l2;        // weight_decay_mode l2 is accepted (torch.optim.SGD semantics)
  // The weight update's momentum in its Nesterov form. The compiler hands it to the update nodes
  // (NodeFlags::nesterov), where an op that has both forms picks its rule by it (UPDATE_LARS); the
  // SGD kinds keep an op per form, and Muon's is a hyperparameter (its scalar block).
  bool nesterov;
  RangeOp weight_update;  // the update op of the weight group
  RangeOp bias_update;    // ... and of the bias-like group (wd = 0 there for every kind)
  // Ideal memory traffic of one step per fp32 parameter without the non-finite check
  // (docs/design.md, "Performance model"); the check reads G once more (+4 B).
  double bytes_per_param;
  Hyperparameters defaults;   // the library's defaults (builders, CLI, replay's missing keys)
  Hyperparameters reference;  // tests, conformance cells and fuzzers: every term matters
  Hyperparameters bench;      // benchmarks on both sides of the torch comparison
  double drift_lr;            // the conformance drift runs (1000 steps; see audit/matrix.cc)
};

// Columns:              lr     wd     mom  beta1 beta2  eps   tc
inline constexpr KindInfo kKindTable[] = {
    {OptimizerKind::kSgd, "sgd", "SGD without momentum", KindFamily::kSgd,
     false, false, TorchM::kMomentumBuffer, NormPass::kNone, false, false, true, false,
     RangeOp::UPDATE_SGD, RangeOp::UPDATE_SGD, 12.0,
     {0.01, 0.0, 0.0, 0.9, 0.999, 1e-8, 0.001},
     {0.01, 0.05, 0.0, 0.9, 0.999, 1e-8, 0.001},
     {0.1, 1e-4, 0.0, 0.9, 0.999, 1e-8, 0.001}, 5e-4},
    {OptimizerKind::kSgdMomentum, "sgd_momentum", "SGD with heavy-ball momentum", KindFamily::kSgd,
     true, false, TorchM::kMomentumBuffer, NormPass::kNone, false, true, true, false,
     RangeOp::UPDATE_SGD_MOMENTUM, RangeOp::UPDATE_SGD_MOMENTUM, 20.0,
     {0.01, 0.0, 0.9, 0.9, 0.999, 1e-8, 0.001},
     {0.01, 0.05, 0.9, 0.9, 0.999, 1e-8, 0.001},
     {0.1, 1e-4, 0.9, 0.9, 0.999, 1e-8, 0.001}, 5e-5},
    {OptimizerKind::kSgdNesterov, "sgd_nesterov", "SGD with Nesterov momentum", KindFamily::kSgd,
     true, false, TorchM::kMomentumBuffer, NormPass::kNone, false, true, true, true,
     RangeOp::UPDATE_SGD_NESTEROV, RangeOp::UPDATE_SGD_NESTEROV, 20.0,
     {0.01, 0.0, 0.9, 0.9, 0.999, 1e-8, 0.001},
     {0.01, 0.05, 0.9, 0.9, 0.999, 1e-8, 0.001},
     {0.1, 1e-4, 0.9, 0.9, 0.999, 1e-8, 0.001}, 5e-5},
    {OptimizerKind::kAdam, "adam", "Adam with L2 weight decay (torch.optim.Adam)", KindFamily::kAdam,
     true, true, TorchM::kExpAvg, NormPass::kNone, true, false, false, false,
     RangeOp::UPDATE_ADAM, RangeOp::UPDATE_ADAM, 28.0,
     {1e-3, 0.0, 0.0, 0.9, 0.999, 1e-8, 0.001},
     {2e-3, 0.05, 0.0, 0.9, 0.999, 1e-8, 0.001},
     {1e-3, 0.0, 0.0, 0.9, 0.999, 1e-8, 0.001}, 2e-4},
    {OptimizerKind::kAdamW, "adamw", "Adam with decoupled weight decay (torch.optim.AdamW)", KindFamily::kAdam,
     true, true, TorchM::kExpAvg, NormPass::kNone, true, false, false, false,
     RangeOp::UPDATE_ADAMW, RangeOp::UPDATE_ADAMW, 28.0,
     {1e-3, 0.01, 0.0, 0.9, 0.999, 1e-8, 0.001},
     {2e-3, 0.05, 0.0, 0.9, 0.999, 1e-8, 0.001},
     {1e-3, 0.01, 0.0, 0.9, 0.999, 1e-8, 0.001}, 2e-4},
    // LARS adapts only the weight group; bias-like parameters get plain momentum with wd = 0.
    // Traffic: the momentum update (20 B) plus the norm pass over w and g (8 B).
    {OptimizerKind::kLars, "lars", "LARS: layer-wise trust ratio on momentum SGD", KindFamily::kLars,
     true, false, TorchM::kMomentumBuffer, NormPass::kLarsTrustRatio, false, false, false, false,
     RangeOp::UPDATE_LARS, RangeOp::UPDATE_SGD_MOMENTUM, 28.0,
     {0.1, 0.0, 0.9, 0.9, 0.999, 1e-8, 0.001},
     {0.02, 1e-3, 0.9, 0.9, 0.999, 1e-8, 0.2},
     {0.5, 5e-5, 0.9, 0.9, 0.999, 1e-8, 0.001}, 1e-4},
    {OptimizerKind::kLarsNesterov, "lars_nesterov", "LARS with Nesterov momentum", KindFamily::kLars,
     true, false, TorchM::kMomentumBuffer, NormPass::kLarsTrustRatio, false, true, false, true,
     RangeOp::UPDATE_LARS, RangeOp::UPDATE_SGD_NESTEROV, 28.0,
     {0.1, 0.0, 0.9, 0.9, 0.999, 1e-8, 0.001},
     {0.02, 1e-3, 0.9, 0.9, 0.999, 1e-8, 0.2},
     {0.5, 5e-5, 0.9, 0.9, 0.999, 1e-8, 0.001}, 1e-4},
    // Lion reads lr, wd, beta1, beta2 (no eps); one state buffer: reads g, w, m, writes w, m.
    // The drift lr is small: a sign flips where c is within rounding of 0, moving w by 2*lr.
    {OptimizerKind::kLion, "lion", "Lion: sign of the interpolated momentum (timm Lion)", KindFamily::kLion,
     true, false, TorchM::kExpAvg, NormPass::kNone, false, false, false, false,
     RangeOp::UPDATE_LION, RangeOp::UPDATE_LION, 20.0,
     {1e-4, 0.0, 0.0, 0.9, 0.99, 1e-8, 0.001},
     {1e-3, 0.1, 0.0, 0.9, 0.99, 1e-8, 0.001},
     {1e-4, 0.01, 0.0, 0.9, 0.99, 1e-8, 0.001}, 1e-6},
    // LAMB adapts only the weight group (two phases: moments + norms, then the update); the
    // bias-like group is one pass with r = 1 and wd = 0. Traffic: phase 1 reads g, w, m, v and
    // writes m, v (24 B), phase 2 reads w, m, v and writes w (16 B).
    {OptimizerKind::kLamb, "lamb", "LAMB: layer-wise trust ratio on bias-corrected Adam (timm Lamb)",
     KindFamily::kLamb, true, true, TorchM::kExpAvg, NormPass::kLambTrustRatio, true, false, false, false,
     RangeOp::UPDATE_LAMB, RangeOp::UPDATE_LAMB_BIAS, 40.0,
     {1e-3, 0.01, 0.0, 0.9, 0.999, 1e-6, 0.001},
     {2e-3, 0.05, 0.0, 0.9, 0.999, 1e-6, 0.001},
     {1e-3, 0.01, 0.0, 0.9, 0.999, 1e-6, 0.001}, 2e-4},
    // Muon (torch.optim.Muon's math and defaults: lr 1e-3, wd 0.1, momentum 0.95) on the weight
    // group, each tensor viewed as the matrix (shape[0], prod(rest)); the bias-like group runs the
    // auxiliary AdamW (MuonWithAuxAdam's defaults: betas (0.9, 0.95), eps 1e-10; its lr and its
    // decoupled wd are the aux_lr and aux_weight_decay hyperparameters, wd 0 by default), also on
    // the weight-role tensors a layout marks "adamw". M is the momentum buffer (the aux
    // group's exp_avg), V the aux group's exp_avg_sq (allocated but unused in the weight group),
    // N each matrix's adjusted lr. Traffic counts the element-wise passes only (the momentum pass
    // reads g, m and writes m, U: 16 B; the update reads w, U and writes w: 12 B), not the
    // Newton–Schulz products. drift_lr: the conformance drift run (audit/matrix.cc).
    {OptimizerKind::kMuon, "muon", "Muon: Newton-Schulz orthogonalised momentum (exact), aux AdamW on bias-like",
     KindFamily::kMuon, true, true, TorchM::kMomentumBufferInWeightGroup, NormPass::kMuonOrthogonalize, true, false, false, false,
     RangeOp::UPDATE_MUON, RangeOp::UPDATE_ADAMW, 28.0,
     {1e-3, 0.1, 0.95, 0.9, 0.95, 1e-10, 0.001},
     {0.02, 0.05, 0.95, 0.9, 0.95, 1e-10, 0.001},
     {1e-3, 0.1, 0.95, 0.9, 0.95, 1e-10, 0.001}, 1e-4},
};

// A forgotten row, or rows out of enum order, is a compile error.
static_assert(sizeof(kKindTable) / sizeof(kKindTable[0]) == kNumOptimizerKinds,
              "kKindTable needs one row per OptimizerKind");
static_assert(rows_in_enum_order(kKindTable, &KindInfo::kind), "kKindTable rows must follow the OptimizerKind order");

constexpr const KindInfo& kind_info(OptimizerKind kind) { return kKindTable[static_cast<int>(kind)]; }

const char* kind_family_name(KindFamily family);  // "sgd", "adam", "lars", "lion", "lamb", "muon"
const char* norm_pass_name(NormPass norm);  // "none", "lars_trust_ratio", "lamb_trust_ratio", "muon_orthogonalize"
const char* torch_m_name(TorchM m);  // "exp_avg", "momentum_buffer", "momentum_buffer_in_weight_group"

}  // namespace renaissance
