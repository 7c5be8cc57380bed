// ShardedStep: one rank's part of a data-parallel step (docs/distributed.md). The compiled step
// of the Task is cut into three sub-steps whose range nodes cover only this rank's slice (or
// its tiles); the backend runs them unchanged, and the communicator joins them:
//   reduce G -> [check / clip partials] -> max flag, gather grad-norm partials
//   -> [step counter, clip coefficient, norm partials] -> gather norm partials
//   -> [trust ratios, updates] -> gather W (and the bf16/fp16 model copy, which the update
//   nodes write for the slice only, each element with its own rounding key).
// Compute nodes (the step counter, the clip coefficient, the trust ratios) run whole on every
// rank over the gathered partials, so every rank holds the values one device computes. Muon's
// Newton–Schulz node runs on the matrices this rank owns (whole matrices: the partition cuts
// none), and their adjusted lrs in N are gathered with W.
#include <algorithm>
#include <cstring>
#include <exception>

#include "renaissance/error.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/math/precision.h"
#include "renaissance/scalars.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"

namespace renaissance {

namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "local"; }
  void all_gather_v(void*, const std::vector<uint64_t>&, const std::vector<uint64_t>&) override {}
  void all_to_all_v(const void* send, const std::vector<uint64_t>& so, const std::vector<uint64_t>& sc, void* recv,
                    const std::vector<uint64_t>& ro, const std::vector<uint64_t>&) override {
    std::copy_n(static_cast<const char*>(send) + so[0], sc[0], static_cast<char*>(recv) + ro[0]);
  }
  void reduce_scatter_sum_f32(const float* send, float* recv, const std::vector<uint64_t>& counts) override {
    std::copy_n(send, counts[0], recv);
  }
  void all_reduce_max_i32(int32_t*, uint64_t) override {}
  void barrier() override {}
};

// Shifts a span by `skip` elements of `elem` bytes and sets its count.
Span sub_span(Span s, uint64_t skip, uint64_t count, uint64_t elem) {
  s.offset += skip * elem;
  s.count = count;
  return s;
}

// Bytes of one G element: 4 (fp32), or the model dtype's with model-dtype gradients (PlanConfig::
// model_dtype_gradients: G packed in the model dtype, element e at e * bytes from the family's start).
uint64_t grad_element_bytes(const MemoryPlan& plan) {
  return plan.config().model_dtype_gradients ? precision_bytes(plan.config().precision) : sizeof(float);
}


// Bytes of one element of `family` in this plan: its regions' element size (kFamilyTable's
// elem_bytes; G's is 2 with model-dtype gradients).
uint64_t element_bytes(const MemoryPlan& plan, Family family) {
  return plan.region(family_region(family, Role::kBnBias)).elem_size;
}

// Calls fn(span, element bytes) for each non-empty span of `node` in a per-element family
// (kFamilyTable: W, G and every optimizer-state family; not N's per-tensor ratios), the spans a
// slice of elements cuts.
template <class Fn>
void for_each_element_span(GraphNode& node, const MemoryPlan& plan, Fn&& fn) {
  for (const FamilyInfo& f : kFamilyTable) {
    Span& span = node.span(f.family);
    if (f.extent == FamilyExtent::kPerElement && span.count > 0) fn(span, element_bytes(plan, f.family));
  }
}

// The node cut to this rank: element-wise updates and the check to the slice, tile-wise nodes
// to the owned tiles. A rank that owns nothing of a node keeps it with empty spans: the check
// must still write this rank's flag (0) before the flags are combined.
// Hyperparameter groups or TaskOptions::tensor_mask: the items of `items` (a group's HyperItems,
// starts relative to the group's first element `group_first` of the family) that lie in
// [s.begin, s.end). The layout cuts a plan with items on item starts (make_shard_layout), so no
// item is split.
Span items_in_slice(const MemoryPlan& plan, Span items, uint64_t group_first, const RankShard& s) {
  const HyperItem* all = plan.hyper_items_in(items);
  uint64_t first = 0;
  while (first < items.count && group_first + static_cast<uint64_t>(all[first].start) < s.begin) ++first;
  uint64_t last = first;
  while (last < items.count && group_first + static_cast<uint64_t>(all[last].start) < s.end) ++last;
  return Span{items.offset + first * sizeof(HyperItem), last - first};
}

void cut_node(GraphNode* node, const MemoryPlan& plan, const RankShard& s) {
  if (node->kind == NodeKind::kCompute && node->compute_op == ComputeOp::MUON_ORTHOGONALIZE) {
    // Newton–Schulz on the owned matrices only: their rows of the matrix table, of N and of the
    // scalar blocks (U stays whole: each matrix addresses it from the weight group's start).
    const uint64_t first = static_cast<uint64_t>(s.muon_matrix_begin);
    const uint64_t owned = static_cast<uint64_t>(s.muon_matrix_end - s.muon_matrix_begin);
    node->muon.matrices = sub_span(node->muon.matrices, first, owned, sizeof(MuonMatrix));
    node->span(Family::kN) = sub_span(node->span(Family::kN), first, owned, sizeof(float));
    if (node->work.tensor_blocks.count > 0) {
      node->work.tensor_blocks = sub_span(node->work.tensor_blocks, first, owned, sizeof(int32_t));
    }
    return;
  }
  if (node->kind != NodeKind::kRange) return;
  const uint64_t g0 = plan.region_range(G_BN_BIAS, G_DEEP_CONV).offset;
  const uint64_t ge = grad_element_bytes(plan);  // G's element: 4 bytes, or 2 in the model dtype
  // The masked check walks each group's items over the group's whole G span: only the items of
  // the slice stay (the rest of G is not reduced on this rank). (GRAD_NORM_PARTIALS keeps its
  // tables whole: it reads them only to zero the masked tensors' elements of its own tiles.)
  if (node->range_op == RangeOp::CHECK_FINITE && node->work.tensor_state.count > 0) {
    for (int group = 0; group < 2; ++group) {
      node->work.group_items[group] =
          items_in_slice(plan, node->work.group_items[group], (node->work.group_g[group].offset - g0) / ge, s);
    }
  }
  if (node->range_op == RangeOp::GRAD_NORM_PARTIALS) {
    const uint64_t tile = static_cast<uint64_t>(math::kGradNormTile);
    const uint64_t first = static_cast<uint64_t>(s.grad_tile_begin) * tile;
    const uint64_t tiles = static_cast<uint64_t>(s.grad_tile_end - s.grad_tile_begin);
    const uint64_t end = std::min(node->span(Family::kG).count, static_cast<uint64_t>(s.grad_tile_end) * tile);
    node->span(Family::kG) = sub_span(node->span(Family::kG), first, tiles ? end - first : 0, ge);
    node->norm.partials = sub_span(node->norm.partials, static_cast<uint64_t>(s.grad_tile_begin), tiles, sizeof(double));
    return;
  }
  if (node->norm.tiles.count > 0) {  // NORM_TILE_PARTIALS and the tile-wise (LARS, LAMB) updates
    const uint64_t first = static_cast<uint64_t>(s.norm_tile_begin);
    const uint64_t tiles = static_cast<uint64_t>(s.norm_tile_end - s.norm_tile_begin);
    node->norm.tiles = sub_span(node->norm.tiles, first, tiles, sizeof(NormTile));
    node->norm.partials = sub_span(node->norm.partials, math::kNormComponents * first,
                                   math::kNormComponents * tiles, sizeof(double));
    // The tiles address the whole group: the copy stays whole too (the kernels write the copy
    // of the elements of their tiles only).
    return;
  }
  if (node->work.hyper_items.count > 0) {
    // An element-wise update over work items (H > 1, the masked program): the spans stay whole
    // (the items address elements from the group's start), the items shrink to the slice's.
    node->work.hyper_items = items_in_slice(plan, node->work.hyper_items, (node->span(Family::kG).offset - g0) / ge, s);
    if (node->work.hyper_items.count == 0) {
      // No item of this group in the slice: nothing to update (a node without items would walk
      // the whole group span).
      for_each_element_span(*node, plan, [](Span& span, uint64_t) { span.count = 0; });
      node->muon.update.count = 0;  // (MUON_MOMENTUM's U, walked as V is)
      node->copy = ModelCopy{};
    }
    return;
  }
  // Element-wise over one span of G (the check) or of one group in every family.
  const uint64_t start = (node->span(Family::kG).offset - g0) / ge;
  const uint64_t lo = std::max(start, s.begin), hi = std::max(lo, std::min(start + node->span(Family::kG).count, s.end));
  const uint64_t skip = lo - start, n = hi - lo;
  for_each_element_span(*node, plan, [&](Span& span, uint64_t elem) { span = sub_span(span, skip, n, elem); });
  // MUON_MOMENTUM writes U element by element, in the weight group's layout.
  if (node->muon.update.count && node->range_op == RangeOp::MUON_MOMENTUM) {
    node->muon.update = sub_span(node->muon.update, skip, n, sizeof(float));
  }
  if (node->copy.c.count) node->copy = cut_model_copy(node->copy, skip, skip + n);
}

CompiledStep empty_like(const CompiledStep& step) {
  CompiledStep s;
  s.check_finite = step.check_finite;
  s.clip = step.clip;
  s.scalars_f32 = step.scalars_f32;
  s.scalars_i32 = step.scalars_i32;
  s.scalars_f64 = step.scalars_f64;
  return s;
}

// Brackets one communication phase of the step (Communicator::begin_timing / end_timing).
class CommTimer {
 public:
  explicit CommTimer(Communicator& comm) : comm_(comm) { comm_.begin_timing(); }
  ~CommTimer() { comm_.end_timing(); }

 private:
  Communicator& comm_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

void synthesize_rank_sum(Task& task, uint64_t seed, uint64_t step, float amplitude, int ranks) {
  if (ranks < 1) throw_invalid("--simulate-ranks must be >= 1, got " + std::to_string(ranks));
  // Model-dtype gradients: each rank's values widened exactly, summed in fp32, the mean rounded
  // to nearest even into G's dtype (math::load_grad / store_grad), as ShardedStep's ordered
  // reduction (Backend::reduce_ranks) does.
  const Precision dtype = task.grad_dtype();
  const uint64_t bytes = grad_element_bytes(task.plan());
  const Span g = task.plan().region_range(G_BN_BIAS, G_DEEP_CONV);
  std::vector<float> sum(g.count);
  std::vector<char> rank_g(g.count * bytes);
  for (int r = 0; r < ranks; ++r) {
    task.synthesize_gradients(rank_gradient_seed(seed, r), step, amplitude);
    task.backend().download(g.offset, rank_g.data(), rank_g.size());
    for (uint64_t i = 0; i < g.count; ++i) {
      const float x = math::load_grad(dtype, rank_g.data(), i);
      sum[i] = r == 0 ? x : ordered_rank_add(sum[i], x);
    }
  }
  for (uint64_t i = 0; i < g.count; ++i) math::store_grad(dtype, rank_g.data(), i, ordered_rank_mean(sum[i], ranks));
  task.backend().upload(g.offset, rank_g.data(), rank_g.size());
}

ShardedStep::ShardedStep(Task& task, Communicator& comm, GradReduce mode)
    : task_(task), comm_(comm), mode_(mode) {
  // The communicator moves the backend's own memory: host (MPI) for CPU ranks, device (NCCL) for
  // CUDA ranks.
  const bool device = task.backend().kind() == BackendKind::kCuda;
  if (device != comm.device_memory()) {
    throw_invalid(device ? "a sharded step of a CUDA task needs a communicator on device memory (NCCL)"
                         : "a sharded step of a CPU task needs a communicator on host memory (MPI)");
  }
  const MemoryPlan& plan = task.plan();
  // The ranks reduce each other's gradients in the arena's G (Backend::reduce_ranks).
  if (plan.config().gradient_table) {
    throw_invalid("a sharded step reduces gradients in the arena's G: a task with gradient_table cannot run one");
  }
  // Hyperparameter groups (H > 1): the element-wise updates walk per-run work items, which the
  // layout never splits (make_shard_layout cuts on item starts): cut_node keeps the items of the
  // slice, as for tensor_mask. The tile-wise nodes and Muon's matrices find each tensor's scalar
  // block in the whole tensor_blocks table; the step's compute nodes write every block.
  // TaskOptions::tensor_mask: both programs are cut (the mask is whole on every rank, as are the
  // per-tensor counts, which the compute nodes advance whole); step() runs the one Task::step
  // would run. Only the masked program is placed below: the unmasked one touches the same slice.
  layout_ = make_shard_layout(plan, comm.size());
  timed_base_ = comm.timed_seconds();
  const RankShard& s = shard();
  const CompiledStep& step = task.compiled_step();
  cut_program(step, &programs_[0]);
  // (Built after a masked step, step_program() is the masked program again: [1] then gives its
  // bits, which on a mask of zeros and equal counts are the unmasked one's, at its speed.)
  if (plan.config().tensor_mask) cut_program(task.step_program(), &programs_[1]);
  // The CUDA kernels walk each span in 16-byte vectors from its first element (no scalar head):
  // the layout's cuts are multiples of kShardCutAlign elements (rule A), so every cut span is
  // aligned; a span that is not would be a misaligned access on a GPU rank.
  for (const SubSteps& program : programs_) {
    for (const CompiledStep* sub : {&program.check, &program.combine, &program.update}) {
      const std::string bad = unaligned_span(*sub, plan);
      if (!bad.empty()) {
        throw Error(ErrorKind::kBackend, "sharded step: rank " + std::to_string(comm.rank()) + " of " +
                                             std::to_string(comm.size()) + ", slice [" + std::to_string(s.begin) +
                                             ", " + std::to_string(s.end) + "): " + bad);
      }
    }
  }
  const SubSteps& placed = programs_[0];
  if (plan.state_sliced()) {
    // The task holds M and V of one slice: it must be this rank's (TaskOptions::state_shard).
    if (plan.state_begin() != s.begin || plan.state_end() != s.end) {
      throw_invalid("sharded step: the task holds the optimizer state of elements [" + std::to_string(plan.state_begin()) +
                    ", " + std::to_string(plan.state_end()) + "), rank " + std::to_string(comm.rank()) + " of " +
                    std::to_string(comm.size()) + " owns [" + std::to_string(s.begin) + ", " + std::to_string(s.end) +
                    "): compile it with TaskOptions::state_shard = {" + std::to_string(comm.rank()) + ", " +
                    std::to_string(comm.size()) + "}");
    }
    // Task::compile left the backend unprepared (its whole step leaves the slice): place the
    // arena's pages with the spans this rank's sub-steps touch.
    // A tile-wise node keeps its group's whole spans (its tiles address elements from the group's
    // start): for the placement only, they shrink to the elements of this rank's tiles.
    CompiledStep all = empty_like(step);
    const std::vector<NormTile>& tiles = plan.norm_tiles();
    for (const CompiledStep* sub : {&placed.check, &placed.combine, &placed.update}) {
      for (int graph = 0; graph < kNumGraphs; ++graph) {
        for (GraphNode node : sub->graphs[graph]) {
          // (cut_node leaves a tile-wise node's table offset set, also with no tiles left.)
          if (node.kind == NodeKind::kRange && node.norm.tiles.offset != 0 &&
              node.range_op != RangeOp::GRAD_NORM_PARTIALS) {
            uint64_t lo = 0, hi = 0;
            if (s.norm_tile_end > s.norm_tile_begin) {
              lo = static_cast<uint64_t>(tiles[static_cast<size_t>(s.norm_tile_begin)].start);
              const NormTile& last = tiles[static_cast<size_t>(s.norm_tile_end - 1)];
              hi = static_cast<uint64_t>(last.start) + static_cast<uint64_t>(last.length);
            }
            for_each_element_span(node, plan, [&](Span& span, uint64_t elem) { span = sub_span(span, lo, hi - lo, elem); });
          } else if (node.kind == NodeKind::kRange && node.work.hyper_items.count > 0) {
            // An update over the slice's items (tensor_mask) keeps its group's whole spans: for
            // the placement, they shrink to the items' elements.
            const HyperItem* items = plan.hyper_items_in(node.work.hyper_items);
            const HyperItem& last = items[node.work.hyper_items.count - 1];
            const uint64_t lo = static_cast<uint64_t>(items[0].start);
            const uint64_t hi = static_cast<uint64_t>(last.start) + static_cast<uint64_t>(last.count);
            for_each_element_span(node, plan, [&](Span& span, uint64_t elem) { span = sub_span(span, lo, hi - lo, elem); });
          }
          all.graphs[graph].push_back(node);
        }
      }
    }
    // (CPU page placement; the CUDA backend runs the sub-steps without a captured graph.)
    if (!device) task.backend().prepare(all);
  }
}

// Sub-steps keep the single-device node order: range nodes of the pre-step graph, its compute
// node, the norm graph's tile partials, its ratios, then the updates. A node stays in the graph it
// came from, so that a backend that joins its streams between graphs (CUDA) orders the sub-step's
// parts as the whole step does.
void ShardedStep::cut_program(const CompiledStep& step, SubSteps* out) {
  const MemoryPlan& plan = task_.plan();
  const RankShard& s = shard();
  out->check = empty_like(step);
  out->combine = empty_like(step);
  out->update = empty_like(step);
  auto add = [&](CompiledStep* sub, GraphId graph, GraphNode node) {
    cut_node(&node, plan, s);
    sub->graphs[static_cast<int>(graph)].push_back(node);
  };
  for (const GraphNode& node : step.graphs[static_cast<int>(GraphId::kPreStep)]) {
    add(node.kind == NodeKind::kRange ? &out->check : &out->combine, GraphId::kPreStep, node);
  }
  for (const GraphNode& node : step.graphs[static_cast<int>(GraphId::kNorms)]) {
    add(node.kind == NodeKind::kRange ? &out->combine : &out->update, GraphId::kNorms, node);
  }
  for (const GraphNode& node : step.graphs[static_cast<int>(GraphId::kOptimizer)]) {
    add(&out->update, GraphId::kOptimizer, node);
  }
}

// The reduction works in rounds of at most reduce_chunk_ elements of every rank's range, so its
// buffers hold K * reduce_chunk_ elements whatever the model's size: a rank's memory is W, G, its
// slice of M and V, and a few MiB (docs/distributed.md, "Memory per rank"). G's elements are
// fp32 or, with model-dtype gradients, 2-byte encodings: the collectives move them as they are
// (E bytes each), every sum and mean is formed in fp32 on widened values, and the result is
// stored in G's dtype. The arithmetic runs on the backend (Backend::reduce_ranks, over G and the
// communicator's workspace), so on CUDA nothing goes through the host.
void ShardedStep::reduce_gradients() {
  if (mode_ == GradReduce::kReplicated) return;
  Backend& backend = task_.backend();
  const int K = comm_.size();
  const RankShard& me = shard();
  const Precision dtype = task_.grad_dtype();
  const uint64_t E = grad_element_bytes(task_.plan());
  const uint64_t g0 = task_.plan().region_range(G_BN_BIAS, G_DEEP_CONV).offset;
  char* g = static_cast<char*>(backend.arena()) + g0;
  const uint64_t C = reduce_chunk_;
  std::vector<uint64_t> so(K), sc(K), ro(K), rc(K);
  // Elements of range [lo, hi) in round j.
  auto in_round = [&](uint64_t lo, uint64_t hi, uint64_t j) {
    const uint64_t off = j * C;
    return hi - lo > off ? std::min(C, hi - lo - off) : uint64_t{0};
  };
  if (mode_ == GradReduce::kOrdered) {
    // Every rank sends each rank r its own gradient over r's range [begin, grad_end), a round at
    // a time; rank q's part lands at q * (this round's count) of the landing buffer.
    uint64_t longest = 0;
    for (const RankShard& o : layout_.ranks) longest = std::max(longest, o.grad_end - o.begin);
    // A mean is written into G at once unless another rank still sends from that element: those
    // of the head of this range (in earlier ranks' halos) and of its halo (in later ranks'
    // slices) wait, encoded, in `head` and `tail` of the workspace until the last round (less
    // than one grad-norm tile each).
    uint64_t head_end = me.begin;
    for (int r = 0; r < comm_.rank(); ++r) head_end = std::max(head_end, std::min(layout_.ranks[r].grad_end, me.grad_end));
    const uint64_t tail_begin = std::max(me.end, head_end);
    const uint64_t most = std::min(C, longest);
    char* landed = static_cast<char*>(
        comm_.workspace((static_cast<uint64_t>(K) * most + (head_end - me.begin) + (me.grad_end - tail_begin)) * E));
    char* head = landed + static_cast<uint64_t>(K) * most * E;
    char* tail = head + (head_end - me.begin) * E;
    for (uint64_t j = 0; j * C < longest; ++j) {
      const uint64_t mine = in_round(me.begin, me.grad_end, j), off = j * C;
      for (int r = 0; r < K; ++r) {
        const RankShard& o = layout_.ranks[static_cast<size_t>(r)];
        const uint64_t n = in_round(o.begin, o.grad_end, j);
        so[r] = n ? (o.begin + off) * E : 0;
        sc[r] = n * E;
        ro[r] = static_cast<uint64_t>(r) * mine * E;
        rc[r] = mine * E;
      }
      join();
      comm_.all_to_all_v(g, so, sc, landed, ro, rc);
      join();
      // This round's elements [rb, re) of G: the means of [lo, hi) into `dst` at element lo - at.
      const uint64_t rb = me.begin + off, re = rb + mine;
      auto mean = [&](uint64_t lo, uint64_t hi, char* dst, uint64_t at) {
        lo = std::max(lo, rb);
        hi = std::min(hi, re);
        if (hi <= lo) return;
        math::RankReduce op;
        op.blocks = landed;
        op.stride = mine;
        op.first = lo - rb;
        op.count = hi - lo;
        op.summands = K;
        op.divisor = K;
        op.in = op.out = dtype;
        op.dst = dst + (lo - at) * E;
        backend.reduce_ranks(op);
      };
      mean(me.begin, head_end, head, me.begin);
      mean(head_end, tail_begin, g, 0);  // the means no other rank still sends from: into G now
      mean(tail_begin, me.grad_end, tail, tail_begin);
    }
    join();
    comm_.copy(g + me.begin * E, head, (head_end - me.begin) * E);
    comm_.copy(g + tail_begin * E, tail, (me.grad_end - tail_begin) * E);
    join();
    return;
  }
  // kFast: the engine's reduce-scatter of the slices (fp32: model-dtype blocks are widened
  // first), a round at a time (each rank's block of the round packed after the previous one),
  // / K into G's dtype; then the halo (the rest of the last owned grad-norm tile) from the ranks
  // that own those elements.
  uint64_t longest = 0;
  for (const RankShard& o : layout_.ranks) longest = std::max(longest, o.end - o.begin);
  std::vector<uint64_t> counts(K);
  // What this rank sends to r: its slice ∩ r's halo [r.end, r.grad_end), packed (E bytes an
  // element, G's own encoding); it receives the other ranks' slices ∩ its own halo in place.
  uint64_t halo_bytes = 0;
  for (int r = 0; r < K; ++r) {
    const RankShard& other = layout_.ranks[static_cast<size_t>(r)];
    const uint64_t slo = std::max(me.begin, other.end), shi = std::min(me.end, other.grad_end);
    so[r] = halo_bytes;
    if (shi > slo) halo_bytes += (shi - slo) * E;
    sc[r] = halo_bytes - so[r];
    const uint64_t rlo = std::max(other.begin, me.end), rhi = std::min(other.end, me.grad_end);
    ro[r] = rhi > rlo ? rlo * E : 0;
    rc[r] = rhi > rlo ? (rhi - rlo) * E : 0;
  }
  // The packed blocks, the reduced one and the halo's send buffer (a valid address when nothing
  // is sent: one float more) in the communicator's memory.
  const uint64_t most = std::min(C, longest);
  float* pack = static_cast<float*>(
      comm_.workspace((static_cast<uint64_t>(K) + 1) * most * sizeof(float) + halo_bytes + sizeof(float)));
  float* reduced = pack + static_cast<uint64_t>(K) * most;
  char* send = reinterpret_cast<char*>(reduced + most);
  for (uint64_t j = 0; j * C < longest; ++j) {
    join();
    uint64_t packed = 0;
    for (int r = 0; r < K; ++r) {
      const RankShard& o = layout_.ranks[static_cast<size_t>(r)];
      counts[r] = in_round(o.begin, o.end, j);
      const char* block = g + (o.begin + j * C) * E;
      if (E == sizeof(float)) {
        comm_.copy(pack + packed, block, counts[r] * sizeof(float));
      } else {
        math::RankReduce widen;  // one summand, no division: each value widened as it is
        widen.blocks = block;
        widen.count = counts[r];
        widen.in = dtype;
        widen.dst = pack + packed;
        backend.reduce_ranks(widen);
      }
      packed += counts[r];
    }
    join();
    comm_.reduce_scatter_sum_f32(pack, reduced, counts);
    join();
    math::RankReduce divide;  // the engine's sum / K, into G's dtype
    divide.blocks = reduced;
    divide.count = counts[comm_.rank()];
    divide.divisor = K;
    divide.out = dtype;
    divide.dst = g + (me.begin + j * C) * E;
    backend.reduce_ranks(divide);
  }
  join();
  for (int r = 0; r < K; ++r) {
    const uint64_t slo = std::max(me.begin, layout_.ranks[static_cast<size_t>(r)].end);
    if (sc[r] > 0) comm_.copy(send + so[r], g + slo * E, sc[r]);
  }
  comm_.all_to_all_v(send, so, sc, g, ro, rc);
  join();
}

ShardedStep::~ShardedStep() {
  // Moving off the stream waits for the calls on it (NCCL); a failure there is the device's and
  // shows again at its next use, so it is not thrown from here.
  try {
    comm_.order_on_stream(nullptr);
  } catch (const std::exception&) {
  }
}

void ShardedStep::bind() { stream_ordered_ = comm_.order_on_stream(task_.backend().stream()); }

void ShardedStep::join() {
  if (stream_ordered_) return;
  task_.backend().synchronize();
  comm_.wait();
}

void ShardedStep::gather_family(Family family) {
  const int K = comm_.size();
  const uint64_t base = task_.plan().region_range(family_region(family, Role::kBnBias),
                                                  family_region(family, Role::kDeepConv)).offset;
  const uint64_t elem = element_bytes(task_.plan(), family);
  std::vector<uint64_t> offsets(K), counts(K);
  for (int r = 0; r < K; ++r) {
    offsets[r] = base + layout_.ranks[r].begin * elem;
    counts[r] = (layout_.ranks[r].end - layout_.ranks[r].begin) * elem;
  }
  comm_.all_gather_v(task_.backend().arena(), offsets, counts);
}

// All-gathers the per-tile doubles of `region`: grad-norm tiles (one double each) or norm tiles
// (kNormComponents each).
void ShardedStep::gather_doubles(Region region, bool norm_tiles, uint64_t per_tile) {
  const int K = comm_.size();
  const uint64_t base = task_.plan().region(region).offset;
  std::vector<uint64_t> offsets(K), counts(K);
  for (int r = 0; r < K; ++r) {
    const RankShard& s = layout_.ranks[r];
    const int64_t b = norm_tiles ? s.norm_tile_begin : s.grad_tile_begin;
    const int64_t e = norm_tiles ? s.norm_tile_end : s.grad_tile_end;
    offsets[r] = base + static_cast<uint64_t>(b) * per_tile * sizeof(double);
    counts[r] = static_cast<uint64_t>(e - b) * per_tile * sizeof(double);
  }
  comm_.all_gather_v(task_.backend().arena(), offsets, counts);
}

void ShardedStep::step() {
  bind();
  Backend& backend = task_.backend();
  const CompiledStep& step = task_.compiled_step();
  // The program Task::step would run (the host state that decides it is the same on every rank
  // when every rank sets the same mask); a masked step forgets that the counts are equal.
  const bool unmasked = task_.plan().config().tensor_mask && !task_.masked_program_next();
  if (task_.plan().config().tensor_mask && !unmasked) task_.note_masked_step();
  SubSteps& program = programs_[unmasked ? 1 : 0];
  // Each collective comes after the backend's work before it and the backend's next work after
  // the collective (join(): host waits only where the communicator is not on the backend's stream).
  {
    CommTimer t(comm_);
    reduce_gradients();
  }
  backend.execute(program.check);
  {
    CommTimer t(comm_);
    join();
    if (step.check_finite) {
      int32_t* flag = reinterpret_cast<int32_t*>(static_cast<char*>(backend.arena()) + step.scalars_i32.offset) +
                      kHasNonFinite;
      comm_.all_reduce_max_i32(flag, 1);
    }
    if (step.clip) gather_doubles(T_GRAD_NORM_PARTIALS, false, 1);
    join();
  }
  backend.execute(program.combine);
  // (Muon's tiles drive only its update: it has no norm partials to gather.)
  if (!task_.plan().norm_tiles().empty() && !task_.plan().config().muon) {
    CommTimer t(comm_);
    join();
    gather_doubles(T_NORM_PARTIALS, true, math::kNormComponents);
    join();
  }
  // CUDA with a model copy: the update sub-step is prepared (captured) once, here, where it no
  // longer moves. A tensor_mask task's second program is prepared as the alternate: prepare()
  // would drop the first one's graph.
  if (backend.kind() == BackendKind::kCuda && task_.plan().has_model_copy() && !program.update_prepared) {
    SubSteps& other = programs_[unmasked ? 0 : 1];
    if (other.update_prepared) {
      backend.prepare_alternate(program.update);
    } else {
      backend.prepare(program.update);
    }
    program.update_prepared = true;
  }
  backend.execute(program.update);
  CommTimer t(comm_);
  join();
  // The per-element families the step updates that every rank holds whole (W; the optimizer
  // state stays with its slice's owner).
  for (const FamilyInfo& f : kFamilyTable) {
    if (f.step_state && !f.optimizer_state && task_.plan().has_family(f.family)) gather_family(f.family);
  }
  if (task_.plan().has_model_copy()) gather_model_copy();
  if (task_.plan().config().muon) gather_muon_lr();
  join();
}

// Muon: each owner wrote the adjusted lr N[t] of its matrices (state a checkpoint saves); every
// rank receives the others', so that N is whole everywhere, as on one device.
void ShardedStep::gather_muon_lr() {
  const int K = comm_.size();
  const uint64_t base = task_.plan().group_span(Family::kN, Group::kWeight).offset;
  std::vector<uint64_t> offsets(K), counts(K);
  for (int r = 0; r < K; ++r) {
    const RankShard& o = layout_.ranks[static_cast<size_t>(r)];
    offsets[r] = base + static_cast<uint64_t>(o.muon_matrix_begin) * sizeof(float);
    counts[r] = static_cast<uint64_t>(o.muon_matrix_end - o.muon_matrix_begin) * sizeof(float);
  }
  comm_.all_gather_v(task_.backend().arena(), offsets, counts);
}

// The copy pairs element j of the W family with element j of C_MODEL_COPY (the copy format's
// bytes each): each rank's slice of it, as of W.
void ShardedStep::gather_model_copy() {
  const int K = comm_.size();
  const uint64_t elem = precision_bytes(task_.plan().config().precision);
  const uint64_t base = task_.plan().region(C_MODEL_COPY).offset;
  std::vector<uint64_t> offsets(K), counts(K);
  for (int r = 0; r < K; ++r) {
    offsets[r] = base + layout_.ranks[r].begin * elem;
    counts[r] = (layout_.ranks[r].end - layout_.ranks[r].begin) * elem;
  }
  comm_.all_gather_v(task_.backend().arena(), offsets, counts);
}

void ShardedStep::gather_state() {
  if (task_.plan().state_sliced()) {
    throw_invalid("gather_state(): this rank holds only its slice of the optimizer state (TaskOptions::state_shard); use the "
                  "collective read_state(), fingerprint() or save()");
  }
  bind();
  CommTimer t(comm_);
  join();
  for (const FamilyInfo& f : kFamilyTable) {
    if (f.optimizer_state && task_.plan().has_family(f.family)) gather_family(f.family);
  }
  join();
}

void ShardedStep::read_state(Family family, size_t id, uint64_t first, uint64_t count, float* dst) {
  if (!family_info(family).optimizer_state) {
    throw_invalid(std::string("read_state(): ") + family_name(family) + " is not an optimizer state family");
  }
  const MemoryPlan& plan = task_.plan();
  const uint64_t numel = static_cast<uint64_t>(plan.tensor(id).numel);
  if (first > numel || count > numel - first) throw_invalid("read_state(): the range leaves the tensor");
  // Family elements [at, at + count): each rank's block is its slice's part of them, in rank
  // order (the slices tile the family), placed where it belongs in dst.
  const uint64_t at = plan.tensor(id).offset_in_family + first;
  const int K = comm_.size();
  std::vector<uint64_t> offsets(K), counts(K);
  for (int r = 0; r < K; ++r) {
    const RankShard& o = layout_.ranks[static_cast<size_t>(r)];
    const uint64_t lo = std::min(std::max(o.begin, at), at + count), hi = std::max(lo, std::min(o.end, at + count));
    offsets[r] = (lo - at) * sizeof(float);
    counts[r] = (hi - lo) * sizeof(float);
  }
  const int me = comm_.rank();
  bind();
  if (counts[me] > 0) {
    task_.backend().download(plan.tensor_offset(family, id) + first * sizeof(float) + offsets[me],
                             reinterpret_cast<char*>(dst) + offsets[me], counts[me]);
  }
  if (!comm_.device_memory()) return comm_.all_gather_v(dst, offsets, counts);
  // Device memory: gathered in the communicator's workspace, then copied out.
  char* ws = static_cast<char*>(comm_.workspace(count * sizeof(float)));
  comm_.copy_from_host(ws + offsets[me], reinterpret_cast<char*>(dst) + offsets[me], counts[me]);
  comm_.all_gather_v(ws, offsets, counts);
  comm_.copy_to_host(dst, ws, count * sizeof(float));
}

void ShardedStep::set_reduce_chunk(uint64_t elements) {
  if (elements == 0) throw_invalid("set_reduce_chunk(0): a round moves at least one element");
  reduce_chunk_ = elements;
}

std::string ShardedStep::fingerprint() {
  return task_.fingerprint([this](Family f, size_t id, uint64_t first, uint64_t count, float* dst) {
    read_state(f, id, first, count, dst);
  });
}

std::string ShardedStep::fingerprint(const std::vector<size_t>& ids) {
  return task_.fingerprint(ids, [this](Family f, size_t id, uint64_t first, uint64_t count, float* dst) {
    read_state(f, id, first, count, dst);
  });
}

// Every rank returns only once rank 0 has written the file (or throws when rank 0 could not):
// a rank that reads the checkpoint right after save() finds the whole file, never none or an
// older one.
void ShardedStep::save(const std::string& path) {
  std::exception_ptr error;
  try {
    task_.save(path, [this](Family f, size_t id, uint64_t first, uint64_t count, float* dst) {
      read_state(f, id, first, count, dst);
    }, comm_.rank() == 0);
  } catch (...) {
    error = std::current_exception();
  }
  int32_t failed = error ? 1 : 0;
  comm_.all_reduce_max_i32(&failed, 1);
  if (error) std::rethrow_exception(error);
  if (failed != 0) throw_io("sharded save of " + path + ": rank 0 could not write the checkpoint");
}

}  // namespace renaissance
