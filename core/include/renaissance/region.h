// Parameter roles, buffer families and the Region enum that names every span of the arena.
// The order of the enumerators is part of the design: within every family the three bias-like
// roles come first and the three weight roles after them, so each group is one contiguous span.
#pragma once

#include <cstdint>

namespace renaissance {

// The six parameter roles. Bias-like roles are never weight-decayed nor trust-ratio-adapted.
enum class Role : int {
  kBnBias = 0,
  kBnWeight = 1,
  kFcBias = 2,
  kFcWeight = 3,
  kFirstConv = 4,
  kDeepConv = 5,
};
constexpr int kNumRoles = 6;

// The two behaviours a role maps to. Each is updated by one kernel over one contiguous span.
enum class Group : int { kBiasLike = 0, kWeight = 1 };

constexpr Group group_of(Role role) {
  return static_cast<int>(role) < static_cast<int>(Role::kFcWeight) ? Group::kBiasLike
                                                                      : Group::kWeight;
}

// Buffer families: one per kind of per-element buffer. Every family is one row of
// kFamilyTable below and one entry of RN_FAMILIES (its six role regions in the Region enum).
enum class Family : int {
  kW = 0,  // fp32 master weights
  kG = 1,  // gradients (as the backward pass wrote them, i.e. multiplied by the loss scale)
  kM = 2,  // first moment / momentum
  kV = 3,  // second moment (Adam kinds)
  kN = 4,  // per-tensor trust ratios of the norm kinds: one float per tensor, not per element
  // The running maximum of V (torch's max_exp_avg_sq): Adam/AdamW with amsgrad only. Laid out
  // exactly as V (same role regions, same slice in a sharded plan).
  kVmax = 5,
};
constexpr int kNumFamilies = 6;

// The families in Family order, as the prefixes of their region names (W_BN_BIAS, ...).
#define RN_FAMILIES(X) X(W) X(G) X(M) X(V) X(N) X(VMAX)

// How many elements a family holds per tensor.
enum class FamilyExtent : int {
  kPerElement = 0,  // one per parameter element, padded per role like W
  kPerTensor = 1,   // one per tensor, packed (N: a group's ratios are one array)
};

// When a plan holds a family (plan_config_from_optimizer reads it).
enum class FamilyNeed : int {
  kAlways = 0,    // every plan (W, G)
  kKindM = 1,     // the kind's has_m (kinds.h)
  kKindV = 2,     // the kind's has_v
  kNormPass = 3,  // the kind runs a norm pass (its norm is not NormPass::kNone)
  kAmsgrad = 4,   // OptimizerConfig::amsgrad (needs V)
};

// What the project needs to know of a family, in one row each.
struct FamilyInfo {
  Family family;
  const char* name;       // "W", ...: region-name prefix, Task::view's and the Python views' name
  uint32_t elem_bytes;    // bytes per element in the arena (G: of fp32 gradients; precision.h for others)
  FamilyExtent extent;
  FamilyNeed need;
  // Optimizer state: kept only for the state slice of a sharded rank (MemoryPlan::state_sliced),
  // read and written through the Task's state access, hashed by the fingerprint after W.
  bool optimizer_state;
  // The order of the families in the arena, in a checkpoint's sections and in the fingerprint
  // (each only for the families it holds): part of the byte layout of all three.
  int order;
  const char* checkpoint_tag;   // the file section's tag; nullptr: not in a checkpoint (G)
  // Per-element state a step updates (W and the optimizer state): hashed by Task::fingerprint,
  // compared and allowed to change by the conformance runner.
  bool step_state;
  const char* torch_state;      // torch's per-parameter state key; nullptr: not torch state
  // The key in a group whose M is a momentum buffer (KindInfo::torch_m); nullptr: not torch state
  // there (torch's momentum optimizers keep the buffer alone; muon's weight group leaves V unused).
  const char* torch_state_momentum;
};

inline constexpr FamilyInfo kFamilyTable[] = {
    // family       name    bytes  extent                    need                   state  order tag   step   torch, torch (momentum)
    {Family::kW,    "W",    4, FamilyExtent::kPerElement, FamilyNeed::kAlways,   false, 0, "FAMW", true,  nullptr, nullptr},
    {Family::kG,    "G",    4, FamilyExtent::kPerElement, FamilyNeed::kAlways,   false, 1, nullptr, false, nullptr, nullptr},
    {Family::kM,    "M",    4, FamilyExtent::kPerElement, FamilyNeed::kKindM,    true,  2, "FAMM", true,  "exp_avg", "momentum_buffer"},
    {Family::kV,    "V",    4, FamilyExtent::kPerElement, FamilyNeed::kKindV,    true,  3, "FAMV", true,  "exp_avg_sq", nullptr},
    {Family::kN,    "N",    4, FamilyExtent::kPerTensor,  FamilyNeed::kNormPass, false, 5, "FAMN", false, nullptr, nullptr},
    {Family::kVmax, "VMAX", 4, FamilyExtent::kPerElement, FamilyNeed::kAmsgrad,  true,  4, "FAMX", true,  "max_exp_avg_sq", nullptr},
};

constexpr const FamilyInfo& family_info(Family family) { return kFamilyTable[static_cast<int>(family)]; }

// The families in `order` (arena, checkpoint and fingerprint order).
struct FamilyOrder {
  Family at[kNumFamilies];
  constexpr const Family* begin() const { return at; }
  constexpr const Family* end() const { return at + kNumFamilies; }
};
constexpr FamilyOrder families_in_order() {
  FamilyOrder o{};
  for (int i = 0; i < kNumFamilies; ++i) o.at[kFamilyTable[i].order] = kFamilyTable[i].family;
  return o;
}
inline constexpr FamilyOrder kFamiliesInOrder = families_in_order();

constexpr bool family_table_is_consistent() {
  bool seen[kNumFamilies] = {};
  for (int i = 0; i < kNumFamilies; ++i) {
    const FamilyInfo& f = kFamilyTable[i];
    if (static_cast<int>(f.family) != i || f.order < 0 || f.order >= kNumFamilies || seen[f.order]) return false;
    seen[f.order] = true;
    if (f.optimizer_state && f.extent != FamilyExtent::kPerElement) return false;
  }
  // W and G come first in the arena: the plan places them before every state family.
  return kFamilyTable[0].order == 0 && kFamilyTable[1].order == 1;
}
constexpr bool same_text(const char* a, const char* b) {
  while (*a != 0 && *a == *b) ++a, ++b;
  return *a == *b;
}
#define RN_FAMILY_TEXT(F) #F,
inline constexpr const char* kFamilyRegionPrefixes[] = {RN_FAMILIES(RN_FAMILY_TEXT)};
#undef RN_FAMILY_TEXT
constexpr bool family_names_match_regions() {
  for (int i = 0; i < kNumFamilies; ++i) {
    if (!same_text(kFamilyTable[i].name, kFamilyRegionPrefixes[i])) return false;
  }
  return true;
}
static_assert(sizeof(kFamilyTable) / sizeof(kFamilyTable[0]) == kNumFamilies, "kFamilyTable needs one row per Family");
static_assert(sizeof(kFamilyRegionPrefixes) / sizeof(kFamilyRegionPrefixes[0]) == kNumFamilies &&
                  family_names_match_regions(),
              "RN_FAMILIES lists the kFamilyTable names in Family order");
static_assert(family_table_is_consistent(),
              "kFamilyTable: rows in Family order, each order used once, W then G first, optimizer state per element");

#define RN_FAMILY_REGIONS(F) \
  F##_BN_BIAS, F##_BN_WEIGHT, F##_FC_BIAS, F##_FC_WEIGHT, F##_FIRST_CONV, F##_DEEP_CONV
#define RN_FAMILY_REGIONS_X(F) RN_FAMILY_REGIONS(F),
enum Region : int {
  RN_FAMILIES(RN_FAMILY_REGIONS_X)
  S_SCALAR_FP32,   // hyperparameters and per-step float scalars (ScalarF32 slots)
  S_SCALAR_INT32,  // step count and the non-finite flag (ScalarI32 slots)
  S_SCALAR_FP64,   // hyperparameters the device needs in double (ScalarF64 slots)
  T_NORM_PARTIALS,  // norm pass scratch: math::kNormComponents doubles per tile
  T_NORM_TILES,     // norm tile table (NormTile per tile), written once at compile()
  T_NORM_TENSORS,   // per-tensor tile ranges (NormTensor per tensor of the normed group)
  T_GRAD_NORM_PARTIALS,  // clipping scratch: one double per grad-norm tile of G (norm_reduction.h)
  C_MODEL_COPY,  // the bf16/fp16 model copy (precision.h): 2 bytes per W element, W's layout
  // Only with H > 1 hyperparameter groups (plan.h), written once at compile():
  T_HYPER_ITEMS,    // HyperItem work items of the (role, group) runs: bias-like group, then weight
  T_TENSOR_BLOCKS,  // int32 scalar block per weight-group tensor (NormTile::tensor indexes it)
  // Only with TaskOptions::tensor_mask (plan.h): int32 mask[num_params] (caller-written: nonzero
  // skips the tensor), then int32 steps[num_params] (each tensor's applied steps, device-owned).
  S_TENSOR_INT32,
  // Only with TaskOptions::gradient_table (plan.h): uint64 address per parameter of its gradient
  // (numel elements in G's encoding, contiguous), read by the step on the device at run time.
  S_GRAD_TABLE,
  // Only with a model copy or a gradient table (plan.h, TableView), written once at compile():
  T_TENSOR_LIST,    // CopyTensor per tensor of each view, in span order
  T_TENSOR_CHUNKS,  // int32 chunk index of each view (model_copy_key.h's tensor_chunks)
  // Only with a gradient table: uint64 chunk addresses of each view (GradTableRef::chunk_at),
  // written by the CUDA backend at the start of every step; the CPU backend never reads them.
  T_GRAD_CHUNKS,
  // Only with muon (PlanConfig::muon), after every other region (other kinds' plans keep their
  // bytes): the update U of the weight group (fp32, the weight group span's layout: element j of
  // U pairs with element j of the weight group's W span; a step's working value, never state: the
  // CPU leaves the orthogonalised update there; CUDA, where every shape class runs batched,
  // applies it as it leaves the scratch and leaves MUON_MOMENTUM's value), the matrix table
  // (MuonMatrix per weight-group tensor, written once at compile()) and the Newton–Schulz scratch
  // (fp32, muon_scratch_floats of the largest matrix).
  T_MUON_UPDATE,
  T_MUON_MATRICES,
  T_MUON_SCRATCH,
  kNumRegions
};
#undef RN_FAMILY_REGIONS_X
#undef RN_FAMILY_REGIONS

constexpr Region family_region(Family family, Role role) {
  return static_cast<Region>(static_cast<int>(family) * kNumRoles + static_cast<int>(role));
}
constexpr Family family_of(Region region) { return static_cast<Family>(region / kNumRoles); }
constexpr Role role_of(Region region) { return static_cast<Role>(region % kNumRoles); }
constexpr bool is_family_region(Region region) { return region < S_SCALAR_FP32; }

// The layout promises that make `region_range` spans contiguous.
static_assert(W_BN_WEIGHT == W_BN_BIAS + 1 && W_FC_BIAS == W_BN_WEIGHT + 1,
              "bias-like roles must be consecutive");
static_assert(W_FIRST_CONV == W_FC_WEIGHT + 1 && W_DEEP_CONV == W_FIRST_CONV + 1,
              "weight roles must be consecutive");
static_assert(G_BN_BIAS == W_DEEP_CONV + 1 && kNumFamilies * kNumRoles == S_SCALAR_FP32,
              "families are laid out one after another with the roles in the same order");
static_assert(family_region(Family::kM, Role::kFcWeight) == M_FC_WEIGHT, "family arithmetic");
static_assert(group_of(Role::kFcBias) == Group::kBiasLike && group_of(Role::kFcWeight) == Group::kWeight,
              "bias-like roles precede weight roles");

const char* role_name(Role role);       // "bn_bias", ...
bool parse_role(const char* text, Role* out);
constexpr const char* family_name(Family family) { return family_info(family).name; }  // "W", "G", ...
bool parse_family(const char* text, Family* out);  // by FamilyInfo::name
const char* region_name(Region region);  // "W_BN_BIAS", ...

}  // namespace renaissance
