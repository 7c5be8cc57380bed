// The CUDA backend's entry points, seen by runtime/src/backend_factory.cc. Plain C++ (no CUDA
// headers), so that translation units built by the host compiler can include it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "renaissance/backend.h"

namespace renaissance {
namespace cuda {

// True when the CUDA runtime finds at least one usable device (cached after the first call).
bool device_available();
// Why device_available() is false ("" when it is true), for skip messages and the CLI.
std::string unavailable_reason();
// Throws Error(kBackend) when no device is available, Error(kInvalidArgument) for bad options.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

// One phase of phase_times: its name and its median milliseconds per step.
struct PhaseTime {
  std::string name;
  double ms;
};

// A profile of one step, not a step timing (bench_step --muon-phases): runs `count` steps of
// `step` on `backend` (made by make_cuda_backend, else Error(kInvalidArgument)) with every node
// enqueued in order on one stream, outside any CUDA graph (the same kernels, so the same bits as
// execute()), and a CUDA event before each phase: each node (a range node named by its op, group
// and "aux", a compute node by its op) and inside MUON_ORTHOGONALIZE each Newton–Schulz phase of
// each shape class (NewtonSchulzBatch::enqueue names them; the node's own row is its adjusted-lr
// kernel). Before each step a device-side wait of `hold_ms` lets the host enqueue the whole step
// first, so host launch latency does not show as phase time. Returns each phase's median over the
// steps (a phase met several times in a step, such as an iteration's product, summed per step), in
// the order first met. The steps are applied as execute() applies them.
std::vector<PhaseTime> phase_times(Backend& backend, const CompiledStep& step, int count, double hold_ms = 20.0);

}  // namespace cuda
}  // namespace renaissance
