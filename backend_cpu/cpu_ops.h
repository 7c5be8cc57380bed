// What the CPU op files share with the backend class: OpenMP threads over blocks of a range,
// Highway SIMD inside a block, the context of one node and one run_* function per op.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend_cpu/fused_update.h"
#include "backend_cpu/grad_dtype.h"
#include "renaissance/backend.h"
#include "renaissance/error.h"
#include "renaissance/graph.h"
#include "renaissance/math/update_rules.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace cpu {

// Elements per OpenMP work item by default (CpuTuning::chunk_elements, renaissance/backend.h). A
// multiple of the 64-element region padding, so chunks start on 256-byte boundaries.
// Element-wise results do not depend on it (nor on the thread count).
constexpr uint64_t kChunkElements = CpuTuning{}.chunk_elements;
// Norm tiles per OpenMP work item: 4 tiles are 16K elements, like kChunkElements.
constexpr uint64_t kTilesPerBlock = 4;

// The backend's performance switches (CpuSchedule, CpuTuning: renaissance/backend.h) come with
// the BackendOptions the backend is made with (make_cpu_backend validates them); none changes a
// bit of any result. The library never reads the environment: programs fill them from the
// RENAISSANCE_CPU_* variables (tools/program_env.h).

// Elements per update-and-copy step of a block when the node writes a model copy on the unfused
// path (a gradient table, amsgrad; the fused loop rounds in registers; the tile-wise kinds go
// tile by tile): the update of a step is followed at once by the rounding of its new masters
// (write_model_copy), while the step's w (4 KiB) is still in L1, so W is not fetched twice. A multiple of
// every SIMD width and of 8 (a Philox block), so no step adds a scalar head or tail of its own.
constexpr uint64_t kCopyStepElements = 1024;

// Elements of one prefetch step in run_elementwise: a multiple of every SIMD width (so splitting
// a block there adds no scalar tail) and of the 16-float cache line.
constexpr uint64_t kPrefetchStepElements = 256;

// What an op needs to run: the arena, the thread count and the switches above.
struct CpuContext {
  char* arena = nullptr;
  int threads = 1;
  CpuTuning tuning{};
  ScalarPtrs scalars{};

  template <class T>
  T* at(const Span& span) const {
    return reinterpret_cast<T*>(arena + span.offset);
  }
  bool step_skipped() const { return scalars.i32[kHasNonFinite] != 0; }
};

// The one OpenMP loop of the backend: runs fn(begin, end) over [0, count) in blocks of `block`
// items (elements, or norm tiles) on at most `threads` threads, handed out as `schedule` says.
// Results never depend on the split: every item is computed the same way wherever it lands.
template <class Fn>
void parallel_blocks(int threads, uint64_t count, uint64_t block, Fn&& fn, CpuSchedule schedule) {
  const int64_t blocks = static_cast<int64_t>((count + block - 1) / block);
  const int team = static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(blocks, 1)));
  auto one = [&](int64_t c) {
    const uint64_t begin = static_cast<uint64_t>(c) * block;
    fn(begin, std::min(count, begin + block));
  };
  switch (schedule) {
    case CpuSchedule::kStatic:
#pragma omp parallel for schedule(static) num_threads(team)
      for (int64_t c = 0; c < blocks; ++c) one(c);
      break;
    case CpuSchedule::kDynamic:
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
      for (int64_t c = 0; c < blocks; ++c) one(c);
      break;
  }
}

// Asks for the cache lines of the `elem`-byte elements [begin, end) of the array at x (into the
// outer caches: locality 2 is prefetcht1 on x86); `write` asks for them in a writable state (the
// model copy is only stored to). A hint only: never faults, never changes data.
inline void prefetch_lines(const void* x, uint64_t elem, uint64_t begin, uint64_t end, bool write = false) {
  constexpr uint64_t kLine = 64;  // bytes
  const char* p = static_cast<const char*>(x);
  for (uint64_t at = begin * elem; at < end * elem; at += kLine) {
    if (write) {
      __builtin_prefetch(p + at, 1, 2);
    } else {
      __builtin_prefetch(p + at, 0, 2);
    }
  }
}

// The two shapes of a per-target update function, so that each update op's run_* is one line:
// - element-wise over one chunk: the arrays at the chunk's start (m, v null where the kind has
//   none), n elements, the float scalars, the node's coefficient set (coeff_set, graph.h: which
//   lr, wd and decay the kernel's Coeffs take) and L2 mode;
using ElementwiseFn = void (*)(float* w, const float* g, float* m, float* v, size_t n, const float* s, CoeffSet set,
                               bool l2);
// - the same with a fifth array x at the chunk's start (the VMAX family: amsgrad's running max);
using ElementwiseXFn = void (*)(float* w, const float* g, float* m, float* v, float* x, size_t n, const float* s,
                                CoeffSet set, bool l2);
// - tile-wise over norm tiles of the weight group (the norm kinds' tile walker,
//   tile_walker-inl.h): one TileArgs.
struct TileArgs;
using TileFn = void (*)(const TileArgs& a);

// Rounds the new masters w[begin, end) (elements of the node's group span) into the node's model
// copy, tensor by tensor with each element's index in its tensor (ops_model_copy.cc). Called by
// both runners right after each kCopyStepElements step (or norm tile) of an update, while it is
// in L1: one pass over memory. Elements outside every tensor (region padding) keep their zero; a
// masked tensor's (tensor_mask) copy is never touched, as its masters.
void write_model_copy(const CpuContext& ctx, const GraphNode& node, uint64_t begin, uint64_t end);

// The fused path of run_elementwise (fused_update.h) over elements [begin, end) of the node's
// group span with scalars s: the range is cut at the node's tensor boundaries (ops_model_copy.cc)
// into pieces with a copy (inside a tensor, keyed by each element's index in it) and without
// (padding: updated, its copy never written), one call of fn per piece; fn's loop asks for the
// lines prefetch_elements ahead itself (one call per 256-element prefetch step, as the unfused
// path makes, measured slower on the dev VM). `with_copy` / `no_copy`: the two pieces' modes.
void run_fused_range(const CpuContext& ctx, const GraphNode& node, FusedFn fn, FusedMode with_copy, FusedMode no_copy,
                     uint64_t begin, uint64_t end, const float* s);

// The scalar block of hyperparameter group h (scalars.h).
inline const float* scalar_block(const CpuContext& ctx, int32_t h) { return ctx.scalars.f32 + h * kNumScalarF32; }

// TaskOptions::tensor_mask (graph.h): the mask array (block b = tensor b), or null without it.
inline const int32_t* tensor_mask(const CpuContext& ctx, const GraphNode& node) {
  return node.work.tensor_state.count ? ctx.at<int32_t>(node.work.tensor_state) : nullptr;
}
inline bool block_masked(const int32_t* mask, int32_t block) { return mask != nullptr && mask[block] != 0; }

// The node's G: its arena span, or with a gradient table the tensors' own memory (grad_dtype.h).
inline GradSource grad_source(const CpuContext& ctx, const GraphNode& node) {
  GradSource src;
  src.g = ctx.at<char>(node.span(Family::kG));
  src.dtype = node.grad.encoding;
  if (node.grad.table.count != 0) {
    src.table.table = ctx.at<uint64_t>(node.grad.table);
    src.table.lookup = table_lookup(ctx.arena, node.grad.tensors);
  }
  return src;
}

// Runs an element-wise update over the node's group span, in chunk_elements blocks; with H > 1
// hyperparameter groups, over the node's HyperItems (each with its block's scalars) in one
// parallel loop of the same size in elements. With a model copy or a 2-byte G, `fused` (the
// kind's fused loop, fused_update.h) runs instead of fn + the widen + write_model_copy, unless
// the gradient table supplies G (its gather stays in grad_dtype.h).
// A node with a VMAX span (amsgrad) runs `xfn` instead of fn, always on the unfused path (the
// same bits: the fused loop only saves passes over memory).
inline void run_elementwise(const CpuContext& ctx, const GraphNode& node, ElementwiseFn fn, FusedFn fused = nullptr,
                            ElementwiseXFn xfn = nullptr) {
  if (ctx.step_skipped()) return;
  float* w = ctx.at<float>(node.span(Family::kW));
  const GradSource g_src = grad_source(ctx, node);  // G in node.grad.encoding (grad_dtype.h)
  // G is prefetched where it is the arena's (a table's tensors lie anywhere).
  const char* g_arena = node.grad.table.count == 0 ? ctx.at<char>(node.span(Family::kG)) : nullptr;
  const uint64_t g_elem = precision_bytes(node.grad.encoding);
  float* m = node.span(Family::kM).count ? ctx.at<float>(node.span(Family::kM)) : nullptr;
  float* v = node.span(Family::kV).count ? ctx.at<float>(node.span(Family::kV)) : nullptr;
  float* x = node.span(Family::kVmax).count ? ctx.at<float>(node.span(Family::kVmax)) : nullptr;
  if (x != nullptr && xfn == nullptr) throw_invalid("run_elementwise: this update op reads no VMAX family");
  if (x != nullptr) fused = nullptr;
  const CoeffSet set = coeff_set(node);  // the same choice as the CUDA kernels'
  const bool l2 = node.flags.weight_decay_mode == WeightDecayMode::kL2;
  const uint64_t count = node.span(Family::kW).count, ahead = ctx.tuning.prefetch_elements;
  const bool copy = node.copy.c.count != 0;
  const char* c = copy ? ctx.at<char>(node.copy.c) : nullptr;
  // The fused path where it applies: something to fuse (a copy or a 2-byte G), G in the arena.
  const FusedMode with_copy = fused_mode(node.grad.encoding, copy ? node.copy.precision : Precision::kFp32,
                                         node.copy.rounding);
  const FusedMode no_copy = fused_mode(node.grad.encoding, Precision::kFp32, node.copy.rounding);
  const bool fuse = fused != nullptr && g_arena != nullptr && with_copy != FusedMode::kG32 &&
                    with_copy != FusedMode::kNone;
  auto update = [&](uint64_t b, uint64_t e, const float* s) {
    // With a model copy, in L1-sized steps, each rounded right after its update.
    for (uint64_t i = b; i < e;) {
      const uint64_t ie = copy ? std::min(e, i + kCopyStepElements) : e;
      const float* gi = fp32_grad(g_src, i, ie) + i;
      if (x != nullptr) {
        xfn(w + i, gi, m ? m + i : nullptr, v ? v + i : nullptr, x + i, ie - i, s, set, l2);
      } else {
        fn(w + i, gi, m ? m + i : nullptr, v ? v + i : nullptr, ie - i, s, set, l2);
      }
      if (copy) write_model_copy(ctx, node, i, ie);
      i = ie;
    }
  };
  // With prefetch: the block in steps of kPrefetchStepElements, each step first asking for the
  // lines `ahead` elements further on (clamped to the span), so the requests cross the 4 KiB page
  // boundaries where the hardware prefetchers stop. Every element is still updated exactly once.
  auto block = [&](uint64_t b, uint64_t e, const float* s) {
    if (fuse) return run_fused_range(ctx, node, fused, with_copy, no_copy, b, e, s);
    if (ahead == 0) return update(b, e, s);
    for (uint64_t i = b; i < e; i += kPrefetchStepElements) {
      const uint64_t ie = std::min(e, i + kPrefetchStepElements);
      const uint64_t pb = std::min(count, i + ahead), pe = std::min(count, ie + ahead);
      prefetch_lines(w, sizeof(float), pb, pe);
      if (g_arena) prefetch_lines(g_arena, g_elem, pb, pe);
      if (c) prefetch_lines(c, precision_bytes(node.copy.precision), pb, pe, true);
      if (m) prefetch_lines(m, sizeof(float), pb, pe);
      if (v) prefetch_lines(v, sizeof(float), pb, pe);
      if (x) prefetch_lines(x, sizeof(float), pb, pe);
      update(i, ie, s);
    }
  };
  if (node.work.hyper_items.count == 0) {
    parallel_blocks(ctx.threads, count, ctx.tuning.chunk_elements,
                    [&](uint64_t b, uint64_t e) { block(b, e, ctx.scalars.f32); }, ctx.tuning.schedule);
    return;
  }
  const HyperItem* items = ctx.at<HyperItem>(node.work.hyper_items);
  const int32_t* mask = tensor_mask(ctx, node);
  const uint64_t per_block = std::max<uint64_t>(1, ctx.tuning.chunk_elements / kHyperItemElements);
  parallel_blocks(ctx.threads, node.work.hyper_items.count, per_block, [&](uint64_t b, uint64_t e) {
    for (uint64_t k = b; k < e; ++k) {
      if (block_masked(mask, items[k].block)) continue;
      const uint64_t start = static_cast<uint64_t>(items[k].start);
      block(start, start + static_cast<uint64_t>(items[k].count), scalar_block(ctx, items[k].block));
    }
  }, ctx.tuning.schedule);
}

// Calls fn(b, e, s) for the runs of tiles [begin, end) whose tensors share a scalar block
// (H > 1: node.work.tensor_blocks), or once with block 0 (H = 1).
template <class Fn>
void for_tile_blocks(const CpuContext& ctx, const GraphNode& node, const NormTile* tiles, uint64_t begin,
                     uint64_t end, Fn&& fn) {
  if (node.work.tensor_blocks.count == 0) return fn(begin, end, ctx.scalars.f32);
  const int32_t* blocks = ctx.at<int32_t>(node.work.tensor_blocks);
  const int32_t* mask = tensor_mask(ctx, node);
  while (begin < end) {
    const int32_t h = blocks[tiles[begin].tensor];
    uint64_t stop = begin + 1;
    while (stop < end && blocks[tiles[stop].tensor] == h) ++stop;
    if (!block_masked(mask, h)) fn(begin, stop, scalar_block(ctx, h));
    begin = stop;
  }
}

// The elements [begin, end) of the group span that norm tiles [b, e) cover (consecutive tiles
// lie in span order; what lies between them is padding).
inline uint64_t tile_range_begin(const NormTile* tiles, uint64_t b) { return static_cast<uint64_t>(tiles[b].start); }
inline uint64_t tile_range_end(const NormTile* tiles, uint64_t e) {
  return static_cast<uint64_t>(tiles[e - 1].start + tiles[e - 1].length);
}

// The most state arrays a tile-wise rule reads or writes besides W and G.
constexpr int kMaxTileState = 4;

// The operands of one call of a TileFn over the norm tiles [begin, end) of the weight group, all
// with the same scalar block s: every array at its group span's first element. A rule names the
// ones it reads or writes (tile_walker-inl.h).
struct TileArgs {
  float* w = nullptr;
  const float* g = nullptr;             // G in fp32 (fp32_grad); null when the op reads no G
  float* state[kMaxTileState] = {};     // the op's state spans, in the order run_tiles got them
  const NormTile* tiles = nullptr;
  size_t begin = 0, end = 0;
  const float* ratio = nullptr;         // N: each tensor's ratio (the updates read it)
  double* partials = nullptr;           // NORM_TILE_PARTIALS: kNormComponents per tile
  const float* s = nullptr;
};

// Whether a tile-wise op reads G (LAMB's update reads W, M and V only: G is not widened).
enum class TileGrad : bool { kNone = false, kRead = true };

// Runs a tile-wise op (a norm pass or a tile-wise update) over the node's norm tiles,
// kTilesPerBlock tiles per work item, each run of tiles with its scalar block (for_tile_blocks:
// masked tensors skipped), with `state`: the node's state spans the op's rule reads or writes, in
// its order (TileArgs::state). An update node with a model copy goes tile by tile, each tile
// rounded right after its update (in cache); masked tiles keep their copy untouched.
template <class... State>
inline void run_tiles(const CpuContext& ctx, const GraphNode& node, TileFn fn, TileGrad grad, const State&... state) {
  static_assert(sizeof...(State) <= kMaxTileState, "raise kMaxTileState");
  if (ctx.step_skipped()) return;
  TileArgs base;
  base.w = ctx.at<float>(node.span(Family::kW));
  [[maybe_unused]] int k = 0;
  ((base.state[k++] = ctx.at<float>(state)), ...);
  base.tiles = ctx.at<NormTile>(node.norm.tiles);
  if (node.span(Family::kN).count != 0) base.ratio = ctx.at<float>(node.span(Family::kN));
  if (node.norm.partials.count != 0) base.partials = ctx.at<double>(node.norm.partials);
  const GradSource g_src = grad_source(ctx, node);
  const NormTile* tiles = base.tiles;
  parallel_blocks(ctx.threads, node.norm.tiles.count, kTilesPerBlock, [&](uint64_t b, uint64_t e) {
    TileArgs a = base;
    if (grad == TileGrad::kRead) a.g = fp32_grad(g_src, tile_range_begin(tiles, b), tile_range_end(tiles, e));
    for_tile_blocks(ctx, node, tiles, b, e, [&](uint64_t tb, uint64_t te, const float* s) {
      a.s = s;
      if (node.copy.c.count == 0) {
        a.begin = tb;
        a.end = te;
        return fn(a);
      }
      for (uint64_t t = tb; t < te; ++t) {
        a.begin = t;
        a.end = t + 1;
        fn(a);
        write_model_copy(ctx, node, static_cast<uint64_t>(tiles[t].start),
                         static_cast<uint64_t>(tiles[t].start + tiles[t].length));
      }
    });
  }, ctx.tuning.schedule);
}

// ADVANCE_STEP's work, which CLIP_COEFFICIENT also does (ops_step.cc): the step counter and the
// bias corrections of every scalar block, or with tensor_mask each unmasked tensor's own count
// and corrections (block b = tensor b), then the task-wide counters.
void advance_counters(const CpuContext& ctx, const GraphNode& node);

// One function per op of RN_RANGE_OPS / RN_COMPUTE_OPS, implemented in the ops_*.cc files.
#define RN_DECLARE_CPU_RANGE_OP(name) void run_##name(const CpuContext& ctx, const GraphNode& node);
RN_RANGE_OPS(RN_DECLARE_CPU_RANGE_OP)
RN_COMPUTE_OPS(RN_DECLARE_CPU_RANGE_OP)
#undef RN_DECLARE_CPU_RANGE_OP

// One pass of the same-traffic reference over ctx.arena (ops_same_traffic.cc); every bit stays
// as it was when key is 0. Returns a fold of what was read, for the caller to keep alive.
uint32_t run_same_traffic_pass(const CpuContext& ctx, const TrafficPass& pass, uint32_t key);

// Name of the Highway target the dispatcher currently picks (for describe() and tests).
const char* current_simd_target();

}  // namespace cpu
}  // namespace renaissance
