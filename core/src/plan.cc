// MemoryPlan: assigns every tensor, scalar slot and scratch buffer an offset in one arena.
#include "renaissance/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <unordered_set>

#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/math/exact_matmul.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/model_copy_key.h"

namespace renaissance {

namespace {

constexpr uint64_t kPadElements = kRegionAlignBytes / sizeof(float);

uint64_t round_up(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

void validate_param_specs(const std::vector<ParamSpec>& params) {
  std::unordered_set<std::string> names;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    if (p.name.empty()) throw_invalid("parameter #" + std::to_string(i) + " has an empty name");
    if (!names.insert(p.name).second) throw_invalid("parameter name '" + p.name + "' is used twice");
    if (static_cast<int>(p.role) < 0 || static_cast<int>(p.role) >= kNumRoles) {
      throw_invalid("parameter '" + p.name + "' has an unknown role");
    }
    if (p.optimizer != ParamOptimizer::kRole && p.optimizer != ParamOptimizer::kAdamW) {
      throw_invalid("parameter '" + p.name + "' has an unknown optimizer mark #" + std::to_string(static_cast<int>(p.optimizer)));
    }
    int64_t n = 1;
    for (int64_t d : p.shape) {
      if (d < 0) throw_invalid("parameter '" + p.name + "' has a negative extent " + std::to_string(d));
      if (d != 0 && n > std::numeric_limits<int64_t>::max() / 4 / d) {
        throw_invalid("parameter '" + p.name + "' is too large");
      }
      n *= d;
    }
  }
}

namespace {

bool family_needed(FamilyNeed need, OptimizerKind kind, const OptimizerConfig* config) {
  const KindInfo& info = kind_info(kind);
  switch (need) {
    case FamilyNeed::kAlways: return true;
    case FamilyNeed::kKindM: return info.has_m;
    case FamilyNeed::kKindV: return info.has_v;
    case FamilyNeed::kNormPass: return info.norm != NormPass::kNone;
    case FamilyNeed::kAmsgrad: return config != nullptr && config->amsgrad;
  }
  return false;
}

PlanConfig plan_config_for(OptimizerKind kind, const OptimizerConfig* config) {
  PlanConfig c;
  for (const FamilyInfo& f : kFamilyTable) c.set(f.family, family_needed(f.need, kind, config));
  c.muon = kind_info(kind).norm == NormPass::kMuonOrthogonalize;
  return c;
}

}  // namespace

PlanConfig plan_config_from_optimizer(OptimizerKind kind) { return plan_config_for(kind, nullptr); }

PlanConfig plan_config_from_optimizer(const OptimizerConfig& config) {
  PlanConfig c = plan_config_for(config.kind, &config);
  c.muon_adjust_lr = c.muon ? static_cast<int>(config.adjust_lr) : 0;
  c.muon_mode = c.muon ? static_cast<int>(config.muon_mode) : 0;
  return c;
}

std::vector<TorchStateKey> torch_state_keys(OptimizerKind kind, Group group, bool amsgrad) {
  const KindInfo& info = kind_info(kind);
  if (amsgrad && !kind_reads(kind, hyperparameter_info(Hyperparameter::kAmsgrad))) {
    throw_invalid(std::string("torch_state_keys: kind ") + info.name + " has no amsgrad");
  }
  OptimizerConfig config;
  config.kind = kind;
  config.amsgrad = amsgrad;
  const PlanConfig plan = plan_config_from_optimizer(config);
  const bool momentum = info.torch_m == TorchM::kMomentumBuffer ||
                        (info.torch_m == TorchM::kMomentumBufferInWeightGroup && group == Group::kWeight);
  std::vector<TorchStateKey> keys;
  for (const FamilyInfo& f : kFamilyTable) {
    const char* key = momentum ? f.torch_state_momentum : f.torch_state;
    if (plan.has(f.family) && key != nullptr) keys.push_back({f.family, key});
  }
  return keys;
}

MuonMatrix muon_matrix(const std::vector<int64_t>& shape, int adjust_lr) {
  MuonMatrix m{};
  m.rows = shape.empty() ? 1 : (shape.size() == 1 ? 1 : shape[0]);
  m.cols = 1;
  for (size_t d = shape.size() == 1 ? 0 : 1; d < shape.size(); ++d) m.cols *= shape[d];
  const double a = static_cast<double>(m.rows), b = static_cast<double>(m.cols);
  if (adjust_lr == 0) {
    m.adjust = b > 0.0 ? std::sqrt(std::max(1.0, a / b)) : 1.0;
  } else {
    m.adjust = 0.2 * std::sqrt(std::max(a, b));
  }
  return m;
}

MemoryPlan::MemoryPlan(std::vector<ParamSpec> params, PlanConfig config) : config_(config) {
  validate_param_specs(params);
  // A muon plan places the tensors marked "adamw" in the bias-like group (param.h).
  for (ParamSpec& p : params) p.role = planned_role(p, config_.muon);
  check_hyperparameter_groups(params);
  const RoleTotals roles = lay_out_tensors(params);
  // The arena, region after region (place() appends at arena_bytes_): the families, the model
  // copy, the scalar blocks, then the tables that only some plans hold, each after every region
  // that plans without it hold, so that a plan without it is byte for byte the one before it.
  place_families(roles);
  if (config_.precision != Precision::kFp32) {
    place(C_MODEL_COPY, family_elements_, family_elements_, precision_bytes(config_.precision));
  }
  const uint64_t f32_slots = static_cast<uint64_t>(scalar_blocks_) * kNumScalarF32;
  const uint64_t f64_slots = static_cast<uint64_t>(scalar_blocks_) * kNumScalarF64;
  place(S_SCALAR_FP32, f32_slots, f32_slots, sizeof(float));
  place(S_SCALAR_INT32, kNumScalarI32, kNumScalarI32, sizeof(int32_t));
  place(S_SCALAR_FP64, f64_slots, f64_slots, sizeof(double));
  if (config_.has(Family::kN)) place_norm_tiles();
  // Gradient-norm clipping's tile partials over the whole G family, for every kind: clipping
  // is an option of the config, not of the plan (a few bytes per 64K parameters).
  const uint64_t grad_tiles = math::grad_norm_tile_count(region_range(G_BN_BIAS, G_DEEP_CONV).count);
  place(T_GRAD_NORM_PARTIALS, grad_tiles, grad_tiles, sizeof(double));
  if (has_runs()) {
    place(T_HYPER_ITEMS, hyper_items_.size(), hyper_items_.size(), sizeof(HyperItem));
    place(T_TENSOR_BLOCKS, tensor_blocks_.size(), tensor_blocks_.size(), sizeof(int32_t));
  }
  if (config_.tensor_mask) {
    const uint64_t slots = 2 * static_cast<uint64_t>(tensors_.size());
    place(S_TENSOR_INT32, slots, slots, sizeof(int32_t));
  }
  if (config_.gradient_table) place(S_GRAD_TABLE, tensors_.size(), tensors_.size(), sizeof(uint64_t));
  // The tensor tables a model copy's writer and a gradient-table reader look elements up in.
  if (config_.precision != Precision::kFp32 || config_.gradient_table) {
    plan_tensor_tables();
    place(T_TENSOR_LIST, table_tensors_.size(), table_tensors_.size(), sizeof(CopyTensor));
    place(T_TENSOR_CHUNKS, table_chunks_.size(), table_chunks_.size(), sizeof(int32_t));
    if (config_.gradient_table) place(T_GRAD_CHUNKS, table_chunks_.size(), table_chunks_.size(), sizeof(uint64_t));
  }
  if (config_.muon) place_muon();
}

void MemoryPlan::check_hyperparameter_groups(const std::vector<ParamSpec>& params) {
  const int hyper = config_.hyper_groups;
  if (hyper < 1) throw_invalid("hyper_groups must be >= 1, got " + std::to_string(hyper));
  if (config_.tensor_mask && params.size() > static_cast<size_t>(INT32_MAX / kNumScalarF64)) {
    throw_invalid("tensor_mask: too many parameters");
  }
  scalar_blocks_ = config_.tensor_mask ? std::max<int>(1, static_cast<int>(params.size())) : hyper;
  for (const ParamSpec& p : params) {
    if (p.hyper_group < 0 || p.hyper_group >= hyper) {
      throw_invalid("parameter '" + p.name + "' has hyperparameter group " + std::to_string(p.hyper_group) +
                    ", the task has " + std::to_string(hyper) + " (valid: 0.." + std::to_string(hyper - 1) + ")");
    }
  }
}

// With H > 1 or the mask, every (role, block) run starts on the region alignment and is cut into
// work items: pads the run [run_start, cursor) to 64 elements and returns its padded end.
uint64_t MemoryPlan::close_run(uint64_t run_start, uint64_t cursor, uint64_t group_first, int block, Group group) {
  const uint64_t end = run_start + round_up(cursor - run_start, kPadElements);
  for (uint64_t at = 0; at < end - run_start; at += kHyperItemElements) {
    HyperItem item;
    item.start = static_cast<int64_t>(run_start - group_first + at);
    item.count = static_cast<int32_t>(std::min<uint64_t>(kHyperItemElements, end - run_start - at));
    item.block = block;
    hyper_items_.push_back(item);
    ++hyper_item_count_[static_cast<int>(group)];
  }
  return end;
}

// Every tensor's place inside a family: by role (Region order), then (with runs) hyperparameter
// group, then declaration order. With the mask every tensor is a run of its own (block = id), so
// items never cross tensors; a Muon plan's weight-group tensors (its matrices) are runs of their
// own too, so that every matrix starts an item on the 64-element alignment: a sharded step's cut
// at a matrix start (rule M, docs/distributed.md) then splits no item, with groups as without.
MemoryPlan::RoleTotals MemoryPlan::lay_out_tensors(const std::vector<ParamSpec>& params) {
  const bool runs = has_runs();
  const bool matrix_runs = runs && config_.muon;
  tensors_.resize(params.size());
  std::array<std::vector<size_t>, kNumRoles> by_role;
  for (size_t i = 0; i < params.size(); ++i) by_role[static_cast<int>(params[i].role)].push_back(i);
  if (runs) {
    for (auto& ids : by_role) {
      std::stable_sort(ids.begin(), ids.end(),
                       [&](size_t a, size_t b) { return params[a].hyper_group < params[b].hyper_group; });
    }
  }
  RoleTotals roles;
  uint64_t family_cursor = 0;  // elements from the family start
  std::array<uint64_t, 2> group_first{};
  std::array<int, 2> group_index{};
  for (int r = 0; r < kNumRoles; ++r) {
    const Group group = group_of(static_cast<Role>(r));
    const int g = static_cast<int>(group);
    if (r == static_cast<int>(Role::kFcWeight)) group_first[1] = family_cursor;
    uint64_t cursor = family_cursor;
    uint64_t run_start = cursor;
    int run_block = -1;
    for (size_t id : by_role[r]) {
      const int block = config_.tensor_mask ? static_cast<int>(id) : params[id].hyper_group;
      if (runs && (block != run_block || (matrix_runs && group == Group::kWeight))) {
        if (run_block >= 0) cursor = close_run(run_start, cursor, group_first[g], run_block, group);
        run_start = cursor;
        run_block = block;
      }
      TensorInfo& t = tensors_[id];
      t.spec = params[id];
      t.numel = params[id].numel();
      t.offset_in_family = cursor;
      t.offset_in_group = cursor - group_first[g];
      t.index_in_group = group_index[g]++;
      cursor += static_cast<uint64_t>(t.numel);
      roles.elems[r] += static_cast<uint64_t>(t.numel);
    }
    if (run_block >= 0) cursor = close_run(run_start, cursor, group_first[g], run_block, group);
    roles.tensors[r] = by_role[r].size();
    roles.padded[r] = round_up(cursor - family_cursor, kPadElements);
    family_cursor += roles.padded[r];
  }
  if (runs) {
    tensor_blocks_.assign(static_cast<size_t>(group_index[1]), 0);
    for (size_t id = 0; id < tensors_.size(); ++id) {
      const TensorInfo& t = tensors_[id];
      if (group_of(t.spec.role) == Group::kWeight) tensor_blocks_[t.index_in_group] = block_of(id);
    }
  }
  group_tensor_count_ = group_index;
  return roles;
}

void MemoryPlan::place(Region region, uint64_t count, uint64_t used, uint32_t elem_size) {
  regions_[region] = RegionInfo{arena_bytes_, count, used, elem_size, true};
  arena_bytes_ += round_up(count * elem_size, kRegionAlignBytes);
}

// The six role regions of a family, one after another, each aligned.
void MemoryPlan::place_family(Family family, const RoleTotals& roles) {
  for (int r = 0; r < kNumRoles; ++r) {
    place(family_region(family, static_cast<Role>(r)), roles.padded[r], roles.elems[r], family_info(family).elem_bytes);
  }
}

// Six role regions of a family packed one after another from byte `at`, each `count` elements of
// `bytes` (no alignment gap between roles); returns the byte after the last.
uint64_t MemoryPlan::pack_roles(Family family, uint64_t at, const std::array<uint64_t, kNumRoles>& count,
                                const std::array<uint64_t, kNumRoles>& used, uint32_t bytes) {
  for (int r = 0; r < kNumRoles; ++r) {
    regions_[family_region(family, static_cast<Role>(r))] = RegionInfo{at, count[r], used[r], bytes, true};
    at += count[r] * bytes;
  }
  return at;
}

// The same at the arena's end, which moves past them to the next aligned byte.
void MemoryPlan::place_packed(Family family, const std::array<uint64_t, kNumRoles>& count,
                              const std::array<uint64_t, kNumRoles>& used, uint32_t bytes) {
  arena_bytes_ = round_up(pack_roles(family, arena_bytes_, count, used, bytes), kRegionAlignBytes);
}

// A family of optimizer state in a plan that holds a slice of it (MemoryPlan::state_sliced):
// element e at base + bytes * e for e in [first, state_end_), stored compactly from the arena's
// end; base is computed past W and G, so it does not wrap.
void MemoryPlan::place_state_slice(Family family, const RoleTotals& roles) {
  const uint64_t first = state_begin_ / kPadElements * kPadElements;
  const uint32_t bytes = family_info(family).elem_bytes;
  pack_roles(family, arena_bytes_ - first * bytes, roles.padded, roles.elems, bytes);
  arena_bytes_ += round_up(round_up(state_end_ - first, kPadElements) * bytes, kRegionAlignBytes);
}

// W, G and then the other families the config holds, in kFamilyTable's order.
void MemoryPlan::place_families(const RoleTotals& roles) {
  if (!config_.has(Family::kW) || !config_.has(Family::kG)) throw_invalid("plan: every plan holds W and G");
  if (config_.has(Family::kVmax) && !config_.has(Family::kV)) {
    throw_invalid("plan: the VMAX family (amsgrad) needs the V family");
  }
  place_family(Family::kW, roles);
  if (config_.model_dtype_gradients) {
    if (config_.precision == Precision::kFp32) {
      throw_invalid("model-dtype gradients need a " + precision_names_text(true) +
                    " precision (fp32 gradients are the fp32 default)");
    }
    // G in the model dtype, packed like C_MODEL_COPY: role r starts family-element-offset * the
    // encoding's bytes in.
    place_packed(Family::kG, roles.padded, roles.elems, precision_bytes(config_.precision));
  } else {
    place_family(Family::kG, roles);
  }
  set_state_slice(std::accumulate(roles.padded.begin(), roles.padded.end(), uint64_t{0}));
  for (Family family : kFamiliesInOrder) {
    const FamilyInfo& info = family_info(family);
    if (info.order < 2 || !config_.has(family)) continue;
    if (info.extent == FamilyExtent::kPerTensor) {
      // One element per tensor, packed without per-role padding so that the weight group's
      // elements form one array indexed by TensorInfo::index_in_group (NormTile::tensor).
      place_packed(family, roles.tensors, roles.tensors, info.elem_bytes);
    } else if (info.optimizer_state && state_sliced()) {
      place_state_slice(family, roles);
    } else {
      place_family(family, roles);
    }
  }
}

std::vector<const TensorInfo*> MemoryPlan::weight_group_tensors() const {
  std::vector<const TensorInfo*> weight(group_tensor_count_[1], nullptr);
  for (const TensorInfo& t : tensors_) {
    if (group_of(t.spec.role) == Group::kWeight) weight[t.index_in_group] = &t;
  }
  return weight;
}

// The canonical norm tiles (math/norm_reduction.h) over the weight group's tensors, and their
// regions.
void MemoryPlan::place_norm_tiles() {
  const std::vector<const TensorInfo*> weight = weight_group_tensors();
  for (size_t k = 0; k < weight.size(); ++k) {
    const TensorInfo& t = *weight[k];
    NormTensor lt;
    lt.first_tile = static_cast<int64_t>(norm_tiles_.size());
    for (int64_t start = 0; start < t.numel; start += math::kNormTile) {
      NormTile tile;
      tile.start = static_cast<int64_t>(t.offset_in_group) + start;
      tile.length = static_cast<int32_t>(std::min<int64_t>(math::kNormTile, t.numel - start));
      tile.tensor = static_cast<int32_t>(k);
      norm_tiles_.push_back(tile);
    }
    lt.tile_count = static_cast<int64_t>(norm_tiles_.size()) - lt.first_tile;
    norm_tensors_.push_back(lt);
  }
  const uint64_t tiles = norm_tiles_.size();
  const uint64_t partials = math::kNormComponents * tiles;
  place(T_NORM_PARTIALS, partials, partials, sizeof(double));
  place(T_NORM_TILES, tiles, tiles, sizeof(NormTile));
  place(T_NORM_TENSORS, norm_tensors_.size(), norm_tensors_.size(), sizeof(NormTensor));
}

// Muon's regions after every other one (docs/design.md): U in the weight group span's layout,
// the matrix table, the scratch of the largest matrix.
void MemoryPlan::place_muon() {
  if (!config_.has(Family::kN)) throw_invalid("plan: muon needs the N family (each matrix's adjusted lr)");
  for (const TensorInfo* t : weight_group_tensors()) {
    MuonMatrix m = muon_matrix(t->spec.shape, config_.muon_adjust_lr);
    m.start = static_cast<int64_t>(t->offset_in_group);
    const uint64_t longer = static_cast<uint64_t>(std::max(m.rows, m.cols));
    if (t->numel > 0 && longer > math::kExactMatmulMaxK) {
      throw_invalid("muon: parameter '" + t->spec.name + "' viewed as a " + std::to_string(m.rows) + " x " +
                    std::to_string(m.cols) + " matrix is longer than the exact product's limit of " +
                    std::to_string(math::kExactMatmulMaxK));
    }
    if (t->numel > 0) {
      muon_scratch_floats_ = std::max(muon_scratch_floats_, renaissance::muon_scratch_floats(
                                                                static_cast<uint64_t>(m.rows), static_cast<uint64_t>(m.cols)));
    }
    muon_matrices_.push_back(m);
  }
  const uint64_t u_count = group_span(Family::kW, Group::kWeight).count;
  place(T_MUON_UPDATE, u_count, u_count, sizeof(float));
  place(T_MUON_MATRICES, muon_matrices_.size(), muon_matrices_.size(), sizeof(MuonMatrix));
  place(T_MUON_SCRATCH, muon_scratch_floats_, muon_scratch_floats_, sizeof(float));
}

void MemoryPlan::plan_tensor_tables() {
  has_views_ = true;
  const uint64_t family_first = regions_[W_BN_BIAS].offset;
  const int views = config_.gradient_table ? kNumTableViews : 2;
  for (int v = 0; v < views; ++v) {
    const TableView view = static_cast<TableView>(v);
    // The view's span in family elements, and its tensors (a group's by role, so that a tensor
    // of no elements belongs to its own group wherever it sits).
    uint64_t first = 0, count = family_elements_;
    if (view != TableView::kFamily) {
      const Span w = group_span(Family::kW, static_cast<Group>(v));
      first = (w.offset - family_first) / sizeof(float);
      count = w.count;
    }
    std::vector<CopyTensor> list;
    for (size_t id = 0; id < tensors_.size(); ++id) {
      const TensorInfo& t = tensors_[id];
      if (view != TableView::kFamily && static_cast<int>(group_of(t.spec.role)) != v) continue;
      list.push_back({t.offset_in_family - first, static_cast<uint64_t>(t.numel), id, 0});
    }
    // Span order: by start, then end (a tensor of no elements before the one starting where it
    // sits), so that the ends are ascending too.
    std::sort(list.begin(), list.end(), [](const CopyTensor& a, const CopyTensor& b) {
      if (a.begin != b.begin) return a.begin < b.begin;
      if (a.numel != b.numel) return a.numel < b.numel;
      return a.param < b.param;
    });
    const std::vector<int32_t> chunks = tensor_chunks(list, count);
    ViewRange& range = views_[static_cast<size_t>(v)];
    range.tensor_first = table_tensors_.size();
    range.tensor_count = list.size();
    range.chunk_first = table_chunks_.size();
    range.chunk_count = chunks.size();
    table_tensors_.insert(table_tensors_.end(), list.begin(), list.end());
    table_chunks_.insert(table_chunks_.end(), chunks.begin(), chunks.end());
  }
}

TensorTable MemoryPlan::tensor_table(TableView view) const {
  if (!has_views_ || (view == TableView::kFamily && !config_.gradient_table)) return TensorTable{};
  const ViewRange& range = views_[static_cast<size_t>(view)];
  return TensorTable{Span{regions_[T_TENSOR_LIST].offset + range.tensor_first * sizeof(CopyTensor), range.tensor_count},
                     Span{regions_[T_TENSOR_CHUNKS].offset + range.chunk_first * sizeof(int32_t), range.chunk_count}};
}

Span MemoryPlan::grad_chunk_addresses(TableView view) const {
  if (!config_.gradient_table) return Span{};
  const ViewRange& range = views_[static_cast<size_t>(view)];
  return Span{regions_[T_GRAD_CHUNKS].offset + range.chunk_first * sizeof(uint64_t), range.chunk_count};
}

void MemoryPlan::set_state_slice(uint64_t family_elements) {
  family_elements_ = family_elements;
  state_begin_ = 0;
  state_end_ = family_elements;
  if (config_.state_end == UINT64_MAX && config_.state_begin == 0) return;
  if (config_.state_begin > config_.state_end || config_.state_end > family_elements) {
    throw_invalid("plan: the optimizer-state slice [" + std::to_string(config_.state_begin) + ", " +
                  std::to_string(config_.state_end) + ") is not inside the family's " +
                  std::to_string(family_elements) + " elements");
  }
  state_begin_ = config_.state_begin;
  state_end_ = config_.state_end;
}

bool MemoryPlan::has_family(Family f) const {
  return regions_[family_region(f, Role::kBnBias)].allocated;
}

Span MemoryPlan::region_range(Region first, Region last) const {
  if (!is_family_region(first) || !is_family_region(last) || family_of(first) != family_of(last) ||
      last < first) {
    throw_invalid(std::string("region_range: ") + region_name(first) + ".." + region_name(last) +
                  " is not a span of one family");
  }
  if (!regions_[first].allocated) {
    throw_invalid(std::string("region_range: family of ") + region_name(first) + " is not allocated");
  }
  Span s;
  s.offset = regions_[first].offset;
  const RegionInfo& end = regions_[last];
  s.count = (end.offset - s.offset) / regions_[first].elem_size + end.count;
  return s;
}

Span MemoryPlan::group_span(Family family, Group group) const {
  return group == Group::kBiasLike
             ? region_range(family_region(family, Role::kBnBias), family_region(family, Role::kFcBias))
             : region_range(family_region(family, Role::kFcWeight),
                            family_region(family, Role::kDeepConv));
}

int MemoryPlan::block_of(size_t id) const {
  return config_.tensor_mask ? static_cast<int>(id) : tensors_.at(id).spec.hyper_group;
}

Span MemoryPlan::hyper_item_span(Group group) const {
  if (config_.hyper_groups == 1 && !config_.tensor_mask) return Span{};
  const uint64_t skip = group == Group::kWeight ? hyper_item_count_[0] : 0;
  return Span{regions_[T_HYPER_ITEMS].offset + skip * sizeof(HyperItem), hyper_item_count_[static_cast<int>(group)]};
}

std::vector<size_t> MemoryPlan::get_ids_by_region(Region region) const {
  std::vector<size_t> ids;
  if (!is_family_region(region)) return ids;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].spec.role == role_of(region)) ids.push_back(i);
  }
  return ids;
}

uint64_t MemoryPlan::tensor_offset(Family family, size_t id) const {
  if (!has_family(family)) {
    throw_invalid(std::string("family ") + family_name(family) + " is not allocated for this optimizer");
  }
  const TensorInfo& t = tensors_.at(id);
  if (family_info(family).extent == FamilyExtent::kPerTensor) {
    // One element per tensor: the regions are packed per group (place_families).
    const RegionInfo& first = regions_[family_region(family, group_of(t.spec.role) == Group::kWeight
                                                                 ? Role::kFcWeight
                                                                 : Role::kBnBias)];
    return first.offset + static_cast<uint64_t>(t.index_in_group) * first.elem_size;
  }
  const RegionInfo& first = regions_[family_region(family, Role::kBnBias)];
  return first.offset + t.offset_in_family * first.elem_size;
}

std::string MemoryPlan::describe() const {
  std::ostringstream os;
  for (int r = 0; r < kNumRegions; ++r) {
    const RegionInfo& info = regions_[r];
    if (!info.allocated) continue;
    os << region_name(static_cast<Region>(r)) << " offset " << info.offset << " count " << info.count
       << " used " << info.used << "\n";
  }
  os << "arena " << arena_bytes_ << " bytes\n";
  return os.str();
}

Span MemoryPlan::model_copy_group_span(Group group) const {
  if (!has_model_copy()) throw_invalid("this plan has no model copy (precision fp32)");
  const Span w = group_span(Family::kW, group);
  const uint64_t first = (w.offset - regions_[W_BN_BIAS].offset) / sizeof(float);
  return Span{regions_[C_MODEL_COPY].offset + first * precision_bytes(config_.precision), w.count};
}

uint64_t MemoryPlan::model_copy_offset(size_t id) const {
  if (!has_model_copy()) throw_invalid("this plan has no model copy (precision fp32)");
  return regions_[C_MODEL_COPY].offset + tensor(id).offset_in_family * precision_bytes(config_.precision);
}

}  // namespace renaissance
