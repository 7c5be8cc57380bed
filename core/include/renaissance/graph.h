// The step graph IR. The compiler turns (MemoryPlan, optimizer config) into a few short lists of
// nodes; a backend runs each node through its dispatch table (CPU) or captures them all into one
// CUDA graph. A node never names a tensor: it names arena spans, so the node count of a step does
// not grow with the depth of the model.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "renaissance/optimizer.h"
#include "renaissance/plan.h"
#include "renaissance/region.h"

namespace renaissance {

// Ops over element ranges. The X-macro list feeds each backend's dispatch table, so a backend
// that lacks a kernel for an op fails to compile.
#define RN_RANGE_OPS(X)        \
  X(CHECK_FINITE)              \
  X(UPDATE_SGD)                \
  X(UPDATE_SGD_MOMENTUM)       \
  X(UPDATE_SGD_NESTEROV)       \
  X(UPDATE_ADAM)               \
  X(UPDATE_ADAMW)              \
  X(LARS_TILE_NORMS)           \
  X(UPDATE_LARS)               \
  X(UPDATE_LARS_NESTEROV)

// Ops over scalars and per-tensor values.
#define RN_COMPUTE_OPS(X) \
  X(ADVANCE_STEP)         \
  X(LARS_TRUST_RATIO)

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

enum class NodeKind { kRange, kCompute };

// Where a node runs. The CPU backend runs every node in order on its thread team; the CUDA
// backend maps each kind to a stream and orders them with events.
enum class StreamKind : int { kUpdate = 0, kComp1 = 1, kComp2 = 2, kComp3 = 3 };
constexpr int kNumStreamKinds = 4;

// The named graphs of one step, run in this order.
enum class GraphId : int {
  kPreStep = 0,    // non-finite check over G, step counter and bias corrections
  kLarsNorms = 1,  // LARS tile norms and trust ratios
  kOptimizer = 2,  // the updates
};
constexpr int kNumGraphs = 3;

struct GraphNode {
  NodeKind kind = NodeKind::kRange;
  RangeOp range_op = RangeOp::CHECK_FINITE;
  ComputeOp compute_op = ComputeOp::ADVANCE_STEP;
  StreamKind stream = StreamKind::kUpdate;
  Group group = Group::kWeight;  // which coefficients an update uses (bias-like: wd = 0)
  WeightDecayMode weight_decay_mode = WeightDecayMode::kDecoupled;
  // Ranges of one group in each family (same element count); G alone for CHECK_FINITE.
  Span w, g, m, v;
  Span n;                  // LARS trust ratios of the weight group
  bool bias_correction = false;  // ADVANCE_STEP: also advance the Adam bias corrections
};

struct CompiledStep {
  std::array<std::vector<GraphNode>, kNumGraphs> graphs;
  bool check_finite = true;
  // Arena offsets every backend needs to reach the scalars and the LARS tables.
  Span scalars_f32, scalars_i32, scalars_f64;
  Span lars_partials, lars_tiles, lars_tensors;
  uint64_t weight_group_count = 0;  // elements of the W weight group (tile starts are relative to it)

  size_t node_count() const {
    size_t n = 0;
    for (const auto& g : graphs) n += g.size();
    return n;
  }
};

// Builds the step graphs. Throws Error(kInvalidArgument) for an invalid config.
CompiledStep compile_step(const MemoryPlan& plan, const OptimizerConfig& config, bool check_finite);

}  // namespace renaissance
