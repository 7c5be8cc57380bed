// MemoryPlan: where every tensor, scalar and scratch buffer lives in the one arena.
//
// Families (W, G, M, V, N, VMAX) are allocated only when the optimizer needs them. Within a family the
// six role regions follow the Region order, and tensors follow declaration order within a role,
// so tensor i sits at the same relative position in W, G, M and V. Every region is padded to a
// multiple of 64 elements (256 bytes), hence every region and family starts on a 256-byte
// boundary and vector loads need no scalar prologue. Padding is zero and every update keeps it
// zero (all rules map w = g = m = v = 0 to 0).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "renaissance/precision.h"
#include "renaissance/region.h"
#include "renaissance/scalars.h"

namespace renaissance {

constexpr uint64_t kRegionAlignBytes = 256;

// Which families and scratch buffers an optimizer kind needs.
struct PlanConfig {
  // A rank of a sharded step (renaissance/shard_layout.h) keeps M and V only for family elements
  // [state_begin, state_end): see MemoryPlan::state_sliced(). The default keeps them whole.
  uint64_t state_begin = 0;
  uint64_t state_end = UINT64_MAX;
  // The families the plan holds (W and G always; the others by their FamilyNeed in kFamilyTable:
  // the kind's M and V, N with a norm pass (plus its tile table and reduction scratch), VMAX
  // with amsgrad). A family that is off leaves the plan byte for byte the one without it.
  std::array<bool, kNumFamilies> families{true, true};
  bool has(Family f) const { return families[static_cast<size_t>(f)]; }
  void set(Family f, bool on) { families[static_cast<size_t>(f)] = on; }
  Precision precision = Precision::kFp32;  // bf16/fp16: a model copy C_MODEL_COPY besides W
  // bf16/fp16 only: the G family holds 2-byte model-dtype encodings, element j of G pairing with
  // element j of W; its six role regions are packed one after another (no alignment gap between
  // roles, each starts on a 128-byte boundary) so that a group span of G is contiguous.
  bool model_dtype_gradients = false;
  // Hyperparameter groups H (ParamSpec::hyper_group < H). H > 1: inside each role region the
  // tensors follow (hyper group, declaration order), each (role, group) run padded to 64
  // elements; the scalar regions hold H blocks; T_HYPER_ITEMS and T_TENSOR_BLOCKS are placed
  // after every other region. H = 1 is byte for byte the layout without groups.
  int hyper_groups = 1;
  // Per-tensor mask (TaskOptions::tensor_mask): every tensor is its own 64-element-aligned run
  // with its own scalar block (block = parameter id, holding its hyperparameter group's values),
  // so work items are per tensor and hold a tensor's step-dependent scalars; S_TENSOR_INT32 holds
  // the mask and the per-tensor step counts. Off: the layout is exactly as without it.
  bool tensor_mask = false;
  // TaskOptions::gradient_table: S_GRAD_TABLE holds a uint64 address per tensor (its gradient),
  // placed after every other region, and the step reads G through it. Off: nothing changes.
  bool gradient_table = false;
  // Muon (plan_config_from_optimizer): T_MUON_UPDATE, T_MUON_MATRICES and T_MUON_SCRATCH after
  // every other region, and the matrix table with each matrix's lr factor for muon_adjust_lr
  // (0 original, 1 match_rms_adamw; a task-wide setting). Off: nothing changes. muon_mode is
  // the Newton–Schulz products' mode (0 exact, 1 fast; task-wide), which the compiler hands to
  // MUON_ORTHOGONALIZE; it changes no region.
  bool muon = false;
  int muon_adjust_lr = 0;
  int muon_mode = 0;
};
PlanConfig plan_config_from_optimizer(OptimizerKind kind);
// The families of a configuration (FamilyInfo::need): the kind's, and VMAX with amsgrad.
PlanConfig plan_config_from_optimizer(const OptimizerConfig& config);

// One torch state key of a group: the family and torch's per-parameter key for it.
struct TorchStateKey {
  Family family;
  const char* key;
};
// torch's per-parameter state keys of `group` of `kind`, in Family order: of the families the
// configuration (kind, amsgrad) holds, those torch keeps, by FamilyInfo::torch_state, or
// torch_state_momentum where the kind's KindInfo::torch_m makes the group's M a momentum buffer.
// Throws (ErrorKind::kInvalidArgument) for amsgrad on a kind that does not read it. (torch's `step` is no
// family: the Python layer adds it.)
std::vector<TorchStateKey> torch_state_keys(OptimizerKind kind, Group group, bool amsgrad);

// The Muon matrix of a weight-group tensor of shape `shape` (scalars.h, MuonMatrix; start 0):
// (shape[0], prod(shape[1:])), a 1-D tensor 1 x n, a scalar 1 x 1, and the lr factor of
// adjust_lr (0 original, 1 match_rms_adamw).
MuonMatrix muon_matrix(const std::vector<int64_t>& shape, int adjust_lr);

// A byte range of the arena holding `count` elements.
struct Span {
  uint64_t offset = 0;  // bytes from the arena's start
  uint64_t count = 0;   // elements (padding included for family regions)
};

// One tensor of a span, in a tensor table (T_TENSOR_LIST): its elements are [begin, begin + numel)
// of the span, and `param` is its id (it keys the model copy's stochastic rounding and indexes
// the gradient table). Element begin + i is element first + i of the tensor (first is 0: the
// tables always list whole tensors). Every field is 64 bits wide, so the struct has no padding:
// its bytes are only its values (they are written into the arena).
struct CopyTensor {
  uint64_t begin = 0;
  uint64_t numel = 0;
  uint64_t param = 0;
  uint64_t first = 0;
};
static_assert(sizeof(CopyTensor) == 32, "CopyTensor is shared with device code");
static_assert(std::has_unique_object_representations_v<CopyTensor>, "CopyTensor has no padding bytes");

// The spans whose tensors a node may look up (a model copy's writer, a gradient-table reader).
// Each has its own list in T_TENSOR_LIST and chunk index in T_TENSOR_CHUNKS, counted from the
// span's first element.
enum class TableView : int {
  kBiasLike = 0,  // the bias-like group span
  kWeight = 1,    // the weight group span
  kFamily = 2,    // the whole family (the non-finite check and the clipping partials read G whole)
};
constexpr int kNumTableViews = 3;
constexpr TableView table_view(Group group) { return static_cast<TableView>(static_cast<int>(group)); }

// A view's tensors in the arena: `tensors` (CopyTensor entries in span order, of T_TENSOR_LIST)
// and `chunks` (int32 entries, of T_TENSOR_CHUNKS: entry k is the first tensor that ends after
// span element k * kCopyChunk, model_copy_key.h). Empty spans: no table.
struct TensorTable {
  Span tensors;
  Span chunks;
};

struct RegionInfo {
  uint64_t offset = 0;      // bytes from the arena's start (0 when not allocated)
  uint64_t count = 0;       // elements, padding included
  uint64_t used = 0;        // elements that belong to tensors (or slots)
  uint32_t elem_size = 0;   // bytes per element
  bool allocated = false;
};

struct TensorInfo {
  ParamSpec spec;
  int64_t numel = 0;
  uint64_t offset_in_family = 0;  // elements from the family's first element
  uint64_t offset_in_group = 0;   // elements from the group's first element
  int index_in_group = 0;         // position among the tensors of its group
};

class MemoryPlan {
 public:
  MemoryPlan() = default;
  MemoryPlan(std::vector<ParamSpec> params, PlanConfig config);

  const PlanConfig& config() const { return config_; }
  uint64_t arena_bytes() const { return arena_bytes_; }

  // A plan whose M and V families hold only the elements [state_begin(), state_end()) of the
  // family (PlanConfig; a rank of a sharded step). Their storage is compact: the slice (from the
  // 64-element boundary at or below state_begin, so that every element keeps its 256-byte
  // alignment) sits where the whole family would start, and the M/V region offsets are set so
  // that region + element still addresses it. Only elements of the slice may be touched through
  // M or V spans: outside it those offsets alias other memory. Task refuses whole-family access.
  bool state_sliced() const { return state_begin_ > 0 || state_end_ < family_elements_; }
  uint64_t state_begin() const { return state_begin_; }
  uint64_t state_end() const { return state_end_; }
  // True when family elements [first, first + count) lie inside the held slice.
  bool holds_state(uint64_t first, uint64_t count) const {
    return first >= state_begin_ && first <= state_end_ && count <= state_end_ - first;
  }

  size_t num_params() const { return tensors_.size(); }
  const TensorInfo& tensor(size_t id) const { return tensors_.at(id); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const RegionInfo& region(Region r) const { return regions_[r]; }
  bool has_family(Family f) const;
  // The contiguous span of regions first..last (inclusive) of one family.
  Span region_range(Region first, Region last) const;
  // The whole group (bias-like or weight) of a family as one span.
  Span group_span(Family family, Group group) const;
  // The region of `family` that pairs with `region` (same role).
  static Region paired(Region region, Family family) { return family_region(family, role_of(region)); }
  // Parameter ids whose tensors live in `region` (any family: the role decides), in order.
  std::vector<size_t> get_ids_by_region(Region region) const;
  // Byte offset of tensor `id` in `family`.
  uint64_t tensor_offset(Family family, size_t id) const;
  // The model copy (config().precision != fp32): element j of the W family is element j of
  // C_MODEL_COPY (2 bytes each), so a group's copy span and a tensor's copy offset follow W's.
  bool has_model_copy() const { return regions_[C_MODEL_COPY].allocated; }
  Span model_copy_group_span(Group group) const;
  uint64_t model_copy_offset(size_t id) const;

  // The canonical norm tiles over the weight group (empty unless config().has(Family::kN)).
  const std::vector<NormTile>& norm_tiles() const { return norm_tiles_; }
  const std::vector<NormTensor>& norm_tensors() const { return norm_tensors_; }

  // Muon only (empty otherwise): one entry per weight-group tensor in index_in_group order
  // (T_MUON_MATRICES), and the fp32 scratch of the largest one (T_MUON_SCRATCH's count).
  const std::vector<MuonMatrix>& muon_matrices() const { return muon_matrices_; }
  uint64_t muon_scratch_floats() const { return muon_scratch_floats_; }

  // H > 1 only (empty otherwise): the work items of both group spans (bias-like first), the
  // slice of T_HYPER_ITEMS that covers one group span, and the block of each weight-group
  // tensor by index_in_group (T_TENSOR_BLOCKS).
  const std::vector<HyperItem>& hyper_items() const { return hyper_items_; }
  Span hyper_item_span(Group group) const;
  // The host copy of the items a span of T_HYPER_ITEMS covers (hyper_item_span's, or a part).
  const HyperItem* hyper_items_in(const Span& items) const {
    return hyper_items_.data() + (items.offset - regions_[T_HYPER_ITEMS].offset) / sizeof(HyperItem);
  }
  const std::vector<int32_t>& tensor_blocks() const { return tensor_blocks_; }
  // Scalar blocks of S_SCALAR_FP32/FP64: num_params (at least 1) with tensor_mask, else H.
  int scalar_blocks() const { return scalar_blocks_; }
  // The scalar block tensor `id` reads.
  int block_of(size_t id) const;

  // The tensor tables (T_TENSOR_LIST, T_TENSOR_CHUNKS), planned with a model copy or a gradient
  // table (the family view only with a gradient table); empty spans otherwise. The host copies
  // of the two regions' contents, which Task::compile uploads.
  TensorTable tensor_table(TableView view) const;
  const std::vector<CopyTensor>& table_tensors() const { return table_tensors_; }
  const std::vector<int32_t>& table_chunks() const { return table_chunks_; }
  // With a gradient table: the view's part of T_GRAD_CHUNKS (grad_chunk_count(span) uint64
  // entries, GradTableRef::chunk_at), written by the CUDA backend each step. Empty otherwise.
  Span grad_chunk_addresses(TableView view) const;

  // A one-line summary per region, for logs and `renaissance run --verbose`.
  std::string describe() const;

 private:
  // The constructor's steps (plan.cc), in the order it takes them; place*() append regions at
  // the arena's end, arena_bytes_.
  struct RoleTotals {  // per role: tensor elements, tensors, elements with the runs' padding
    std::array<uint64_t, kNumRoles> elems{}, tensors{}, padded{};
  };
  bool has_runs() const { return config_.hyper_groups > 1 || config_.tensor_mask; }
  void check_hyperparameter_groups(const std::vector<ParamSpec>& params);
  RoleTotals lay_out_tensors(const std::vector<ParamSpec>& params);
  uint64_t close_run(uint64_t run_start, uint64_t cursor, uint64_t group_first, int block, Group group);
  void set_state_slice(uint64_t family_elements);
  void place(Region region, uint64_t count, uint64_t used, uint32_t elem_size);
  void place_family(Family family, const RoleTotals& roles);
  uint64_t pack_roles(Family family, uint64_t at, const std::array<uint64_t, kNumRoles>& count,
                      const std::array<uint64_t, kNumRoles>& used, uint32_t bytes);
  void place_packed(Family family, const std::array<uint64_t, kNumRoles>& count,
                    const std::array<uint64_t, kNumRoles>& used, uint32_t bytes);
  void place_state_slice(Family family, const RoleTotals& roles);
  void place_families(const RoleTotals& roles);
  std::vector<const TensorInfo*> weight_group_tensors() const;  // by index_in_group
  void place_norm_tiles();
  void place_muon();

  PlanConfig config_;
  std::vector<TensorInfo> tensors_;
  std::array<RegionInfo, kNumRegions> regions_{};
  std::array<int, 2> group_tensor_count_{};
  std::vector<NormTile> norm_tiles_;
  std::vector<NormTensor> norm_tensors_;
  std::vector<MuonMatrix> muon_matrices_;
  uint64_t muon_scratch_floats_ = 0;
  std::vector<HyperItem> hyper_items_;
  std::array<uint64_t, 2> hyper_item_count_{};  // items per group span (bias-like, weight)
  std::vector<int32_t> tensor_blocks_;
  // The tensor tables and each view's first entry and count in them (tensors, chunks, chunk
  // addresses).
  struct ViewRange {
    uint64_t tensor_first = 0, tensor_count = 0, chunk_first = 0, chunk_count = 0;
  };
  void plan_tensor_tables();
  std::vector<CopyTensor> table_tensors_;
  std::vector<int32_t> table_chunks_;
  std::array<ViewRange, kNumTableViews> views_{};
  bool has_views_ = false;
  int scalar_blocks_ = 1;
  uint64_t arena_bytes_ = 0;
  uint64_t family_elements_ = 0;  // elements of one family, padding included
  uint64_t state_begin_ = 0, state_end_ = 0;
};

}  // namespace renaissance
