// The Task's side of a sharded step's memory (docs/distributed.md, "Memory per rank"): a task
// compiled with TaskOptions::state_shard holds M and V only for its slice. Here: the refusal of
// whole-state operations, writes of M/V cut to the slice, and the fingerprint with M and V read
// through a gathering reader (ShardedStep::fingerprint). Kept apart from task.cc so that the
// Task's own code stays as it was.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

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

// The bytes Task::fingerprint() hashes, in its order (W, M, V tensor by tensor in id order, the
// model copy, the step count), with M and V from `read_state` in pieces: the streaming hash does
// not depend on how the bytes are split. ShardMemory.WorldOfOneHoldsEverything and the
// dist_sharded_runs tests compare the two on the same state.
std::string Task::fingerprint(const StateReader& read_state) {
  require_compiled("fingerprint()");
  const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> holder(XXH3_createState(), &XXH3_freeState);
  XXH3_state_t* state = holder.get();
  XXH3_64bits_reset(state);
  constexpr uint64_t kPiece = uint64_t{1} << 20;  // a gathered read holds one piece at a time
  std::vector<float> buffer;
  for (Family family : {Family::kW, Family::kM, Family::kV}) {
    if (!plan_.has_family(family)) continue;
    for (size_t id = 0; id < params_.size(); ++id) {
      const uint64_t numel = static_cast<uint64_t>(plan_.tensor(id).numel);
      for (uint64_t first = 0; first < numel; first += kPiece) {
        const uint64_t n = std::min(kPiece, numel - first);
        buffer.resize(static_cast<size_t>(n));
        if (family == Family::kW) {
          backend_->download(plan_.tensor_offset(family, id) + first * sizeof(float), buffer.data(), n * sizeof(float));
        } else {
          read_state(family, id, first, n, buffer.data());
        }
        XXH3_64bits_update(state, buffer.data(), n * sizeof(float));
      }
    }
  }
  if (plan_.has_model_copy()) {
    std::vector<uint16_t> copy;
    for (size_t id = 0; id < params_.size(); ++id) {
      copy.resize(static_cast<size_t>(plan_.tensor(id).numel));
      read_model_copy(id, copy.data());
      XXH3_64bits_update(state, copy.data(), copy.size() * sizeof(uint16_t));
    }
  }
  const int64_t t = step_count();
  XXH3_64bits_update(state, &t, sizeof(t));
  const uint64_t hash = XXH3_64bits_digest(state);
  char text[17];
  std::snprintf(text, sizeof(text), "%016" PRIx64, hash);
  return text;
}

}  // namespace renaissance
