// Printable names and parsers for the core enums.
#include <cstring>
#include <string>

#include "renaissance/backend.h"
#include "renaissance/graph.h"
#include "renaissance/optimizer.h"
#include "renaissance/region.h"

namespace renaissance {

namespace {
const char* const kRoleNames[kNumRoles] = {"bn_bias",   "bn_weight",  "fc_bias",
                                           "fc_weight", "first_conv", "deep_conv"};
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

const char* family_name(Family family) {
  static const char* const names[kNumFamilies] = {"W", "G", "M", "V", "N", "VMAX"};
  return names[static_cast<int>(family)];
}

const char* region_name(Region region) {
  static const char* const names[kNumRegions] = {
#define RN_FAMILY_NAMES(F) \
  #F "_BN_BIAS", #F "_BN_WEIGHT", #F "_FC_BIAS", #F "_FC_WEIGHT", #F "_FIRST_CONV", #F "_DEEP_CONV"
      RN_FAMILY_NAMES(W), RN_FAMILY_NAMES(G), RN_FAMILY_NAMES(M), RN_FAMILY_NAMES(V),
      RN_FAMILY_NAMES(N), RN_FAMILY_NAMES(VMAX),
#undef RN_FAMILY_NAMES
      "S_SCALAR_FP32", "S_SCALAR_INT32", "S_SCALAR_FP64", "T_NORM_PARTIALS", "T_NORM_TILES",
      "T_NORM_TENSORS", "T_GRAD_NORM_PARTIALS", "C_MODEL_COPY",
      "T_HYPER_ITEMS", "T_TENSOR_BLOCKS", "S_TENSOR_INT32", "S_GRAD_TABLE",
      "T_TENSOR_LIST", "T_TENSOR_CHUNKS", "T_GRAD_CHUNKS"};
  return names[region];
}

const char* optimizer_kind_name(OptimizerKind kind) { return kind_info(kind).name; }

bool parse_optimizer_kind(const std::string& text, OptimizerKind* out) {
  for (const KindInfo& info : kKindTable) {
    if (text == info.name) {
      *out = info.kind;
      return true;
    }
  }
  return false;
}

std::string optimizer_kind_names(const char* separator) {
  std::string names;
  for (const KindInfo& info : kKindTable) {
    if (!names.empty()) names += separator;
    names += info.name;
  }
  return names;
}

const char* range_op_name(RangeOp op) {
  static const char* const names[] = {
#define RN_NAME_ENTRY(name) #name,
      RN_RANGE_OPS(RN_NAME_ENTRY)
#undef RN_NAME_ENTRY
  };
  return names[static_cast<int>(op)];
}

const char* compute_op_name(ComputeOp op) {
  static const char* const names[] = {
#define RN_NAME_ENTRY(name) #name,
      RN_COMPUTE_OPS(RN_NAME_ENTRY)
#undef RN_NAME_ENTRY
  };
  return names[static_cast<int>(op)];
}

const char* backend_kind_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCuda: return "cuda";
    case BackendKind::kAuto: return "auto";
  }
  return "?";
}

bool parse_backend_kind(const std::string& text, BackendKind* out) {
  if (text == "cpu") *out = BackendKind::kCpu;
  else if (text == "cuda") *out = BackendKind::kCuda;
  else if (text == "auto") *out = BackendKind::kAuto;
  else return false;
  return true;
}

const char* cpu_schedule_name(CpuSchedule schedule) {
  switch (schedule) {
    case CpuSchedule::kStatic: return "static";
    case CpuSchedule::kInterleaved: return "interleaved";
    case CpuSchedule::kDynamic: return "dynamic";
  }
  return "?";
}

bool parse_cpu_schedule(const std::string& text, CpuSchedule* out) {
  if (text == "static") *out = CpuSchedule::kStatic;
  else if (text == "interleaved") *out = CpuSchedule::kInterleaved;
  else if (text == "dynamic") *out = CpuSchedule::kDynamic;
  else return false;
  return true;
}

}  // namespace renaissance
