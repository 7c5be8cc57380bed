// The conformance matrix and its inputs (see matrix.h). Why the matrix looks like this:
//  - small layouts (small_cnn, odd_sizes, tiny_many) are cheap, so every kind runs the full
//    cross product of weight decay on/off, decoupled/l2 (SGD kinds), constant/scheduled lr and
//    loss scales 1, 2^16, 2^24, with the injection site rotating over first/middle/last/all;
//  - resnet50 and bert_base cost seconds per step on two cores, so every kind runs one cell on
//    each, chosen so the two cells together still cover both weight-decay modes, both lr kinds,
//    two loss scales and every injection site;
//  - one 1000-step drift run per kind (small_cnn) bounds the accumulated float32 error;
//  - gradient-norm clipping is an axis of the small tier only (two cells per kind and layout,
//    appended after the others so that no earlier cell's inputs change): clip_active, whose
//    max_grad_norm of 1 is far below every step's ‖ĝ‖ (about 24 to 115 here), and clip_idle,
//    whose 1e6 is never reached (coefficient 1: the same bits as no clipping, through the
//    clipping graph). The big tier's oracle samples tensors, which a global norm cannot use;
//  - the feature axes (hyperparameter groups, the tensor mask, the gradient table, simulated
//    ranks) run on a diagonal of the small tier, not its full product, appended after every other
//    cell of a (kind, layout) so that no earlier cell's inputs change: on small_cnn every kind
//    case (both weight-decay modes where the kind has them) with 3 groups, and with the mask and
//    2 groups (clipping on every other kind); every kind with 3 simulated ranks and 2 groups, its
//    precision rotating over fp32, bf16 and fp16 (model-dtype gradients); sgd_momentum's L2
//    dampening with clipping, with and without the mask; on odd_sizes (empty and scalar tensors)
//    every kind with the mask, the gradient table and 2 groups, precision rotating; on tiny_many
//    every kind with the gradient table and 3 groups;
//  - muon has no simulated-ranks cell (recorded before Muon had a sharded step; one would be
//    appended with its own goldens). Two muon cells close the small tier: the auxiliary AdamW's
//    weight decay (aux_wd) and a layout with two tensors marked "adamw" (small_cnn_marked).
//    Muon's big and drift cells come after every other kind's of their tier (muon is the last
//    kind, so no earlier cell moves): two on resnet50 in exact mode (bert_base's 30522 x 768
//    word embedding would be a Muon matrix, its exact Newton–Schulz far too slow for two cores),
//    fp32 with all three skipped steps, and a bf16 stochastic model copy through the clipping
//    graph with clip_idle (a sampled oracle cannot form the global norm an active clip needs,
//    and idle clipping's coefficient 1 is the same on every tensor); and a 1000-step drift run.
#include "audit/matrix.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <utility>
#include <stdexcept>

#include "audit/audit_cells.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/layout.h"
#include "renaissance/math/synthetic_gradient.h"
#include "renaissance/name_table.h"

namespace renaissance {
namespace conformance {

namespace {

constexpr NameRow<Site> kSites[] = {{Site::kFirst, "first"}, {Site::kMiddle, "middle"}, {Site::kLast, "last"}};
static_assert(rows_in_enum_order(kSites), "kSites: one row per enumerator, in enum order");
constexpr NameRow<Tier> kTiers[] = {{Tier::kSmall, "small"}, {Tier::kBig, "big"}, {Tier::kDrift, "drift"}};
static_assert(rows_in_enum_order(kTiers), "kTiers: one row per enumerator, in enum order");

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// max_grad_norm of the clipping cells (see the top of the file).
constexpr double kClipActive = 1.0;
constexpr double kClipIdle = 1e6;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Scheduled lr factors: warm-up, decay, a zero (a legal lr) and a tail. Literals rather than a
// cosine, so no libm result (which may differ in the last bit between machines) enters inputs
// that golden fingerprints depend on.
constexpr double kLrFactor[] = {0.25, 0.5, 1.0, 0.9, 0.75, 0.5, 0.0, 0.3, 0.2, 0.1};
// The dampening of the sgd_momentum cells that have it.
constexpr double kDampening = 0.3;
// The auxiliary AdamW's weight decay of the muon cell that has it (with aux_lr 3e-4: a decay of
// 3e-5 per step, hundreds of times the bound; with Muon's lr 0.02 it would be 2e-3).
constexpr double kAuxWeightDecay = 0.1;
constexpr int kNumLrFactors = sizeof(kLrFactor) / sizeof(kLrFactor[0]);

// Hyperparameters of the short runs (those of tests/support/optimizer_cases.h): weight decay large
// enough that applying it to the wrong group or in the wrong mode moves weights by far more than
// the bound, learning rates small enough that no weight crosses zero in 10 steps. (No cell
// reaches LARS's trust-ratio clamp: that needs ‖ĝ‖ < 1e-3*‖w‖ here; tests/runtime/test_oracle.cc has
// the tensors that do.)
OptimizerConfig short_config(OptimizerKind kind, bool wd_on, WeightDecayMode mode) {
  OptimizerConfig c = reference_config(kind);  // kKindTable's `reference` column
  c.weight_decay_mode = mode;
  if (!wd_on) c.weight_decay = 0.0;
  c.validate();
  return c;
}

// The drift runs use learning rates small enough that over 1000 steps no weight travels more
// than about half of its initial magnitude (|w0| >= 1): a weight that reached zero would make
// the relative error measure cancellation, not drift. Momentum multiplies the step by
// 1/(1-b) = 10, hence the smaller lr there. What remains is systematic: 1 - lr*wd is rounded to
// float once and applied 1000 times (sgd: 1 - 2.5e-5, whose float is off by up to 3e-8 relative),
// so decoupled decay alone contributes ~1000 * 3e-8 = 3e-5 to W; measured 2.9e-5 for sgd, 1.4e-5
// for adamw, against the 1e-4 bound. The learning rates are kKindTable's `drift_lr` column.
const char* scale_name(double s) {
  if (s == 1.0) return "scale_1";
  if (s == 65536.0) return "scale_2p16";
  if (s == 16777216.0) return "scale_2p24";
  return "scale_other";
}

// Injections by site pattern: 0 first, 1 middle, 2 last, 3 all three. Single injections leave
// 7 applied steps in 8; "last" poisons the final step, so the final state must be exactly the
// state after step 6. "all" skips the very first step too, so Adam's t must start at 1 on step 1.
std::vector<Injection> injections_for(int pattern, int* steps) {
  switch (pattern) {
    case 0: *steps = 8; return {{1, Site::kFirst, kNaN}};
    case 1: *steps = 8; return {{3, Site::kMiddle, kInf}};
    case 2: *steps = 8; return {{7, Site::kLast, -kInf}};
    default: *steps = 10; return {{0, Site::kFirst, kNaN}, {4, Site::kMiddle, kInf}, {9, Site::kLast, -kInf}};
  }
}
const char* pattern_name(int pattern) {
  static const char* names[] = {"nan_first", "nan_middle", "nan_last", "nan_all"};
  return names[pattern];
}

Cell make_cell(Tier tier, OptimizerKind kind, const std::string& layout, bool wd_on, WeightDecayMode mode,
               bool sched, double scale, int pattern) {
  Cell c;
  c.tier = tier;
  c.layout = layout;
  c.config = short_config(kind, wd_on, mode);
  c.weight_decay_on = wd_on;
  c.scheduled_lr = sched;
  c.loss_scale = scale;
  c.injections = injections_for(pattern, &c.steps);
  c.name = std::string(optimizer_kind_name(kind)) + "." + layout + (wd_on ? ".wd_on" : ".wd_off");
  if (kind_info(kind).allows_l2) c.name += mode == WeightDecayMode::kL2 ? ".l2" : ".decoupled";
  c.name += std::string(sched ? ".sched" : ".const") + "." + scale_name(scale) + "." + pattern_name(pattern);
  return c;
}

uint64_t element_hash(uint64_t salt, uint64_t step, uint64_t tensor, uint64_t i) {
  return math::mix64(math::mix64(math::mix64(salt + step) + tensor) + i);
}

// Cells that would repeat another cell's computation under another name, and so would record
// a duplicate fingerprint. Without weight decay, AdamW is Adam, and an SGD
// kind's L2 and decoupled modes are the same update (ĝ + 0*w; w*(1 - 0)); and in the small
// layouts the loss scales (1, 2^16, 2^24) are powers of two, so g*scale and g*(1/scale) are
// exact and the scale does not change a bit. So: drop AdamW's wd_off cells (Adam's run the same
// bits), and an SGD kind's wd_off L2 cell when a wd_off decoupled cell of the same kind and
// layout has the same lr schedule and injection pattern (`twin_exists`). The L2 cells with no
// such twin stay. conformance/REPORT.md says the same.
bool same_computation_as_another_cell(OptimizerKind kind, bool wd_on, WeightDecayMode mode, bool twin_exists) {
  if (wd_on) return false;
  if (kind == OptimizerKind::kAdamW) return true;
  return mode == WeightDecayMode::kL2 && twin_exists;
}

// " precision=bf16:stochastic:seed=N", or nothing for fp32 (fp32 specs carry no precision field).
std::string precision_spec(const PrecisionOptions& p) {
  if (p.precision == Precision::kFp32) return "";
  return std::string(" precision=") + precision_name(p.precision) + ":" + rounding_name(p.rounding) +
         ":seed=" + std::to_string(p.seed) + (p.model_dtype_gradients ? ":grad=model" : "");
}

// Group h's configuration as a cell's spec prints it: every kind table column shifted, the ones
// the kind does not read too (the recorded specs hold them; those never changed a bit). A Task
// runs shifted_group_config, which keeps the unread ones at base's.
OptimizerConfig spec_group_config(const OptimizerConfig& base, int h) {
  OptimizerConfig c = base;
  if (h == 0) return c;
  c.lr = base.lr * (1.0 + 0.5 * h);
  c.weight_decay = base.weight_decay * (1.0 + h);
  if (base.momentum > 0.0) c.momentum = base.momentum - 0.1 * h;
  c.beta1 = base.beta1 - 0.05 * h;
  c.beta2 = base.beta2 - 0.004 * h;
  c.eps = base.eps * (1.0 + h);
  c.trust_coefficient = base.trust_coefficient * (1.0 + h);
  return c;
}

// The feature axes in a spec, each only when on (so every other cell's spec is unchanged).
std::string feature_spec(const Cell& c) {
  std::string s;
  if (c.hyper_groups > 1) {
    s += " groups=" + std::to_string(c.hyper_groups) + ":round_robin";
    for (int h = 1; h < c.hyper_groups; ++h) s += " group" + std::to_string(h) + "=" + config_spec(spec_group_config(c.config, h));
  }
  if (c.tensor_mask) s += " mask=pattern/1:nan_grads";
  if (c.gradient_table) s += " grad_table=two_donors/1";
  if (c.simulated_ranks > 0) s += " ranks=" + std::to_string(c.simulated_ranks) + ":ordered_sum";
  return s;
}

// Precision p of the feature-axis diagonal: 0 fp32, 1 bf16 nearest, 2 fp16 stochastic, both with
// model-dtype gradients (fp16 at the loss scale 2^10, as the precision axis's fp16 cells).
void rotate_precision(Cell* c, int p) {
  if (p % 3 == 0) return;
  const Precision prec = p % 3 == 1 ? Precision::kBf16 : Precision::kFp16;
  const Rounding rounding = p % 3 == 1 ? Rounding::kNearest : Rounding::kStochastic;
  c->precision = {prec, rounding, kSyntheticSeed};
  c->precision.model_dtype_gradients = true;
  c->name += std::string(".") + precision_name(prec) + "." + rounding_name(rounding) + ".grad_model";
  if (prec == Precision::kFp16) {
    c->loss_scale = 1024.0;
    const size_t at = c->name.find("scale_2p16");
    if (at != std::string::npos) c->name.replace(at, 10, "scale_2p10");
  }
}

// Appends the feature-axis cells of (kind, layout) (see the top of the file); `pattern` is the
// (kind, layout)'s injection rotation, continued.
void append_feature_cells(Tier tier, OptimizerKind kind, const std::string& layout,
                          const std::vector<WeightDecayMode>& modes, int* pattern, std::vector<Cell>* out) {
  const int k = static_cast<int>(kind);
  auto base = [&](WeightDecayMode mode) {
    return make_cell(tier, kind, layout, true, mode, true, 65536.0, (*pattern)++ % 4);
  };
  if (layout == "small_cnn") {
    for (WeightDecayMode mode : modes) {
      Cell c = base(mode);
      c.hyper_groups = 3;
      c.name += ".groups3";
      out->push_back(c);
    }
    for (WeightDecayMode mode : modes) {
      Cell c = base(mode);
      c.tensor_mask = true;
      c.hyper_groups = 2;
      c.name += ".mask.groups2";
      if (k % 2 == 1) {
        c.config.max_grad_norm = kClipActive;
        c.name += ".clip_active";
      }
      c.config.validate();
      out->push_back(c);
    }
    // No simulated-ranks cell for Muon: the matrix was recorded before Muon had a sharded step,
    // and a cell placed here would move every later cell (new cells are appended).
    if (kind != OptimizerKind::kMuon) {
      Cell c = base(WeightDecayMode::kDecoupled);
      c.simulated_ranks = 3;
      c.hyper_groups = 2;
      c.backend_gradients = true;
      c.name += ".ranks3.groups2";
      rotate_precision(&c, k);
      out->push_back(c);
    }
    if (kind == OptimizerKind::kSgdMomentum) {
      for (bool mask : {false, true}) {
        Cell c = base(WeightDecayMode::kL2);
        c.config.dampening = kDampening;
        c.config.max_grad_norm = kClipActive;
        c.config.validate();
        c.tensor_mask = mask;
        c.name += std::string(".dampening.clip_active") + (mask ? ".mask" : "");
        out->push_back(c);
      }
    }
  } else if (layout == "odd_sizes") {
    Cell c = base(WeightDecayMode::kDecoupled);
    c.tensor_mask = true;
    c.gradient_table = true;
    c.hyper_groups = 2;
    c.name += ".mask.grad_table.groups2";
    rotate_precision(&c, k + 1);
    out->push_back(c);
  } else if (layout == "tiny_many") {
    Cell c = base(WeightDecayMode::kDecoupled);
    c.gradient_table = true;
    c.hyper_groups = 3;
    c.name += ".grad_table.groups3";
    out->push_back(c);
  }
}

}  // namespace

const char* site_name(Site site) { return name_of(kSites, site, "?"); }
const char* tier_name(Tier tier) { return name_of(kTiers, tier, "?"); }

double Cell::lr_at(int s) const {
  if (!scheduled_lr) return config.lr;
  return config.lr * kLrFactor[s % kNumLrFactors];
}

OptimizerConfig shifted_group_config(const OptimizerConfig& base, int h) {
  OptimizerConfig c = spec_group_config(base, h);
  // Only the columns the kind reads: a configuration refuses another value of one it does not.
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.kind_column != nullptr && !kind_reads(base.kind, row)) c.*row.number = base.*row.number;
  }
  return c;
}

OptimizerConfig Cell::group_config(int h) const { return shifted_group_config(config, h); }

double Cell::lr_at(int s, int h) const {
  const double base = group_config(h).lr;
  return scheduled_lr ? base * kLrFactor[s % kNumLrFactors] : base;
}

// Every tensor is masked at some steps and taken at others; step 5 (never an injection step)
// masks every tensor, and the tensors an injection poisons stay unmasked at its step.
bool Cell::mask_at(size_t id, int s, const std::vector<size_t>& site_ids) const {
  if (!tensor_mask) return false;
  for (size_t site : site_ids) {
    if (site == id) return false;
  }
  if (s == 5) return true;
  return (id * 5 + static_cast<size_t>(s) * 3) % 4 == 0;
}

std::vector<ParamSpec> cell_params(const Cell& cell) {
  std::vector<ParamSpec> p = conformance_layout(cell.layout);
  if (cell.hyper_groups > 1) {
    for (size_t i = 0; i < p.size(); ++i) p[i].hyper_group = static_cast<int>(i % static_cast<size_t>(cell.hyper_groups));
  }
  return p;
}

std::string Cell::spec() const {
  std::string inj;
  for (const Injection& i : injections) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%d:%s:%s,", i.step, site_name(i.site),
                  std::isnan(i.value) ? "nan" : (i.value > 0 ? "+inf" : "-inf"));
    inj += buf;
  }
  char buf[128];
  std::snprintf(buf, sizeof(buf), " lr_schedule=%s scale=%.17g steps=%d inject=", scheduled_lr ? "table1" : "constant",
                loss_scale, steps);
  return std::string("conformance/1 inputs=") +
         (backend_gradients ? "w:signed-hash/1,g:backend-synthetic/1:seed=" + std::to_string(kSyntheticSeed)
                            : std::string("signed-hash/1")) +
         " layout=" + layout + ":" + layout_digest(conformance_layout(layout)) + " " +
         config_spec(config) + buf + inj + precision_spec(precision) + feature_spec(*this);
}

std::vector<ParamSpec> small_cnn_stem() {
  return {
      {"conv1.weight", {16, 3, 3, 3}, Role::kFirstConv},
      {"bn1.weight", {16}, Role::kBnWeight},
      {"bn1.bias", {16}, Role::kBnBias},
      {"layer1.conv.weight", {32, 16, 3, 3}, Role::kDeepConv},
      {"layer1.bn.weight", {32}, Role::kBnWeight},
      {"layer1.bn.bias", {32}, Role::kBnBias},
      {"layer2.conv.weight", {64, 32, 3, 3}, Role::kDeepConv},
  };
}

std::vector<ParamSpec> conformance_layout(const std::string& name) {
  if (name == "small_cnn") {
    // Every role; two deep convs longer than one LARS tile (4096), so multi-tile norms count.
    std::vector<ParamSpec> p = small_cnn_stem();
    p.insert(p.end(), {
                          {"layer2.downsample.weight", {64, 32, 1, 1}, Role::kDeepConv},
                          {"layer2.bn.weight", {64}, Role::kBnWeight},
                          {"layer2.bn.bias", {64}, Role::kBnBias},
                          {"fc.weight", {10, 64}, Role::kFcWeight},
                          {"fc.bias", {10}, Role::kFcBias},
                      });
    return p;
  }
  if (name == "odd_sizes") {
    // Sizes around vector widths (1, 3, 7, 15, 16, 17, 63, 65), around a LARS tile (4097) and a
    // multiple of it plus one (12289), zero-size tensors first, in the middle and last (in both
    // groups), and a scalar (empty shape). Round robin over the roles, then again shifted by
    // three so every size meets both groups.
    const std::vector<int64_t> sizes = {0, 1, 3, 7, 15, 16, 17, 63, 65, 1023, 4097, 0, 12289};
    std::vector<ParamSpec> p;
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < sizes.size(); ++i) {
        p.push_back({"p" + std::to_string(pass) + "_" + std::to_string(i), {sizes[i]},
                     static_cast<Role>((i + 3 * pass) % kNumRoles)});
      }
    }
    p.push_back({"scalar", {}, Role::kBnWeight});
    p.push_back({"empty_matrix", {7, 0}, Role::kFcWeight});
    p.push_back({"empty_last", {0}, Role::kDeepConv});
    return p;
  }
  if (name == "tiny_many") {
    // Hundreds of 1..9-element tensors (per-channel scalars, LayerNorm gains of tiny models):
    // per-tensor bookkeeping (offsets, LARS tiles and ratios) dominates here, not bandwidth.
    std::vector<ParamSpec> p;
    for (int i = 0; i < 320; ++i) {
      p.push_back({"t" + std::to_string(i), {1 + (i * 7) % 9}, static_cast<Role>(i % kNumRoles)});
    }
    return p;
  }
  if (name == "small_cnn_marked") {
    // small_cnn with its stem conv and its head marked "adamw" (ParamSpec::optimizer): a muon
    // task steps them with the auxiliary AdamW, as the embeddings and heads of a transformer.
    std::vector<ParamSpec> p = conformance_layout("small_cnn");
    for (ParamSpec& t : p) {
      if (t.name == "conv1.weight" || t.name == "fc.weight") t.optimizer = ParamOptimizer::kAdamW;
    }
    return p;
  }
  if (name == "resnet50" || name == "bert_base") return builtin_layout(name).params;
  throw std::invalid_argument("unknown conformance layout " + name);
}

std::vector<Cell> cells(Tier tier) {
  std::vector<Cell> out;
  for (int k = 0; k < kNumOptimizerKinds; ++k) {
    const OptimizerKind kind = static_cast<OptimizerKind>(k);
    const std::vector<WeightDecayMode> modes =
        kind_info(kind).allows_l2 ? std::vector<WeightDecayMode>{WeightDecayMode::kDecoupled, WeightDecayMode::kL2}
                            : std::vector<WeightDecayMode>{WeightDecayMode::kDecoupled};
    if (tier == Tier::kSmall) {
      for (const char* layout : {"small_cnn", "odd_sizes", "tiny_many"}) {
        int pattern = 0;  // rotates per (kind, layout), so each combination meets every site
        std::set<std::pair<bool, int>> wd_off_runs;  // (scheduled lr, injection pattern) of wd_off decoupled cells
        for (bool wd_on : {true, false}) {
          for (WeightDecayMode mode : modes) {
            for (bool sched : {false, true}) {
              for (double scale : {1.0, 65536.0, 16777216.0}) {
                const int p = pattern++ % 4;  // counted for skipped cells too: the kept ones keep their inputs
                if (!wd_on && mode == WeightDecayMode::kDecoupled) wd_off_runs.insert({sched, p});
                if (same_computation_as_another_cell(kind, wd_on, mode, wd_off_runs.count({sched, p}) > 0)) continue;
                out.push_back(make_cell(tier, kind, layout, wd_on, mode, sched, scale, p));
              }
            }
          }
        }
        for (const auto& clip : {std::make_pair("clip_active", kClipActive), std::make_pair("clip_idle", kClipIdle)}) {
          Cell c = make_cell(tier, kind, layout, true, WeightDecayMode::kDecoupled, true, 65536.0, pattern++ % 4);
          c.config.max_grad_norm = clip.second;
          c.config.validate();
          c.name += std::string(".") + clip.first;
          out.push_back(c);
        }
        // The precision axis, small tier only: every kind x {bf16, fp16} x
        // {nearest, stochastic} on the two layouts of awkward sizes and multi-tile tensors,
        // with an lr schedule, loss scale and a skipped step.
        if (std::string(layout) != "tiny_many") {
          for (Precision prec : {Precision::kBf16, Precision::kFp16}) {
            for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
              Cell c = make_cell(tier, kind, layout, true, WeightDecayMode::kDecoupled, true, 65536.0, pattern++ % 4);
              c.precision = {prec, rounding, kSyntheticSeed};
              c.name += std::string(".") + precision_name(prec) + "." + rounding_name(rounding);
              out.push_back(c);
              // The same cell with gradients in the model dtype (the same inputs rounded to
              // nearest even; no pattern of its own, so the cells after it keep theirs).
              c.precision.model_dtype_gradients = true;
              c.name += ".grad_model";
              // fp16 gradients of up to 65536 would be inf (every step skipped): the loss scale
              // an AMP run would have backed off to, still a power of two (exact unscaling).
              if (prec == Precision::kFp16) {
                c.loss_scale = 1024.0;
                const size_t at = c.name.find("scale_2p16");
                if (at != std::string::npos) c.name.replace(at, 10, "scale_2p10");
              }
              out.push_back(c);
            }
          }
        }
        // torch's SGD dampening (sgd_momentum only: Nesterov refuses it), in both weight-decay
        // modes, appended last so that no earlier cell's pattern moves; the injection patterns
        // include a skipped first step, after which the first applied step is still undamped.
        if (kind == OptimizerKind::kSgdMomentum) {
          for (WeightDecayMode mode : modes) {
            Cell c = make_cell(tier, kind, layout, true, mode, true, 65536.0, pattern++ % 4);
            c.config.dampening = kDampening;
            c.config.validate();
            c.name += ".dampening";
            out.push_back(c);
          }
        }
        // torch's amsgrad (adam and adamw: the VMAX family), appended last for the same reason:
        // fp32 on every layout, and a bf16 model copy (nearest) on small_cnn.
        if (kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW) {
          Cell c = make_cell(tier, kind, layout, true, WeightDecayMode::kDecoupled, true, 65536.0, pattern++ % 4);
          c.config.amsgrad = true;
          c.config.validate();
          c.name += ".amsgrad";
          out.push_back(c);
          if (std::string(layout) == "small_cnn") {
            Cell b = make_cell(tier, kind, layout, true, WeightDecayMode::kDecoupled, true, 65536.0, pattern++ % 4);
            b.config.amsgrad = true;
            b.config.validate();
            b.precision = {Precision::kBf16, Rounding::kNearest, kSyntheticSeed};
            b.name += ".bf16.nearest.amsgrad";
            out.push_back(b);
          }
        }
        append_feature_cells(tier, kind, layout, modes, &pattern, &out);
      }
    } else if (tier == Tier::kBig) {
      Cell r = make_cell(tier, kind, "resnet50", true, WeightDecayMode::kDecoupled, true, 65536.0, 3);
      r.oracle_stride = 4;
      r.backend_gradients = true;
      out.push_back(r);
      Cell b;
      if (kind == OptimizerKind::kMuon) {
        // Muon's second big cell is on resnet50 too (see the top of the file): exact mode, a bf16
        // stochastic model copy through the clipping graph at clip_idle.
        b = make_cell(tier, kind, "resnet50", true, WeightDecayMode::kDecoupled, false, 65536.0, 1);
        b.oracle_stride = 4;
        b.precision = {Precision::kBf16, Rounding::kStochastic, kSyntheticSeed};
        b.config.max_grad_norm = kClipIdle;
        b.config.validate();
        b.name += ".bf16.stochastic.clip_idle";
      } else {
        b = make_cell(tier, kind, "bert_base", true,
                      kind_info(kind).allows_l2 ? WeightDecayMode::kL2 : WeightDecayMode::kDecoupled, false, 16777216.0, 1);
        b.oracle_stride = 8;
      }
      b.backend_gradients = true;
      out.push_back(b);
    } else {
      Cell d = make_cell(tier, kind, "small_cnn", true, WeightDecayMode::kDecoupled, false, 65536.0, 3);
      d.config.lr = kind_info(kind).drift_lr;
      d.steps = 1003;  // 1000 applied
      d.injections = {{250, Site::kFirst, kNaN}, {500, Site::kMiddle, kInf}, {1002, Site::kLast, -kInf}};
      d.bound = 1e-4;
      d.name = std::string(optimizer_kind_name(kind)) + ".drift1000.small_cnn";
      out.push_back(d);
    }
  }
  if (tier == Tier::kSmall) {
    // Muon's auxiliary AdamW, appended after every other cell so that none of their inputs
    // change: its decoupled weight decay (aux_weight_decay, with aux_lr, on the bias-like group),
    // and the layout marks (small_cnn_marked: two weight-role tensors stepped by that AdamW).
    Cell wd = make_cell(tier, OptimizerKind::kMuon, "small_cnn", true, WeightDecayMode::kDecoupled, true, 65536.0, 1);
    wd.config.aux_weight_decay = kAuxWeightDecay;
    wd.config.validate();
    wd.name += ".aux_wd";
    out.push_back(wd);
    out.push_back(make_cell(tier, OptimizerKind::kMuon, "small_cnn_marked", true, WeightDecayMode::kDecoupled, true,
                            65536.0, 2));
  }
  return out;
}

std::vector<Cell> all_cells() {
  std::vector<Cell> out;
  for (Tier t : {Tier::kSmall, Tier::kBig, Tier::kDrift}) {
    for (Cell& c : cells(t)) out.push_back(std::move(c));
  }
  return out;
}

namespace {

// out[id][i] = value(id, i) for every element i of every tensor id (a large tensor in parallel:
// each element depends on its own indices only).
template <typename Value>
void fill_elements(const std::vector<ParamSpec>& params, std::vector<std::vector<float>>* out, Value value) {
  out->resize(params.size());
  for (size_t id = 0; id < params.size(); ++id) {
    const int64_t n = params[id].numel();
    std::vector<float>& x = (*out)[id];
    x.resize(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = value(id, static_cast<uint64_t>(i));
  }
}

}  // namespace

void make_weights(const std::vector<ParamSpec>& params, std::vector<std::vector<float>>* out) {
  fill_elements(params, out, [](size_t id, uint64_t u) {
    const double sign = (element_hash(0x5349474eULL, 0, id, u) >> 63) ? -1.0 : 1.0;
    const double unit = static_cast<double>(element_hash(0x57454947ULL, 0, id, u) >> 11) * 0x1p-53;
    return static_cast<float>(sign * (1.0 + unit));
  });
}

void make_grads(const std::vector<ParamSpec>& params, uint64_t step, double loss_scale,
                std::vector<std::vector<float>>* out) {
  fill_elements(params, out, [step, loss_scale](size_t id, uint64_t u) {
    const double sign = (element_hash(0x5349474eULL, 0, id, u) >> 63) ? -1.0 : 1.0;
    const double unit = static_cast<double>(element_hash(0x47524144ULL, step + 1, id, u) >> 11) * 0x1p-53;
    return static_cast<float>(sign * (0.1 + 0.9 * unit) * loss_scale);
  });
}

}  // namespace conformance
}  // namespace renaissance
