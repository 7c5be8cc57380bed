// The CPU backend's entry point: the one thing the runtime needs from backend_cpu/ (the ops
// and their context are in cpu_ops.h, private to this folder).
#pragma once

#include <memory>

#include "renaissance/backend.h"

namespace renaissance {
namespace cpu {

// options.cpu: the performance switches (renaissance/backend.h); a chunk that is not a positive
// multiple of 64 or a schedule outside CpuSchedule throws Error(kBackend). Nothing is read from
// the environment.
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

}  // namespace cpu
}  // namespace renaissance
