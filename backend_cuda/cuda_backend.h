// The CUDA backend's entry points, seen by runtime/src/backend_factory.cc. Plain C++ (no CUDA
// headers), so that translation units built by the host compiler can include it.
#pragma once

#include <memory>
#include <string>

#include "renaissance/backend.h"

namespace renaissance {
namespace cuda {

// True when the CUDA runtime finds at least one usable device (cached after the first call).
bool device_available();
// Why device_available() is false ("" when it is true), for skip messages and the CLI.
std::string unavailable_reason();
// Throws Error(kBackend) when no device is available, Error(kInvalidArgument) for bad options.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);

}  // namespace cuda
}  // namespace renaissance
