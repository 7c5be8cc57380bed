// Task's fingerprint: an XXH3 hash of the state a step changes (the step_state families, the model
// copy, the step count and the tensor mask's counts), the same bytes on every backend.
#include "renaissance/task.h"

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/error.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace renaissance {

std::string Task::fingerprint() {
  std::vector<size_t> ids(params_.size());
  for (size_t id = 0; id < ids.size(); ++id) ids[id] = id;
  return fingerprint(ids);
}

std::string Task::fingerprint(const std::vector<size_t>& ids) {
  require_compiled("fingerprint()");
  for (size_t id : ids) {
    if (id >= params_.size()) throw_invalid("fingerprint(): parameter id " + std::to_string(id) + " is out of range");
  }
  require_whole_state("fingerprint()");
  return hash_state(ids, [this](Family family, size_t id, uint64_t first, uint64_t count, float* dst) {
    backend_->download(plan_.tensor_offset(family, id) + first * sizeof(float), dst, count * sizeof(float));
  });
}

// The bytes every fingerprint hashes, in its order (the step_state families in kFamilyTable's
// order, W, M, V, VMAX, each tensor by tensor in `ids` order; the model copy; the step count), in
// pieces: the streaming hash does not depend on how the bytes are split, and a gathered read
// holds one piece at a time.
std::string Task::hash_state(const std::vector<size_t>& ids, const StateReader& read_mv) {
  const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> holder(XXH3_createState(), &XXH3_freeState);
  XXH3_state_t* state = holder.get();
  XXH3_64bits_reset(state);
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  std::vector<float> buffer;
  for (Family family : kFamiliesInOrder) {
    if (!family_info(family).step_state || !plan_.has_family(family)) continue;
    for (size_t id : ids) {
      const uint64_t numel = static_cast<uint64_t>(plan_.tensor(id).numel);
      for (uint64_t first = 0; first < numel; first += kPiece) {
        const uint64_t n = std::min(kPiece, numel - first);
        buffer.resize(static_cast<size_t>(n));
        if (!family_info(family).optimizer_state) {
          backend_->download(plan_.tensor_offset(family, id) + first * sizeof(float), buffer.data(), n * sizeof(float));
        } else {
          read_mv(family, id, first, n, buffer.data());
        }
        XXH3_64bits_update(state, buffer.data(), n * sizeof(float));
      }
    }
  }
  // The model copy, when there is one (fp32 fingerprints are unchanged by its existence).
  if (plan_.has_model_copy()) {
    std::vector<uint16_t> copy;
    for (size_t id : ids) {
      copy.resize(static_cast<size_t>(plan_.tensor(id).numel));
      read_model_copy(id, copy.data());
      XXH3_64bits_update(state, copy.data(), copy.size() * sizeof(uint16_t));
    }
  }
  const int64_t t = step_count();
  XXH3_64bits_update(state, &t, sizeof(t));
  // tensor_mask: each tensor's count is state too, but only where it says more than t: counts that
  // all equal t add no bytes, so such a task prints what the same run without the mask prints
  // (and a replay case recorded through renaissance.torch still matches). Else the counts of
  // `ids` in that order, as int64.
  if (options_.tensor_mask && !ids.empty()) {
    const std::vector<int64_t> all = tensor_steps();
    if (std::any_of(ids.begin(), ids.end(), [&](size_t id) { return all[id] != t; })) {
      for (size_t id : ids) XXH3_64bits_update(state, &all[id], sizeof(all[id]));
    }
  }
  const uint64_t hash = XXH3_64bits_digest(state);
  char text[17];
  std::snprintf(text, sizeof(text), "%016" PRIx64, hash);
  return text;
}

}  // namespace renaissance
