// The Task's side of a sharded step's memory (docs/distributed.md, "Memory per rank"): a task
// compiled with TaskOptions::state_shard holds the optimizer state families (kFamilyTable's
// optimizer_state) only for its slice. Here: the refusal of whole-state operations, writes of a
// state family cut to the slice, and the fingerprint with the state read through a gathering
// reader (ShardedStep::fingerprint; the hash itself is Task::hash_state).
#include <algorithm>
#include <memory>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/task.h"

namespace renaissance {

void Task::require_whole_state(const char* what) const {
  require_compiled(what);
  if (plan_.state_sliced()) {
    throw_invalid(std::string(what) + ": this task holds only the slice [" + std::to_string(plan_.state_begin()) + ", " +
                  std::to_string(plan_.state_end()) + ") of the optimizer state (rank " +
                  std::to_string(options_.state_shard.rank) + " of " + std::to_string(options_.state_shard.world_size) +
                  "); go through its ShardedStep (step, fingerprint, save, read_state)");
  }
}

void Task::write_state_part(Family family, size_t id, uint64_t first, uint64_t count, const float* src) {
  // Family elements of the part, cut to the slice this task holds (all of it when whole).
  const uint64_t at = plan_.tensor(id).offset_in_family + first;
  const uint64_t lo = std::max(at, plan_.state_begin()), hi = std::min(at + count, plan_.state_end());
  if (lo >= hi) return;
  backend_->upload(plan_.tensor_offset(family, id) + (lo - at + first) * sizeof(float), src + (lo - at),
                   (hi - lo) * sizeof(float));
}

// A sharded task's fingerprint: the state families gathered through `read_state` (ShardMemory.WorldOfOneHoldsEverything
// and the dist_sharded_runs tests compare it with Task::fingerprint() on the same state).
std::string Task::fingerprint(const StateReader& read_state) {
  std::vector<size_t> ids(params_.size());
  for (size_t id = 0; id < ids.size(); ++id) ids[id] = id;
  return fingerprint(ids, read_state);
}

std::string Task::fingerprint(const std::vector<size_t>& ids, const StateReader& read_state) {
  require_compiled("fingerprint()");
  for (size_t id : ids) {
    if (id >= params_.size()) throw_invalid("fingerprint(): parameter id " + std::to_string(id) + " is out of range");
  }
  return hash_state(ids, read_state);
}


}  // namespace renaissance
