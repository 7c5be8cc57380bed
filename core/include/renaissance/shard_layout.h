// The partition of a sharded data-parallel step (docs/distributed.md): a world of K ranks, each
// owning one contiguous slice of every family (the same element range in W, G, M and V), and the
// pure functions that cut a plan and a model copy to a rank's slice. The step that runs on such
// slices is the runtime's (renaissance/sharded_step.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "renaissance/communicator.h"
#include "renaissance/graph.h"
#include "renaissance/math/rank_reduction.h"
#include "renaissance/plan.h"

namespace renaissance {

// How the gradient of a rank's slice is formed before the step.
enum class GradReduce {
  kReplicated,  // every rank already holds the full reduced G: no reduction
  kOrdered,     // (g_0 + g_1 + ... + g_{K-1}) / K in fp32, summed left to right in rank order
  kFast,        // the engine's reduce-scatter, then / K: no bitwise promise beyond the engine's
};
const char* grad_reduce_name(GradReduce mode);
bool parse_grad_reduce(const std::string& text, GradReduce* out);

// A task that is rank `rank` of a sharded step over `world_size` ranks
// keeps the optimizer state (M, V) only for its slice of make_shard_layout(plan, world_size): its
// arena is W + G whole plus M and V of the slice (MemoryPlan::state_sliced). Such a task is
// stepped by a ShardedStep; the whole-state operations (step, fingerprint, save, read of M/V
// outside the slice) refuse, and ShardedStep gathers what they need. world_size 0: whole state.
struct StateShard {
  int rank = 0;
  int world_size = 0;
};

// One rank's share. Element indices count from the first element of a family (padding
// included), so the same range applies to W, G, M and V.
struct RankShard {
  uint64_t begin = 0, end = 0;  // elements this rank updates
  // The reduced gradient this rank needs: [begin, grad_end), grad_end >= end. Past `end` lies
  // the rest of the last grad-norm tile it owns (clipping reads whole tiles).
  uint64_t grad_end = 0;
  int64_t grad_tile_begin = 0, grad_tile_end = 0;  // owned grad-norm tiles (math/norm_reduction.h)
  int64_t norm_tile_begin = 0, norm_tile_end = 0;  // owned tiles of plan.norm_tiles()
  // Muon: the matrices this rank orthogonalises, [muon_matrix_begin, muon_matrix_end) of
  // plan.muon_matrices() (plan order): those whose first element lies in this slice (the last
  // rank also takes empty ones at the family's end). No cut falls inside a matrix, so the slice
  // holds every element of each. Empty ranges on other kinds.
  int64_t muon_matrix_begin = 0, muon_matrix_end = 0;
};

// Every cut of a partition is a multiple of this many elements (docs/distributed.md, rule A):
// the CUDA kernels read the spans a slice cuts (W, G, the optimizer states, Muon's U) in 16-byte
// vectors of four elements from the span's first element, with no scalar head or tail.
constexpr uint64_t kShardCutAlign = 4;

// The partition of a plan over K ranks: a pure function of (plan, K), docs/distributed.md.
struct ShardLayout {
  int world_size = 1;
  uint64_t family_count = 0;  // elements of one family, padding included
  std::vector<RankShard> ranks;
};
ShardLayout make_shard_layout(const MemoryPlan& plan, int world_size);

// The plan configuration of rank shard.rank of a world of shard.world_size (TaskOptions::
// state_shard): the configuration of `whole` (a plan holding M and V whole) with M and V cut to
// that rank's slice of make_shard_layout(whole, world_size).
PlanConfig slice_plan_config(const MemoryPlan& whole, const StateShard& shard);

// The model copy of an element-wise update node whose spans were cut to elements [lo, hi) of its
// group span (core/src/shard_copy.cc): the copy span moves with them and ModelCopy::base grows
// by lo, so each element keeps its stochastic-rounding key. (A tile-wise update keeps its copy
// whole: its owned tiles alone limit what it writes.)
ModelCopy cut_model_copy(const ModelCopy& copy, uint64_t lo, uint64_t hi);

// The first span of a range node of `step` (a program of a task compiled from `plan`, or a
// rank's sub-step cut from one) that a CUDA kernel could not walk in four-element vectors: a span
// of a per-element family (W, G, M, V, VMAX) or Muon's U whose first byte is not a multiple of
// kShardCutAlign elements or whose length is not a multiple of kShardCutAlign; described in words,
// or "" when every span is aligned. (Per-tensor N, tables and the model copy, whose writer takes
// any element, are not looked at.) ShardedStep refuses a sub-step for which this is not "".
std::string unaligned_span(const CompiledStep& step, const MemoryPlan& plan);

// The seed of rank r's synthetic gradient stream (ordered and fast modes, --simulate-ranks):
// rank 0's stream is the run's own seed, so K = 1 is a plain run.
constexpr uint64_t rank_gradient_seed(uint64_t seed, int rank) {
  return seed + static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ULL;
}

// The reduction of GradReduce::kOrdered, written once (math/rank_reduction.h, for the host and
// the device): the K ranks' values of one element summed in fp32 in rank order, then divided by
// K. The distributed step (Backend::reduce_ranks) and the single-process simulation both reduce
// through these two, so they cannot drift apart.
using math::ordered_rank_add;
using math::ordered_rank_mean;

}  // namespace renaissance
