// The step graph IR. The compiler turns (MemoryPlan, optimizer config) into a few short lists of
// nodes; a backend runs each node through its dispatch table (CPU) or captures them all into one
// CUDA graph. A node never names a tensor: it names arena spans, so the node count of a step does
// not grow with the depth of the model.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "renaissance/ops.h"
#include "renaissance/optimizer.h"
#include "renaissance/plan.h"
#include "renaissance/region.h"
#include "renaissance/scalars.h"

namespace renaissance {

enum class NodeKind { kRange, kCompute };

// Where a node runs. The CPU backend runs every node in order on its thread team; the CUDA
// backend maps each kind to a stream and orders them with events. The two groups touch disjoint
// memory, so the bias-like group's update runs on a second stream beside the weight group's.
enum class StreamKind : int { kUpdate = 0, kSecond = 1 };
constexpr int kNumStreamKinds = 2;

// The named graphs of one step, run in this order.
enum class GraphId : int {
  kPreStep = 0,    // non-finite check (fused with the clip norm) over G, step counter, bias corrections
  kNorms = 1,      // norm passes: tile partials and per-tensor ratios
  kOptimizer = 2,  // the updates
};
constexpr int kNumGraphs = 3;

// What a NORM_TILE_PARTIALS node squares and sums, component by component.
enum class NormInputs : int {
  kWeightAndGradient = 0,  // component 0: ‖w‖², component 1: ‖ĝ‖² with ĝ = (g*(1/scale))*clip
  kLambMoments = 1,        // LAMB phase 1: updates m, v from ĝ; component 0: ‖w‖², 1: ‖u‖²
};

// Which formula NORM_TRUST_RATIO applies to a tensor's two sums (chosen by the compiler from
// kKindTable's NormPass).
enum class NormRatio : int {
  kLars = 0,  // math::lars_trust_ratio(‖w‖², ‖ĝ‖², tc, wd, eps)
  kLamb = 1,  // math::lamb_trust_ratio(‖w‖², ‖u‖²)
};

// What a norm node reads and how it combines it: the tables of the norm pass, carried by every
// node that reads them (no op looks them up elsewhere; tile starts are relative to the first
// element of the node's group), what NORM_TILE_PARTIALS squares and NORM_TRUST_RATIO's formula.
struct NormDesc {
  Span tiles;     // NormTile per tile
  Span tensors;   // NormTensor per tensor of the group
  Span partials;  // math::kNormComponents doubles per tile
  NormInputs inputs = NormInputs::kWeightAndGradient;
  NormRatio ratio = NormRatio::kLars;
};

// What an update writes besides the fp32 master (precision.h): the model copy of the group,
// rounded from the new master in the same pass. precision kFp32: no copy (c.count == 0).
struct ModelCopy {
  Precision precision = Precision::kFp32;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;
  Span c;               // precision_bytes(precision) per element; element j pairs with element j of W
  TensorTable tensors;  // the group's tensors (MemoryPlan::tensor_table of the group's view)
  // Element j of c is element base + j of the group (0; a sharded step's element-wise update
  // cut to a slice starting `base` elements into its group: cut_model_copy, shard_layout.h).
  uint64_t base = 0;
};

// Where a node's G elements come from, on every node that reads G.
struct GradAccess {
  // The encoding of G's elements (PrecisionOptions::model_dtype_gradients): kFp32 (4-byte floats),
  // or kBf16 / kFp16 2-byte encodings that every op widens exactly to fp32 before it computes.
  Precision encoding = Precision::kFp32;
  // TaskOptions::gradient_table (plan.h) only (empty without it): the S_GRAD_TABLE span (a uint64
  // address per parameter), the tensors of the G span (the plan's table of its view: begin counts
  // from the span's first element) and the view's chunk addresses (T_GRAD_CHUNKS, written by the
  // CUDA backend at the start of every step). Element e of the G span is then element e - begin
  // of its tensor's gradient at table[param]; an element in no tensor (padding) reads +0.0.
  Span table;
  TensorTable tensors;
  Span chunk_addresses;
};

// Which elements a node visits and with which scalar block.
struct WorkList {
  // Hyperparameter groups (scalars.h, plan.h). H = 1: hyper_items and tensor_blocks are empty and
  // every op reads scalar block 0. H > 1: element-wise updates walk the HyperItems of their group
  // span, tile-wise ops and NORM_TRUST_RATIO read each tensor's block from tensor_blocks, and
  // ADVANCE_STEP / CLIP_COEFFICIENT write all hyper_groups blocks.
  int hyper_groups = 1;
  Span hyper_items;
  Span tensor_blocks;
  // TaskOptions::tensor_mask (plan.h): S_TENSOR_INT32, mask[count/2] then steps[count/2], on
  // every node that reads it (empty without the flag). Scalar block b is tensor b's, so an item
  // or tile of block b is skipped when mask[b] != 0; ADVANCE_STEP / CLIP_COEFFICIENT advance
  // steps[b] of the unmasked tensors and form block b's corrections from it; the model copy's
  // stochastic-rounding key uses steps[param]. CHECK_FINITE with the mask walks each group's
  // items over that group's G span (group_g, group_items, indexed by Group), skipping masked ones;
  // GRAD_NORM_PARTIALS with the mask keeps its tiles over the node's G span and finds each
  // element's item from the same tables, reading a masked tensor's elements as +0.0 (check and
  // norm alike).
  Span tensor_state;
  std::array<Span, 2> group_g{}, group_items{};
};

// The small per-node switches.
struct NodeFlags {
  WeightDecayMode weight_decay_mode = WeightDecayMode::kDecoupled;
  // GRAD_NORM_PARTIALS: also the non-finite check (writes the flag, as CHECK_FINITE would).
  bool check_finite = false;
  bool bias_correction = false;  // ADVANCE_STEP: also advance the Adam bias corrections
  // The bias-like node of a muon step (UPDATE_ADAMW: its auxiliary AdamW): the update reads lr,
  // wd and the decoupled decay from kAuxLr, kAuxWeightDecay and kAuxDecayFactor, as a weight
  // group reads kLr, kWeightDecay and kDecayFactor (coeff_set: CoeffSet::kAux). No other slot
  // the Adam rules read derives from lr or wd.
  bool aux = false;
  // The update's momentum in its Nesterov form (KindInfo::nesterov): UPDATE_LARS picks its rule by
  // it.
  bool nesterov = false;
};

// What Muon's weight-group nodes read besides the families (empty spans on every other node):
// U (T_MUON_UPDATE, the weight group span's layout), the matrix table (T_MUON_MATRICES: MuonMatrix
// per weight-group tensor) and the Newton–Schulz scratch (T_MUON_SCRATCH).
// MUON_MOMENTUM: m and U from ĝ; MUON_ORTHOGONALIZE: U per matrix, N per matrix; UPDATE_MUON:
// w from U and N (docs/math.md, "Muon"). `mode` is MUON_ORTHOGONALIZE's Newton–Schulz products:
// 0 exact (fixed-point, the same bits on every backend), 1 fast (PlanConfig::muon_mode; docs/math.md,
// "Muon: fast mode"); 0 on every other node.
struct MuonDesc {
  Span update;
  Span matrices;
  Span scratch;
  int32_t mode = 0;  // MuonMode: 0 exact, 1 fast (MUON_ORTHOGONALIZE)
};

struct GraphNode {
  NodeKind kind = NodeKind::kRange;
  RangeOp range_op = RangeOp::CHECK_FINITE;
  ComputeOp compute_op = ComputeOp::ADVANCE_STEP;
  StreamKind stream = StreamKind::kUpdate;
  Group group = Group::kWeight;  // which coefficients an update uses (coeff_set below)
  // The node's range of one group in each family (same element count; empty where the node
  // reads no such family), indexed by Family: G alone for CHECK_FINITE; N holds the group's
  // per-tensor trust ratios (norm kinds); VMAX (amsgrad) is the running maximum of V, and the
  // Adam updates read their denominator from it when it is non-empty (a run-time branch).
  std::array<Span, kNumFamilies> spans{};
  GradAccess grad;   // every node that reads G
  ModelCopy copy;    // update nodes of a task with a bf16/fp16 model copy
  WorkList work;     // hyperparameter items and blocks, the tensor mask
  NormDesc norm;     // NORM_* nodes and the tile-wise updates that read the ratios
  MuonDesc muon;     // Muon's weight-group nodes
  NodeFlags flags;

  Span& span(Family family) { return spans[static_cast<int>(family)]; }
  const Span& span(Family family) const { return spans[static_cast<int>(family)]; }
};

// The coefficient set an element-wise update of `node` reads (scalars.h): chosen here once for
// every backend, handed to the kernels, which build their Coeffs from it (math::make_coeffs).
inline CoeffSet coeff_set(const GraphNode& node) {
  if (node.flags.aux) return CoeffSet::kAux;
  return node.group == Group::kWeight ? CoeffSet::kWeight : CoeffSet::kBiasLike;
}

// A node holds spans and small values only (its per-tensor tables are arena regions planned by
// MemoryPlan), so copying a step copies no host memory and no backend keys anything by a node.
static_assert(std::is_trivially_copyable_v<GraphNode>, "GraphNode holds no host containers");

// Which program a CompiledStep is, for a backend that keeps work per program (CUDA's captured
// graphs): a process-unique number, never 0, given to every step made and to every copy (a copy
// may be edited, so it is a new program); a move hands the number on and gives the moved-from
// step a new one. A step built where a destroyed one stood therefore never shares its number,
// as it would share its address. A program is not edited after Backend::prepare() without being
// prepared again.
class ProgramId {
 public:
  ProgramId() : value_(next()) {}
  ProgramId(const ProgramId&) : value_(next()) {}
  ProgramId(ProgramId&& other) noexcept : value_(other.value_) { other.value_ = next(); }
  ProgramId& operator=(const ProgramId& other) {
    if (this != &other) value_ = next();
    return *this;
  }
  ProgramId& operator=(ProgramId&& other) noexcept {
    if (this != &other) {
      value_ = other.value_;
      other.value_ = next();
    }
    return *this;
  }
  uint64_t value() const { return value_; }

 private:
  static uint64_t next() noexcept;  // core/src/graph.cc: one atomic counter for the process
  uint64_t value_;
};

struct CompiledStep {
  ProgramId id;
  std::array<std::vector<GraphNode>, kNumGraphs> graphs;
  bool check_finite = true;
  bool clip = false;  // gradient-norm clipping on (GRAD_NORM_PARTIALS + CLIP_COEFFICIENT)
  // Arena offsets every backend needs to reach the scalars.
  Span scalars_f32, scalars_i32, scalars_f64;

  size_t node_count() const {
    size_t n = 0;
    for (const auto& g : graphs) n += g.size();
    return n;
  }
  // The scalar regions in an arena (host or device memory) whose first byte is at `arena`.
  ScalarPtrs scalars_in(char* arena) const {
    return {reinterpret_cast<float*>(arena + scalars_f32.offset), reinterpret_cast<int32_t*>(arena + scalars_i32.offset),
            reinterpret_cast<double*>(arena + scalars_f64.offset)};
  }
};

// Builds the step graphs. Throws Error(kInvalidArgument) for an invalid config.
// `precision` must match plan.config().precision.
// With plan.config().hyper_groups > 1, `config` is group 0's: the kind, weight-decay mode and
// clipping (what shapes the graph) are the same for every group (Task::optimizer_groups).
CompiledStep compile_step(const MemoryPlan& plan, const OptimizerConfig& config, bool check_finite,
                          const PrecisionOptions& precision = {});

// TaskOptions::tensor_mask (plan.h) only: the program a mask task runs while no tensor is masked
// and every tensor's step count equals the task's (Task::step decides; docs/design.md). The
// non-finite check (with clipping: and the norm partials) and the updates are the nodes of a task
// without the mask on the same layout (H = 1: chunked over the group spans, block 0; H > 1: the
// per-tensor items without the mask read), and ADVANCE_STEP (or CLIP_COEFFICIENT) is
// compile_step's (it reads the mask, all zeros here, and advances every tensor's count and
// corrections, so a later masked step finds them right). On a mask of zeros and equal counts it
// gives compile_step's bits.
CompiledStep compile_unmasked_step(const MemoryPlan& plan, const OptimizerConfig& config, bool check_finite,
                                   const PrecisionOptions& precision = {});

}  // namespace renaissance
