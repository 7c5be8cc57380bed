// Creates backends by kind. The only core file that knows which backends were built.
#include "backend_cpu/cpu_backend.h"
#include "renaissance/backend.h"
#include "renaissance/error.h"
#if RENAISSANCE_WITH_CUDA
#include "backend_cuda/cuda_backend.h"
#endif

namespace renaissance {

bool backend_available(BackendKind kind) {
  switch (kind) {
    case BackendKind::kCpu: return true;
    case BackendKind::kCuda:
#if RENAISSANCE_WITH_CUDA
      return cuda::device_available();
#else
      return false;
#endif
    case BackendKind::kAuto: return true;
  }
  return false;
}

BackendKind resolve_backend(BackendKind kind) {
  if (kind != BackendKind::kAuto) return kind;
  return backend_available(BackendKind::kCuda) ? BackendKind::kCuda : BackendKind::kCpu;
}

std::unique_ptr<Backend> create_backend(BackendKind kind, const BackendOptions& options) {
  switch (resolve_backend(kind)) {
    case BackendKind::kCuda:
#if RENAISSANCE_WITH_CUDA
      return cuda::make_cuda_backend(options);
#else
      throw_invalid("backend cuda: this build has no CUDA backend (configure with RENAISSANCE_CUDA=ON)");
#endif
    default:
      return cpu::make_cpu_backend(options);
  }
}

}  // namespace renaissance
