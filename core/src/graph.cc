// ProgramId's counter: one per process, so no two CompiledSteps alive or dead share a number.
#include <atomic>

#include "renaissance/graph.h"

namespace renaissance {

uint64_t ProgramId::next() noexcept {
  static std::atomic<uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace renaissance
