// The partition of a memory plan over K ranks (docs/distributed.md): cuts on grad-norm tile
// boundaries, moved down to the start of a norm tile where one would split it, so that every
// tile of both canonical reductions has exactly one owner and no kernel needs a partial tile;
// for Muon first moved to the nearer end of a matrix, so that each matrix has one owner; then
// moved down until they split no work item (hyperparameter groups, the per-tensor mask), no tile
// and no matrix and fall on a multiple of four elements (the CUDA kernels' 16-byte vectors).
#include <algorithm>
#include <iterator>

#include "renaissance/error.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/name_table.h"
#include "renaissance/ops.h"
#include "renaissance/shard_layout.h"

namespace renaissance {

namespace {
constexpr NameRow<GradReduce> kGradReduces[] = {
    {GradReduce::kReplicated, "replicated"}, {GradReduce::kOrdered, "ordered"}, {GradReduce::kFast, "fast"}};
static_assert(rows_in_enum_order(kGradReduces), "kGradReduces: one row per enumerator, in enum order");
}  // namespace

const char* grad_reduce_name(GradReduce mode) { return name_of(kGradReduces, mode, "replicated"); }
bool parse_grad_reduce(const std::string& text, GradReduce* out) { return parse_by_name(kGradReduces, text, out); }

namespace {

// The start (in family elements) of the HyperItem holding element c, or c when none does
// (padding, or past the last item).
uint64_t item_start_at_or_below(const MemoryPlan& plan, uint64_t c) {
  const uint64_t family = plan.region_range(W_BN_BIAS, W_DEEP_CONV).offset;
  for (Group group : {Group::kBiasLike, Group::kWeight}) {
    const uint64_t first = (plan.group_span(Family::kW, group).offset - family) / sizeof(float);
    const Span items = plan.hyper_item_span(group);
    const HyperItem* all = plan.hyper_items_in(items);
    for (uint64_t k = 0; k < items.count; ++k) {
      const uint64_t b = first + static_cast<uint64_t>(all[k].start), e = b + static_cast<uint64_t>(all[k].count);
      if (c > b && c < e) return b;
    }
  }
  return c;
}

}  // namespace

ShardLayout make_shard_layout(const MemoryPlan& plan, int world_size) {
  if (world_size < 1) throw_invalid("a world needs at least one rank, got " + std::to_string(world_size));
  ShardLayout layout;
  layout.world_size = world_size;
  const Span g = plan.region_range(G_BN_BIAS, G_DEEP_CONV);
  const uint64_t count = g.count;
  layout.family_count = count;
  const uint64_t tile = static_cast<uint64_t>(math::kGradNormTile);
  const uint64_t grad_tiles = static_cast<uint64_t>(math::grad_norm_tile_count(count));
  // Norm tiles in family elements (their starts are relative to the weight group). Counted in W,
  // whose elements are always 4 bytes (G's are 2 with model-dtype gradients).
  const uint64_t weight_start = (plan.group_span(Family::kW, Group::kWeight).offset -
                                 plan.region_range(W_BN_BIAS, W_DEEP_CONV).offset) / sizeof(float);
  const std::vector<NormTile>& norm = plan.norm_tiles();
  auto norm_start = [&](size_t i) { return weight_start + static_cast<uint64_t>(norm[i].start); };

  // Muon: the first elements of the non-empty matrices (plan order is family order) that are
  // multiples of kShardCutAlign, then the weight group's end. An extent runs from one such start
  // to the next (its padding included, and any matrix that starts off the alignment, which
  // without work items the plan packs right after the one before it), so that a cut moved to
  // either end splits no matrix and no per-tensor item and is aligned. The weight group starts
  // and ends on 64 elements, so the first non-empty matrix starts an extent.
  std::vector<uint64_t> bounds;
  const std::vector<MuonMatrix>& matrices = plan.muon_matrices();
  uint64_t previous = 0;
  for (const MuonMatrix& m : matrices) {
    const uint64_t at = weight_start + static_cast<uint64_t>(m.start);
    if (at < previous) throw_invalid("make_shard_layout: muon matrices out of family order");
    previous = at;
    if (m.rows > 0 && m.cols > 0 && at % kShardCutAlign == 0 && (bounds.empty() || at > bounds.back())) {
      bounds.push_back(at);
    }
  }
  if (!bounds.empty()) bounds.push_back(weight_start + plan.group_span(Family::kW, Group::kWeight).count);

  // A cut inside a norm tile moves down to that tile's start (tiles are sorted by start).
  auto norm_tile_start_at_or_below = [&](uint64_t c) {
    const auto it = std::upper_bound(norm.begin(), norm.end(), c, [&](uint64_t v, const NormTile& t) {
      return v < weight_start + static_cast<uint64_t>(t.start);
    });
    if (it != norm.begin()) {
      const size_t i = static_cast<size_t>(it - norm.begin()) - 1;
      if (c > norm_start(i) && c < norm_start(i) + static_cast<uint64_t>(norm[i].length)) return norm_start(i);
    }
    return c;
  };
  const bool items = plan.config().tensor_mask || plan.config().hyper_groups > 1;

  std::vector<uint64_t> cuts(static_cast<size_t>(world_size) + 1);
  cuts[0] = 0;
  cuts[static_cast<size_t>(world_size)] = count;
  for (int r = 1; r < world_size; ++r) {
    uint64_t c = std::min(count, grad_tiles * static_cast<uint64_t>(r) / static_cast<uint64_t>(world_size) * tile);
    // Muon: a cut strictly inside a matrix's extent moves to the nearer end of it (its start on a
    // tie), so that each matrix has one owner holding all of it. Rule 2 then finds the cut on a
    // norm tile's start, rule 3 on an item's.
    const auto above = std::upper_bound(bounds.begin(), bounds.end(), c);
    if (above != bounds.begin() && above != bounds.end() && *std::prev(above) < c) {
      const uint64_t lo = *std::prev(above), hi = *above;
      c = c - lo <= hi - c ? lo : hi;
    }
    c = norm_tile_start_at_or_below(c);
    // Rule A: a cut that is not a multiple of kShardCutAlign elements moves down to one (a norm
    // tile of a tensor packed off the alignment starts off it too). A plan with work items
    // (hyperparameter groups, TaskOptions::tensor_mask): a cut inside a HyperItem moves down to
    // its start, so that a rank's sub-steps walk whole items (ShardedStep). An item of a run of
    // several tensors (H > 1) may start inside a norm tile (a Muon plan's matrices are runs of
    // their own, so rule M's ends are item starts). The four rules are applied, each moving the
    // cut down, until none moves it: the largest cut at or below this one that is aligned and
    // splits no item, tile or matrix (the group starts qualify). Where rules 1, M and 2 gave an
    // aligned cut outside every item, none moves it.
    for (uint64_t before = count + 1; before != c;) {
      before = c;
      c = c / kShardCutAlign * kShardCutAlign;
      if (items) c = item_start_at_or_below(plan, c);
      c = norm_tile_start_at_or_below(c);
      const auto in = std::upper_bound(bounds.begin(), bounds.end(), c);
      if (in != bounds.begin() && in != bounds.end() && *std::prev(in) < c) c = *std::prev(in);
    }
    cuts[static_cast<size_t>(r)] = c;
  }
  auto first_norm_tile_at_or_after = [&](uint64_t e) {
    return static_cast<int64_t>(std::lower_bound(norm.begin(), norm.end(), e, [&](const NormTile& t, uint64_t v) {
                                  return weight_start + static_cast<uint64_t>(t.start) < v;
                                }) - norm.begin());
  };
  for (int r = 0; r < world_size; ++r) {
    RankShard s;
    s.begin = cuts[static_cast<size_t>(r)];
    s.end = cuts[static_cast<size_t>(r) + 1];
    // Grad-norm tile t belongs to the rank whose slice holds its first element.
    s.grad_tile_begin = static_cast<int64_t>((s.begin + tile - 1) / tile);
    s.grad_tile_end = static_cast<int64_t>((s.end + tile - 1) / tile);
    s.grad_end = s.end;
    if (s.grad_tile_end > s.grad_tile_begin) {
      s.grad_end = std::max(s.end, std::min(count, static_cast<uint64_t>(s.grad_tile_end) * tile));
    }
    s.norm_tile_begin = first_norm_tile_at_or_after(s.begin);
    s.norm_tile_end = first_norm_tile_at_or_after(s.end);
    // Muon matrix t belongs to the rank whose slice holds its first element: the matrices that
    // start before this slice belong to earlier ranks (the last rank takes the rest).
    auto matrices_before = [&](uint64_t e) {
      int64_t n = 0;
      for (const MuonMatrix& m : matrices) n += weight_start + static_cast<uint64_t>(m.start) < e ? 1 : 0;
      return n;
    };
    s.muon_matrix_begin = r == 0 ? 0 : matrices_before(s.begin);
    s.muon_matrix_end = r + 1 == world_size ? static_cast<int64_t>(matrices.size()) : matrices_before(s.end);
    layout.ranks.push_back(s);
  }
  return layout;
}

std::string unaligned_span(const CompiledStep& step, const MemoryPlan& plan) {
  auto misfit = [](Span span, uint64_t elem) {
    return span.count > 0 && (span.offset % (kShardCutAlign * elem) != 0 || span.count % kShardCutAlign != 0);
  };
  auto describe = [](const GraphNode& node, const char* family, Span span, uint64_t elem) {
    return std::string(range_op_name(node.range_op)) + " reads " + family + " from arena byte " +
           std::to_string(span.offset) + ", " + std::to_string(span.count) + " elements of " + std::to_string(elem) +
           " bytes: not a whole number of " + std::to_string(kShardCutAlign) + "-element vectors on their alignment";
  };
  for (const std::vector<GraphNode>& graph : step.graphs) {
    for (const GraphNode& node : graph) {
      if (node.kind != NodeKind::kRange) continue;
      for (const FamilyInfo& f : kFamilyTable) {
        if (f.extent != FamilyExtent::kPerElement) continue;
        const Span span = node.span(f.family);
        if (span.count == 0) continue;
        const uint64_t elem = plan.region(family_region(f.family, Role::kBnBias)).elem_size;
        if (misfit(span, elem)) return describe(node, f.name, span, elem);
      }
      if (misfit(node.muon.update, sizeof(float))) {
        return describe(node, "U", node.muon.update, sizeof(float));
      }
    }
  }
  return "";
}

PlanConfig slice_plan_config(const MemoryPlan& whole, const StateShard& shard) {
  if (shard.world_size < 1 || shard.rank < 0 || shard.rank >= shard.world_size) {
    throw_invalid("state_shard: rank " + std::to_string(shard.rank) + " of a world of " +
                  std::to_string(shard.world_size) + " does not exist");
  }
  if (whole.state_sliced()) throw_invalid("slice_plan_config: the plan already holds a slice of M and V");
  PlanConfig config = whole.config();
  const RankShard s = make_shard_layout(whole, shard.world_size).ranks[static_cast<size_t>(shard.rank)];
  config.state_begin = s.begin;
  config.state_end = s.end;
  return config;
}

}  // namespace renaissance
