// The op lists of the step graph IR. Each X-macro list feeds the enum, the names and every
// backend's dispatch table, so a backend that lacks a kernel for an op fails to compile (CPU) or
// to link (CUDA).
#pragma once

namespace renaissance {

// Ops over element ranges (or over the tiles of a norm pass).
#define RN_RANGE_OPS(X)        \
  X(CHECK_FINITE)              \
  X(UPDATE_SGD)                \
  X(UPDATE_SGD_MOMENTUM)       \
  X(UPDATE_SGD_NESTEROV)       \
  X(UPDATE_ADAM)               \
  X(UPDATE_ADAMW)              \
  X(NORM_TILE_PARTIALS)        \
  X(UPDATE_LARS)               \
  X(UPDATE_LARS_NESTEROV)      \
  X(GRAD_NORM_PARTIALS)        \
  X(UPDATE_LION)               \
  X(UPDATE_LAMB)               \
  X(UPDATE_LAMB_BIAS)

// Ops over scalars and per-tensor values.
#define RN_COMPUTE_OPS(X) \
  X(ADVANCE_STEP)         \
  X(NORM_TRUST_RATIO)     \
  X(CLIP_COEFFICIENT)

enum class RangeOp : int {
#define RN_ENUM_ENTRY(name) name,
  RN_RANGE_OPS(RN_ENUM_ENTRY)
#undef RN_ENUM_ENTRY
};
enum class ComputeOp : int {
#define RN_ENUM_ENTRY(name) name,
  RN_COMPUTE_OPS(RN_ENUM_ENTRY)
#undef RN_ENUM_ENTRY
};
#define RN_COUNT_ENTRY(name) +1
constexpr int kNumRangeOps = 0 RN_RANGE_OPS(RN_COUNT_ENTRY);
constexpr int kNumComputeOps = 0 RN_COMPUTE_OPS(RN_COUNT_ENTRY);
#undef RN_COUNT_ENTRY

const char* range_op_name(RangeOp op);
const char* compute_op_name(ComputeOp op);

}  // namespace renaissance
