// Sharded data-parallel steps (docs/distributed.md): sub-steps of the one compiled step of a
// Task run on each rank's slice (renaissance/shard_layout.h) with the collectives of a
// Communicator between them, so that every rank ends with the bits one device would have computed.
#pragma once

#include <cstdint>
#include <string>

#include "renaissance/communicator.h"
#include "renaissance/graph.h"
#include "renaissance/shard_layout.h"
#include "renaissance/task.h"

namespace renaissance {

// The single-process simulation of an ordered K-rank step's input: fills G with the rank-order
// sum of the K ranks' synthetic gradients divided by K, exactly as GradReduce::kOrdered forms it.
void synthesize_rank_sum(Task& task, uint64_t seed, uint64_t step, float amplitude, int ranks);

// Runs a compiled Task's step sharded over `comm`: a CPU task over a host-memory communicator
// (MPI), a CUDA task over a device-memory one (NCCL; not yet run on GPUs). Before step(), G holds: the
// full reduced gradient (kReplicated) or this rank's own full gradient (kOrdered, kFast).
// A task compiled with TaskOptions::state_shard = {comm.rank(), comm.size()} holds only its slice
// of the optimizer state families (kFamilyTable's optimizer_state: M, V; the memory sharding
// saves); one compiled without it holds them whole (every rank keeps only its slice current;
// gather_state() completes them).
class ShardedStep {
 public:
  ShardedStep(Task& task, Communicator& comm, GradReduce mode);
  // Takes the communicator off the backend's stream (order_on_stream(nullptr)): the communicator
  // may outlive the Task and serve the next step, and must not wait on a stream that is gone.
  ~ShardedStep();
  ShardedStep(const ShardedStep&) = delete;
  ShardedStep& operator=(const ShardedStep&) = delete;
  const ShardLayout& layout() const { return layout_; }
  const RankShard& shard() const { return layout_.ranks[static_cast<size_t>(comm_.rank())]; }
  // One step: gradient reduction, the slice's check/norm partials, their all-gather, the
  // canonical combination everywhere, the slice's update, the all-gather of W and of the
  // bf16/fp16 model copy where the task has one.
  void step();
  // All-gathers the optimizer state families, so every rank holds the whole state: only for a
  // task that holds them whole (refused for a sliced one: use the collective reads below).
  void gather_state();
  // Collective (every rank calls them in the same order): elements [first, first + count) of
  // tensor id of an optimizer state family gathered from the ranks that own them into dst on
  // every rank; the Task::fingerprint of the whole state (every rank gets it); Task::save of the
  // whole state, written by rank 0 (one file, loadable at any world size), every rank returning
  // once the file is in place or throwing when rank 0 could not write it.
  void read_state(Family family, size_t id, uint64_t first, uint64_t count, float* dst);
  std::string fingerprint();
  // The same over the tensors `ids` only (Task::fingerprint(ids)): one hyperparameter group's.
  std::string fingerprint(const std::vector<size_t>& ids);
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
  void gather_muon_lr();
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
