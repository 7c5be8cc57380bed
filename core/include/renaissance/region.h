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

// Buffer families: one per kind of per-element buffer.
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

#define RN_FAMILY_REGIONS(F) \
  F##_BN_BIAS, F##_BN_WEIGHT, F##_FC_BIAS, F##_FC_WEIGHT, F##_FIRST_CONV, F##_DEEP_CONV

enum Region : int {
  RN_FAMILY_REGIONS(W),
  RN_FAMILY_REGIONS(G),
  RN_FAMILY_REGIONS(M),
  RN_FAMILY_REGIONS(V),
  RN_FAMILY_REGIONS(N),
  RN_FAMILY_REGIONS(VMAX),
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
  // U pairs with element j of the weight group's W span), the matrix table (MuonMatrix per
  // weight-group tensor, written once at compile()) and the Newton–Schulz scratch (fp32,
  // muon_scratch_floats of the largest matrix).
  T_MUON_UPDATE,
  T_MUON_MATRICES,
  T_MUON_SCRATCH,
  kNumRegions
};
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
static_assert(G_BN_BIAS == W_DEEP_CONV + 1 && VMAX_DEEP_CONV + 1 == S_SCALAR_FP32,
              "families are laid out one after another with the roles in the same order");
static_assert(family_region(Family::kM, Role::kFcWeight) == M_FC_WEIGHT, "family arithmetic");
static_assert(group_of(Role::kFcBias) == Group::kBiasLike && group_of(Role::kFcWeight) == Group::kWeight,
              "bias-like roles precede weight roles");

const char* role_name(Role role);       // "bn_bias", ...
bool parse_role(const char* text, Role* out);
const char* family_name(Family family);  // "W", "G", ...
const char* region_name(Region region);  // "W_BN_BIAS", ...

}  // namespace renaissance
