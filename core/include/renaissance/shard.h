// Sharded data-parallel steps (issue #16, docs/distributed.md): a world of K ranks, each owning
// one contiguous slice of every family (the same element range in W, G, M and V), running
// sub-steps of the one compiled step on its slice with the collectives of a Communicator between
// them, so that every rank ends with the bits one device would have computed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "renaissance/communicator.h"
#include "renaissance/graph.h"
#include "renaissance/math/rank_reduction.h"
#include "renaissance/plan.h"
#include "renaissance/task.h"

namespace renaissance {

// How the gradient of a rank's slice is formed before the step.
enum class GradReduce {
  kReplicated,  // every rank already holds the full reduced G: no reduction
  kOrdered,     // (g_0 + g_1 + ... + g_{K-1}) / K in fp32, summed left to right in rank order
  kFast,        // the engine's reduce-scatter, then / K: no bitwise promise beyond the engine's
};
const char* grad_reduce_name(GradReduce mode);
bool parse_grad_reduce(const std::string& text, GradReduce* out);

// One rank's share. Element indices count from the first element of a family (padding
// included), so the same range applies to W, G, M and V.
struct RankShard {
  uint64_t begin = 0, end = 0;  // elements this rank updates
  // The reduced gradient this rank needs: [begin, grad_end), grad_end >= end. Past `end` lies
  // the rest of the last grad-norm tile it owns (clipping reads whole tiles).
  uint64_t grad_end = 0;
  int64_t grad_tile_begin = 0, grad_tile_end = 0;  // owned grad-norm tiles (math/norm_reduction.h)
  int64_t norm_tile_begin = 0, norm_tile_end = 0;  // owned tiles of plan.norm_tiles()
};

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

// The model copy of a node cut to elements [lo, hi) of its group span (core/src/shard_copy.cc):
// the tensors' parts inside it, each keeping its stochastic-rounding index (CopyTensor::first).
// move_span: the node's spans start at lo (an element-wise update cut to a slice), so the copy
// span moves with them and the tensors count from lo; otherwise (a tile-wise update, whose tiles
// address the whole group) the span stays whole and only the tensor list shrinks.
ModelCopy cut_model_copy(const ModelCopy& copy, uint64_t lo, uint64_t hi, bool move_span);

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

// The single-process simulation of an ordered K-rank step's input: fills G with the rank-order
// sum of the K ranks' synthetic gradients divided by K, exactly as GradReduce::kOrdered forms it.
void synthesize_rank_sum(Task& task, uint64_t seed, uint64_t step, float amplitude, int ranks);

// Runs a compiled Task's step sharded over `comm`: a CPU task over a host-memory communicator
// (MPI), a CUDA task over a device-memory one (NCCL; not yet run on GPUs). Before step(), G holds: the
// full reduced gradient (kReplicated) or this rank's own full gradient (kOrdered, kFast).
// A task compiled with TaskOptions::state_shard = {comm.rank(), comm.size()} holds only its slice
// of M and V (the memory sharding saves); one compiled without it holds them whole (every rank
// keeps only its slice current; gather_state() completes them).
class ShardedStep {
 public:
  ShardedStep(Task& task, Communicator& comm, GradReduce mode);
  const ShardLayout& layout() const { return layout_; }
  const RankShard& shard() const { return layout_.ranks[static_cast<size_t>(comm_.rank())]; }
  // One step: gradient reduction, the slice's check/norm partials, their all-gather, the
  // canonical combination everywhere, the slice's update, the all-gather of W and of the
  // bf16/fp16 model copy where the task has one.
  void step();
  // All-gathers M and V, so every rank holds the whole state: only for a task that holds them
  // whole (refused for a sliced one: use the collective reads below).
  void gather_state();
  // Collective (every rank calls them in the same order): elements [first, first + count) of
  // tensor id of M or V gathered from the ranks that own them into dst on every rank; the
  // Task::fingerprint of the whole state (every rank gets it); Task::save of the whole state,
  // written by rank 0 (one file, loadable at any world size).
  void read_state(Family family, size_t id, uint64_t first, uint64_t count, float* dst);
  std::string fingerprint();
  void save(const std::string& path);
  // The gradient reduction (ordered, fast) moves at most this many elements of each rank's
  // range per round (default kReduceChunk); tests make it small to run many rounds.
  void set_reduce_chunk(uint64_t elements);
  static constexpr uint64_t kReduceChunk = uint64_t{1} << 18;
  // Seconds spent in collectives and the gradient reduction since this step was built
  // (Communicator::timed_seconds: the host's clock for MPI, CUDA events on the stream for NCCL,
  // which waits for the work timed so far).
  double comm_seconds() const { return comm_.timed_seconds() - timed_base_; }

 private:
  void reduce_gradients();
  void gather_family(Family family);
  void gather_model_copy();
  void gather_doubles(Region region, bool norm_tiles, uint64_t per_tile);

  Task& task_;
  Communicator& comm_;
  GradReduce mode_;
  ShardLayout layout_;
  // The three sub-steps of this rank, cut from one program of the Task: [0] its compiled step,
  // [1] (TaskOptions::tensor_mask) its unmasked program, run while Task::masked_program_next()
  // says no, so that every rank switches programs at the step one device would.
  struct SubSteps {
    CompiledStep check, combine, update;
    bool update_prepared = false;  // CUDA with a model copy: update prepared (step())
  };
  SubSteps programs_[2];
  void cut_program(const CompiledStep& step, SubSteps* out);
  // Makes the backend's work so far and the communicator's calls so far visible to each other,
  // where stream order does not already (a communicator not on the backend's stream).
  void join();
  // Puts the communicator on the backend's stream (Communicator::order_on_stream), before each
  // public collective method: another step may share the communicator.
  void bind();
  bool stream_ordered_ = false;  // the communicator said yes
  uint64_t reduce_chunk_ = kReduceChunk;
  double timed_base_ = 0.0;  // comm_.timed_seconds() when this step was built
};

}  // namespace renaissance
