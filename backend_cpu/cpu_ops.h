// What the CPU op files share with the backend class: OpenMP threads over blocks of a range,
// Highway SIMD inside a block, the context of one node and one run_* function per op.
#pragma once

#include <algorithm>
#include <cstdint>

#include "renaissance/backend.h"
#include "renaissance/graph.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace cpu {

// Elements per OpenMP work item. A multiple of the 64-element region padding, so chunks start
// on 256-byte boundaries. Element-wise results do not depend on it (nor on the thread count).
constexpr uint64_t kChunkElements = 16384;
// Norm tiles per OpenMP work item: 4 tiles are 16K elements, like kChunkElements.
constexpr uint64_t kTilesPerBlock = 4;

// What an op needs to run: the arena and the thread count.
struct CpuContext {
  char* arena = nullptr;
  int threads = 1;
  ScalarPtrs scalars{};

  template <class T>
  T* at(const Span& span) const {
    return reinterpret_cast<T*>(arena + span.offset);
  }
  bool step_skipped() const { return scalars.i32[kHasNonFinite] != 0; }
};

// The one OpenMP loop of the backend: runs fn(begin, end) over [0, count) in blocks of `block`
// items (elements, or norm tiles), statically scheduled on at most `threads` threads. Results
// never depend on the split: every item is computed the same way wherever it lands.
template <class Fn>
void parallel_blocks(int threads, uint64_t count, uint64_t block, Fn&& fn) {
  const int64_t blocks = static_cast<int64_t>((count + block - 1) / block);
  const int team = static_cast<int>(std::min<int64_t>(threads, std::max<int64_t>(blocks, 1)));
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t c = 0; c < blocks; ++c) {
    const uint64_t begin = static_cast<uint64_t>(c) * block;
    fn(begin, std::min(count, begin + block));
  }
}

// The two shapes of a per-target update function, so that each update op's run_* is one line:
// - element-wise over one chunk: the arrays at the chunk's start (m, v null where the kind has
//   none), n elements, the float scalars, the node's group (bias-like: wd = 0) and L2 mode;
using ElementwiseFn = void (*)(float* w, const float* g, float* m, float* v, size_t n, const float* s,
                               bool weight_group, bool l2);
// - tile-wise over the norm tiles [tile_begin, tile_end) of the weight group, each tile with its
//   tensor's ratio from N.
using TileFn = void (*)(float* w, const float* g, float* m, float* v, const NormTile* tiles, size_t tile_begin,
                        size_t tile_end, const float* ratio, const float* s);

// Runs an element-wise update over the node's group span, in kChunkElements blocks.
inline void run_elementwise(const CpuContext& ctx, const GraphNode& node, ElementwiseFn fn) {
  if (ctx.step_skipped()) return;
  float* w = ctx.at<float>(node.w);
  const float* g = ctx.at<float>(node.g);
  float* m = node.m.count ? ctx.at<float>(node.m) : nullptr;
  float* v = node.v.count ? ctx.at<float>(node.v) : nullptr;
  const bool weight_group = node.group == Group::kWeight;
  const bool l2 = node.weight_decay_mode == WeightDecayMode::kL2;
  parallel_blocks(ctx.threads, node.w.count, kChunkElements, [&](uint64_t b, uint64_t e) {
    fn(w + b, g + b, m ? m + b : nullptr, v ? v + b : nullptr, e - b, ctx.scalars.f32, weight_group, l2);
  });
}

// Runs a tile-wise update over the node's norm tiles, kTilesPerBlock tiles per work item.
inline void run_tiles(const CpuContext& ctx, const GraphNode& node, TileFn fn) {
  if (ctx.step_skipped()) return;
  float* w = ctx.at<float>(node.w);
  const float* g = ctx.at<float>(node.g);
  float* m = node.m.count ? ctx.at<float>(node.m) : nullptr;
  float* v = node.v.count ? ctx.at<float>(node.v) : nullptr;
  const float* ratio = ctx.at<float>(node.n);
  const NormTile* tiles = ctx.at<NormTile>(node.norm.tiles);
  parallel_blocks(ctx.threads, node.norm.tiles.count, kTilesPerBlock, [&](uint64_t b, uint64_t e) {
    fn(w, g, m, v, tiles, b, e, ratio, ctx.scalars.f32);
  });
}

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
