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
  X(GRAD_NORM_PARTIALS)        \
  X(UPDATE_LION)               \
  X(UPDATE_LAMB)               \
  X(UPDATE_LAMB_BIAS)          \
  X(MUON_MOMENTUM)             \
  X(UPDATE_MUON)

// Ops over scalars and per-tensor values.
#define RN_COMPUTE_OPS(X) \
  X(ADVANCE_STEP)         \
  X(NORM_TRUST_RATIO)     \
  X(CLIP_COEFFICIENT)     \
  X(MUON_ORTHOGONALIZE)

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

// A backend's dispatch tables kRangeOps and kComputeOps of function type Fn (taking the
// backend's context and a GraphNode), indexed by the enums, and run_node(ctx, node), which calls
// the node's function: ENTRY is the backend's X-macro callback naming its function of an op
// (`#define RN_CPU_OP(name) &run_##name,`), so an op without one does not build.
#define RN_OP_TABLES(Fn, ENTRY)                                                  \
  constexpr Fn kRangeOps[kNumRangeOps] = {RN_RANGE_OPS(ENTRY)};                  \
  constexpr Fn kComputeOps[kNumComputeOps] = {RN_COMPUTE_OPS(ENTRY)};            \
  template <class Context>                                                       \
  void run_node(const Context& ctx, const GraphNode& node) {                     \
    if (node.kind == NodeKind::kRange) {                                         \
      kRangeOps[static_cast<int>(node.range_op)](ctx, node);                     \
    } else {                                                                     \
      kComputeOps[static_cast<int>(node.compute_op)](ctx, node);                 \
    }                                                                            \
  }

const char* range_op_name(RangeOp op);
const char* compute_op_name(ComputeOp op);

}  // namespace renaissance
