// Printable names and parsers for the core enums.
#include <cstring>
#include <string>

#include "renaissance/backend.h"
#include "renaissance/graph.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/kinds.h"
#include "renaissance/name_table.h"
#include "renaissance/optimizer.h"
#include "renaissance/region.h"

namespace renaissance {

namespace {

const char* const kRoleNames[kNumRoles] = {"bn_bias",   "bn_weight",  "fc_bias",
                                           "fc_weight", "first_conv", "deep_conv"};

#define RN_NAME_ENTRY(name) #name,
const char* const kRangeOpNames[] = {RN_RANGE_OPS(RN_NAME_ENTRY)};
const char* const kComputeOpNames[] = {RN_COMPUTE_OPS(RN_NAME_ENTRY)};
#undef RN_NAME_ENTRY

constexpr NameRow<BackendKind> kBackendKinds[] = {
    {BackendKind::kCpu, "cpu"}, {BackendKind::kCuda, "cuda"}, {BackendKind::kAuto, "auto"}};
static_assert(rows_in_enum_order(kBackendKinds), "kBackendKinds: one row per enumerator, in enum order");

constexpr NameRow<CpuSchedule> kCpuSchedules[] = {
    {CpuSchedule::kStatic, "static"}, {CpuSchedule::kDynamic, "dynamic"}};
static_assert(rows_in_enum_order(kCpuSchedules), "kCpuSchedules: one row per enumerator, in enum order");

constexpr NameRow<KindFamily> kKindFamilies[] = {{KindFamily::kSgd, "sgd"},   {KindFamily::kAdam, "adam"},
                                                 {KindFamily::kLars, "lars"}, {KindFamily::kLion, "lion"},
                                                 {KindFamily::kLamb, "lamb"}, {KindFamily::kMuon, "muon"}};
static_assert(rows_in_enum_order(kKindFamilies), "kKindFamilies: one row per enumerator, in enum order");

constexpr NameRow<NormPass> kNormPasses[] = {{NormPass::kNone, "none"},
                                             {NormPass::kLarsTrustRatio, "lars_trust_ratio"},
                                             {NormPass::kLambTrustRatio, "lamb_trust_ratio"},
                                             {NormPass::kMuonOrthogonalize, "muon_orthogonalize"}};
static_assert(rows_in_enum_order(kNormPasses), "kNormPasses: one row per enumerator, in enum order");

constexpr NameRow<TorchM> kTorchMs[] = {{TorchM::kExpAvg, "exp_avg"},
                                        {TorchM::kMomentumBuffer, "momentum_buffer"},
                                        {TorchM::kMomentumBufferInWeightGroup, "momentum_buffer_in_weight_group"}};
static_assert(rows_in_enum_order(kTorchMs), "kTorchMs: one row per enumerator, in enum order");

constexpr NameRow<HyperRule> kHyperRules[] = {
    {HyperRule::kLr, "lr"},
    {HyperRule::kNonNegative, "non_negative"},
    {HyperRule::kUnitInterval, "unit_interval"},
    {HyperRule::kPositive, "positive"},
    {HyperRule::kMaxGradNorm, "max_grad_norm"},
    {HyperRule::kFloat32, "float32"},
    {HyperRule::kFlag, "flag"},
    {HyperRule::kSteps, "steps"},
    {HyperRule::kChoice, "choice"},
};
static_assert(rows_in_enum_order(kHyperRules), "kHyperRules: one row per enumerator, in enum order");

}  // namespace

const char* role_name(Role role) { return kRoleNames[static_cast<int>(role)]; }

bool parse_role(const char* text, Role* out) {
  for (int i = 0; i < kNumRoles; ++i) {
    if (std::strcmp(text, kRoleNames[i]) == 0) {
      *out = static_cast<Role>(i);
      return true;
    }
  }
  return false;
}

bool parse_family(const char* text, Family* out) {
  for (const FamilyInfo& info : kFamilyTable) {
    if (std::strcmp(text, info.name) == 0) {
      *out = info.family;
      return true;
    }
  }
  return false;
}

const char* region_name(Region region) {
  static const char* const names[kNumRegions] = {
#define RN_FAMILY_NAMES(F) \
  #F "_BN_BIAS", #F "_BN_WEIGHT", #F "_FC_BIAS", #F "_FC_WEIGHT", #F "_FIRST_CONV", #F "_DEEP_CONV",
      RN_FAMILIES(RN_FAMILY_NAMES)
#undef RN_FAMILY_NAMES
      "S_SCALAR_FP32", "S_SCALAR_INT32", "S_SCALAR_FP64", "T_NORM_PARTIALS", "T_NORM_TILES",
      "T_NORM_TENSORS", "T_GRAD_NORM_PARTIALS", "C_MODEL_COPY",
      "T_HYPER_ITEMS", "T_TENSOR_BLOCKS", "S_TENSOR_INT32", "S_GRAD_TABLE",
      "T_TENSOR_LIST", "T_TENSOR_CHUNKS", "T_GRAD_CHUNKS", "T_MUON_UPDATE", "T_MUON_MATRICES",
      "T_MUON_SCRATCH"};
  return names[region];
}

const char* optimizer_kind_name(OptimizerKind kind) { return kind_info(kind).name; }

bool parse_optimizer_kind(const std::string& text, OptimizerKind* out) {
  return parse_by_name(kKindTable, &KindInfo::kind, text, out);
}

std::string optimizer_kind_names(const char* separator) {
  std::string names;
  for (const KindInfo& info : kKindTable) {
    if (!names.empty()) names += separator;
    names += info.name;
  }
  return names;
}

const char* range_op_name(RangeOp op) { return kRangeOpNames[static_cast<int>(op)]; }
const char* compute_op_name(ComputeOp op) { return kComputeOpNames[static_cast<int>(op)]; }

const char* backend_kind_name(BackendKind kind) { return name_of(kBackendKinds, kind, "?"); }
bool parse_backend_kind(const std::string& text, BackendKind* out) { return parse_by_name(kBackendKinds, text, out); }

const char* cpu_schedule_name(CpuSchedule schedule) { return name_of(kCpuSchedules, schedule, "?"); }
bool parse_cpu_schedule(const std::string& text, CpuSchedule* out) { return parse_by_name(kCpuSchedules, text, out); }

const char* kind_family_name(KindFamily family) { return name_of(kKindFamilies, family, "?"); }
const char* norm_pass_name(NormPass norm) { return name_of(kNormPasses, norm, "?"); }
const char* torch_m_name(TorchM m) { return name_of(kTorchMs, m, "?"); }
const char* hyper_rule_name(HyperRule rule) { return name_of(kHyperRules, rule, ""); }

}  // namespace renaissance
