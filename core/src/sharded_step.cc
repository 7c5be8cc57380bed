// ShardedStep: one rank's part of a data-parallel step (docs/distributed.md). The compiled step
// of the Task is cut into three sub-steps whose range nodes cover only this rank's slice (or
// its tiles); the backend runs them unchanged, and the communicator joins them:
//   reduce G -> [check / clip partials] -> max flag, gather grad-norm partials
//   -> [step counter, clip coefficient, norm partials] -> gather norm partials
//   -> [trust ratios, updates] -> gather W.
// Compute nodes (the step counter, the clip coefficient, the trust ratios) run whole on every
// rank over the gathered partials, so every rank holds the values one device computes.
#include <algorithm>
#include <chrono>

#include "renaissance/error.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/scalars.h"
#include "renaissance/shard.h"
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

// The node cut to this rank: element-wise updates and the check to the slice, tile-wise nodes
// to the owned tiles. A rank that owns nothing of a node keeps it with empty spans: the check
// must still write this rank's flag (0) before the flags are combined.
void cut_node(GraphNode* node, const MemoryPlan& plan, const RankShard& s) {
  if (node->kind != NodeKind::kRange) return;
  const uint64_t g0 = plan.region_range(G_BN_BIAS, G_DEEP_CONV).offset;
  if (node->range_op == RangeOp::GRAD_NORM_PARTIALS) {
    const uint64_t tile = static_cast<uint64_t>(math::kGradNormTile);
    const uint64_t first = static_cast<uint64_t>(s.grad_tile_begin) * tile;
    const uint64_t tiles = static_cast<uint64_t>(s.grad_tile_end - s.grad_tile_begin);
    const uint64_t end = std::min(node->g.count, static_cast<uint64_t>(s.grad_tile_end) * tile);
    node->g = sub_span(node->g, first, tiles ? end - first : 0, sizeof(float));
    node->norm.partials = sub_span(node->norm.partials, static_cast<uint64_t>(s.grad_tile_begin), tiles, sizeof(double));
    return;
  }
  if (node->norm.tiles.count > 0) {  // NORM_TILE_PARTIALS and the tile-wise (LARS, LAMB) updates
    const uint64_t first = static_cast<uint64_t>(s.norm_tile_begin);
    const uint64_t tiles = static_cast<uint64_t>(s.norm_tile_end - s.norm_tile_begin);
    node->norm.tiles = sub_span(node->norm.tiles, first, tiles, sizeof(NormTile));
    node->norm.partials = sub_span(node->norm.partials, math::kNormComponents * first,
                                   math::kNormComponents * tiles, sizeof(double));
    return;
  }
  // Element-wise over one span of G (the check) or of one group in every family.
  const uint64_t start = (node->g.offset - g0) / sizeof(float);
  const uint64_t lo = std::max(start, s.begin), hi = std::max(lo, std::min(start + node->g.count, s.end));
  const uint64_t skip = lo - start, n = hi - lo;
  node->g = sub_span(node->g, skip, n, sizeof(float));
  if (node->w.count) node->w = sub_span(node->w, skip, n, sizeof(float));
  if (node->m.count) node->m = sub_span(node->m, skip, n, sizeof(float));
  if (node->v.count) node->v = sub_span(node->v, skip, n, sizeof(float));
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

class CommTimer {
 public:
  explicit CommTimer(double* total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~CommTimer() { *total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  double* total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

void synthesize_rank_sum(Task& task, uint64_t seed, uint64_t step, float amplitude, int ranks) {
  if (ranks < 1) throw_invalid("--simulate-ranks must be >= 1, got " + std::to_string(ranks));
  if (task.plan().config().model_dtype_gradients) {
    throw_invalid("--simulate-ranks sums fp32 gradients; it does not take model-dtype gradients");
  }
  const Span g = task.plan().region_range(G_BN_BIAS, G_DEEP_CONV);
  std::vector<float> sum(g.count), rank_g(g.count);
  for (int r = 0; r < ranks; ++r) {
    task.synthesize_gradients(rank_gradient_seed(seed, r), step, amplitude);
    task.backend().download(g.offset, r == 0 ? sum.data() : rank_g.data(), g.count * sizeof(float));
    if (r > 0) {
      for (uint64_t i = 0; i < g.count; ++i) sum[i] = ordered_rank_add(sum[i], rank_g[i]);
    }
  }
  for (uint64_t i = 0; i < g.count; ++i) sum[i] = ordered_rank_mean(sum[i], ranks);
  task.backend().upload(g.offset, sum.data(), g.count * sizeof(float));
}

ShardedStep::ShardedStep(Task& task, Communicator& comm, GradReduce mode)
    : task_(task), comm_(comm), mode_(mode) {
  if (task.backend().kind() != BackendKind::kCpu) {
    throw_invalid("a sharded step over this communicator runs CPU ranks; the CUDA backend needs the NCCL "
                  "communicator, which is not built yet");
  }
  const MemoryPlan& plan = task.plan();
  // The model copy (issue 14) is neither cut with the update nodes nor all-gathered yet.
  if (plan.has_model_copy()) throw_invalid("a sharded step does not carry a bf16/fp16 model copy yet");
  layout_ = make_shard_layout(plan, comm.size());
  const RankShard& s = shard();
  const CompiledStep& step = task.compiled_step();
  check_ = empty_like(step);
  combine_ = empty_like(step);
  update_ = empty_like(step);
  // Sub-steps keep the single-device node order: range nodes of the pre-step graph, its compute
  // node, the norm graph's tile partials, its ratios, then the updates.
  auto add = [&](CompiledStep* sub, GraphNode node) {
    cut_node(&node, plan, s);
    sub->graphs[0].push_back(node);
  };
  for (const GraphNode& node : step.graphs[static_cast<int>(GraphId::kPreStep)]) {
    add(node.kind == NodeKind::kRange ? &check_ : &combine_, node);
  }
  for (const GraphNode& node : step.graphs[static_cast<int>(GraphId::kNorms)]) {
    add(node.kind == NodeKind::kRange ? &combine_ : &update_, node);
  }
  for (const GraphNode& node : step.graphs[static_cast<int>(GraphId::kOptimizer)]) add(&update_, node);
}

void ShardedStep::reduce_gradients() {
  if (mode_ == GradReduce::kReplicated) return;
  const int K = comm_.size();
  const RankShard& me = shard();
  const uint64_t g0 = task_.plan().region_range(G_BN_BIAS, G_DEEP_CONV).offset;
  char* arena = static_cast<char*>(task_.backend().arena());
  float* g = reinterpret_cast<float*>(arena + g0);
  const uint64_t n = me.grad_end - me.begin;
  const float k = static_cast<float>(K);
  std::vector<uint64_t> so(K), sc(K), ro(K), rc(K);
  if (mode_ == GradReduce::kOrdered) {
    // Every rank sends each rank r its own gradient over r's range; rank q's part lands at q*n.
    scratch_.resize(static_cast<size_t>(K) * n);
    for (int r = 0; r < K; ++r) {
      const RankShard& other = layout_.ranks[static_cast<size_t>(r)];
      so[r] = other.begin * sizeof(float);
      sc[r] = (other.grad_end - other.begin) * sizeof(float);
      ro[r] = static_cast<uint64_t>(r) * n * sizeof(float);
      rc[r] = n * sizeof(float);
    }
    comm_.all_to_all_v(g, so, sc, scratch_.data(), ro, rc);
    for (uint64_t i = 0; i < n; ++i) {
      float sum = scratch_[i];
      for (int r = 1; r < K; ++r) sum = ordered_rank_add(sum, scratch_[static_cast<uint64_t>(r) * n + i]);
      g[me.begin + i] = ordered_rank_mean(sum, K);
    }
    return;
  }
  // kFast: the engine's reduce-scatter over the slices, / K, then the halo (the rest of the
  // last owned grad-norm tile) from the ranks that own those elements.
  std::vector<uint64_t> counts(K);
  for (int r = 0; r < K; ++r) counts[r] = layout_.ranks[r].end - layout_.ranks[r].begin;
  scratch_.resize(me.end - me.begin);
  std::vector<float> send(g, g + layout_.family_count);
  comm_.reduce_scatter_sum_f32(send.data(), scratch_.data(), counts);
  for (uint64_t i = 0; i < me.end - me.begin; ++i) g[me.begin + i] = scratch_[i] / k;
  for (int r = 0; r < K; ++r) {
    // What this rank sends to r: its slice ∩ r's halo [r.end, r.grad_end); receives likewise.
    const RankShard& other = layout_.ranks[static_cast<size_t>(r)];
    const uint64_t slo = std::max(me.begin, other.end), shi = std::min(me.end, other.grad_end);
    so[r] = slo * sizeof(float);
    sc[r] = shi > slo ? (shi - slo) * sizeof(float) : 0;
    const uint64_t rlo = std::max(other.begin, me.end), rhi = std::min(other.end, me.grad_end);
    ro[r] = rlo * sizeof(float);
    rc[r] = rhi > rlo ? (rhi - rlo) * sizeof(float) : 0;
  }
  send.assign(g, g + layout_.family_count);
  comm_.all_to_all_v(send.data(), so, sc, g, ro, rc);
}

void ShardedStep::gather_family(Family family) {
  const int K = comm_.size();
  const uint64_t base = task_.plan().region_range(family_region(family, Role::kBnBias),
                                                  family_region(family, Role::kDeepConv)).offset;
  std::vector<uint64_t> offsets(K), counts(K);
  for (int r = 0; r < K; ++r) {
    offsets[r] = base + layout_.ranks[r].begin * sizeof(float);
    counts[r] = (layout_.ranks[r].end - layout_.ranks[r].begin) * sizeof(float);
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
  Backend& backend = task_.backend();
  const CompiledStep& step = task_.compiled_step();
  {
    CommTimer t(&comm_seconds_);
    reduce_gradients();
  }
  backend.execute(check_);
  {
    CommTimer t(&comm_seconds_);
    if (step.check_finite) {
      int32_t* flag = reinterpret_cast<int32_t*>(static_cast<char*>(backend.arena()) + step.scalars_i32.offset) +
                      kHasNonFinite;
      comm_.all_reduce_max_i32(flag, 1);
    }
    if (step.clip) gather_doubles(T_GRAD_NORM_PARTIALS, false, 1);
  }
  backend.execute(combine_);
  if (!task_.plan().norm_tiles().empty()) {
    CommTimer t(&comm_seconds_);
    gather_doubles(T_NORM_PARTIALS, true, math::kNormComponents);
  }
  backend.execute(update_);
  CommTimer t(&comm_seconds_);
  gather_family(Family::kW);
}

void ShardedStep::gather_state() {
  CommTimer t(&comm_seconds_);
  if (task_.plan().has_family(Family::kM)) gather_family(Family::kM);
  if (task_.plan().has_family(Family::kV)) gather_family(Family::kV);
}

}  // namespace renaissance
