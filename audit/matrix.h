// The conformance matrix: which cells run (kind x layout x hyperparameters x non-finite
// injections), the layouts, and the deterministic inputs every backend and the float64 oracle
// receive. Everything here is a pure function of the code, so a cell's fingerprint recorded on a
// GPU is reproducible on any CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "renaissance/precision.h"

namespace renaissance {
namespace conformance {

// Where a non-finite gradient element is written, in arena order of the non-empty G tensors:
// the first element of the first tensor, the middle element of the middle tensor, the very last
// element of the last tensor (the last G element before the padding: a check that stops one
// vector short of the region's end misses it).
enum class Site { kFirst, kMiddle, kLast };
const char* site_name(Site site);

struct Injection {
  int step;     // 0-based step of the run
  Site site;
  float value;  // NaN, +Inf or -Inf
};

enum class Tier { kSmall, kBig, kDrift };

constexpr uint64_t kSyntheticSeed = 20250101;

struct Cell {
  std::string name;  // dotted, e.g. "adamw.small_cnn.wd_on.sched.scale_2p16.nan_middle"
  Tier tier = Tier::kSmall;
  std::string layout;  // small_cnn, odd_sizes, tiny_many, resnet50, bert_base
  OptimizerConfig config;
  bool weight_decay_on = false;
  bool scheduled_lr = false;
  double loss_scale = 1.0;
  int steps = 0;  // steps run, skipped ones included (applied = steps - injections)
  std::vector<Injection> injections;
  // A ceiling for the report only: each oracle check's bound is 3x the error of an honest
  // float32 implementation on the same inputs (tests/support/oracle_f32.h, conformance/runner.cc).
  double bound = 1e-6;
  // 0: the oracle follows every tensor. k > 0: every k-th tensor (in id order) of at most 4 M
  // elements, plus the
  // injection sites, because the float64 oracle of all of bert_base would not fit the budget.
  int oracle_stride = 0;
  // Gradients from Task::synthesize_gradients(kSyntheticSeed, step, loss_scale) on each backend
  // (uniform in [-1, 1) times the scale, signs independent of the weights) instead of host-made
  // ones. Used for resnet50 and bert_base, where generating and copying 110 M host values per
  // step would dominate the suite; it also puts the backends' own generators under the bitwise
  // comparison. Independent signs allow cancellation in single elements, but these layouts have
  // no tensor below 64 elements, so the per-tensor L2 error stays far below the bound.
  bool backend_gradients = false;
  // A bf16/fp16 model copy: the fingerprint then covers the copy too. fp32 cells
  // leave it out of spec(), so their recorded specs are unchanged.
  PrecisionOptions precision;
  // The feature axes (small tier only, on a diagonal: see matrix.cc). Each is left out of spec()
  // while off, so the specs of the cells without them are unchanged.
  // H hyperparameter groups: tensor i in group i % H, group h's configuration group_config(h).
  int hyper_groups = 1;
  // TaskOptions::tensor_mask with the pattern mask_at(): a masked tensor's G holds NaN (never read).
  bool tensor_mask = false;
  // TaskOptions::gradient_table: the step reads every gradient through the table, from the G of
  // one of two donor tasks (alternating per step and tensor); the arena's own G holds NaN.
  bool gradient_table = false;
  // > 0: G is the rank-order sum of this many ranks' backend-synthesized gradients divided by the
  // count (synthesize_rank_sum, `renaissance run --simulate-ranks K`), the input of an ordered
  // K-rank sharded step, whose bits the distributed tests equate with this one-device step.
  int simulated_ranks = 0;

  // Everything the fingerprint depends on, in one canonical line (stored in the golden file).
  std::string spec() const;
  // The learning rate of step s (host double; the library rounds it to float once).
  double lr_at(int s) const;
  // Hyperparameter group h's configuration (group 0: config) and its learning rate at step s.
  OptimizerConfig group_config(int h) const;
  double lr_at(int s, int h) const;
  // Whether tensor id is masked at step s (tensor_mask cells only; false otherwise). `site_ids`:
  // the tensors the step's injections poison, which stay unmasked so the step is still skipped.
  bool mask_at(size_t id, int s, const std::vector<size_t>& site_ids) const;
  bool has_feature_axes() const { return hyper_groups > 1 || tensor_mask || gradient_table || simulated_ranks > 0; }

};

std::vector<ParamSpec> conformance_layout(const std::string& name);
// Hyperparameter group h's configuration: every scalar a kind reads moved away from group 0's
// (h = 0: `base` itself), so that a tensor reading another group's block shows in the bits. The
// feature-axis cells and the unit tests' group cases share it.
OptimizerConfig shifted_group_config(const OptimizerConfig& base, int h);
// The cell's parameters: its layout with each tensor's hyperparameter group (i % hyper_groups).
std::vector<ParamSpec> cell_params(const Cell& cell);
// The first seven tensors of a small CNN (a first conv, two deep convs, their batch norms): the
// start of both the conformance layout small_cnn and the audit's layout.
std::vector<ParamSpec> small_cnn_stem();
// All cells of one tier, in a fixed order.
std::vector<Cell> cells(Tier tier);
std::vector<Cell> all_cells();
const char* tier_name(Tier tier);

// Inputs. Every element has a sign fixed for the whole run and shared by its weight and all its
// gradients: with sign(w) = sign(g), no update subtracts nearly equal numbers (m = b*m + g,
// g + wd*w and w - lr*m all combine terms of one sign while |w| stays away from 0), so float32
// rounding stays at a few ulps per operation and the 1e-6 bound is not at the mercy of
// cancellation in one-element tensors (tests/support/optimizer_cases.h explains the same choice). The
// hash is cheaper than that file's, because bert_base needs 110 M values per step.
// Initial weight: sign * [1, 2).
void make_weights(const std::vector<ParamSpec>& params, std::vector<std::vector<float>>* out);
// Gradient as the backward pass stores it: sign * [0.1, 1) * loss_scale, rounded once.
void make_grads(const std::vector<ParamSpec>& params, uint64_t step, double loss_scale,
                std::vector<std::vector<float>>* out);

}  // namespace conformance
}  // namespace renaissance
