// The Task's gradient table (TaskOptions::gradient_table): a uint64 per parameter in
// the arena (S_GRAD_TABLE) holding the address of that parameter's gradient, which every op that
// reads G follows on the device at run time. Here: its accessors and the arena's own addresses
// that compile() writes into it. Kept apart from task.cc, as task_sharded.cc is.
#include <cstdint>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/task.h"

namespace renaissance {

void Task::require_gradient_table(const char* what) const {
  require_compiled(what);
  if (!options_.gradient_table) {
    throw_invalid(std::string(what) + ": the task was built without TaskOptions::gradient_table");
  }
}

uint64_t* Task::gradient_table() {
  require_gradient_table("gradient_table()");
  return reinterpret_cast<uint64_t*>(static_cast<char*>(backend_->arena()) + plan_.region(S_GRAD_TABLE).offset);
}

void Task::set_gradient_table(const std::vector<uint64_t>& addresses) {
  require_gradient_table("set_gradient_table()");
  if (addresses.size() != params_.size()) {
    throw_invalid("set_gradient_table(): " + std::to_string(addresses.size()) + " addresses for " +
                  std::to_string(params_.size()) + " parameters");
  }
  for (size_t id = 0; id < addresses.size(); ++id) {
    // A tensor with elements must have somewhere to read them from.
    if (addresses[id] == 0 && plan_.tensor(id).numel > 0) {
      throw_invalid("set_gradient_table(): parameter '" + params_[id].name + "' has a null gradient address");
    }
  }
  if (!addresses.empty()) {
    backend_->upload(plan_.region(S_GRAD_TABLE).offset, addresses.data(), addresses.size() * sizeof(uint64_t));
  }
}

void Task::reset_gradient_table() {
  require_gradient_table("reset_gradient_table()");
  const uint64_t base = reinterpret_cast<uintptr_t>(backend_->arena());
  std::vector<uint64_t> own(params_.size());
  for (size_t id = 0; id < own.size(); ++id) own[id] = base + plan_.tensor_offset(Family::kG, id);
  if (!own.empty()) backend_->upload(plan_.region(S_GRAD_TABLE).offset, own.data(), own.size() * sizeof(uint64_t));
}

}  // namespace renaissance
