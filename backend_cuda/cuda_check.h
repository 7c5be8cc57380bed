// Error checking for every CUDA runtime call and kernel launch of the CUDA backend. A failure
// throws renaissance::Error(kBackend) naming the call, the file and the line, so a user sees
// which operation failed instead of a later, unrelated symptom.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "renaissance/error.h"

namespace renaissance {
namespace cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  throw Error(ErrorKind::kBackend, std::string("cuda backend: ") + call + " failed at " + file + ":" +
                                       std::to_string(line) + ": " + cudaGetErrorName(status) + " (" +
                                       cudaGetErrorString(status) + ")");
}

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    // Consume the runtime's record of this (non-sticky) error, so that the next launch check,
    // which reads cudaGetLastError, does not report it a second time.
    (void)cudaGetLastError();
    throw_cuda_error(status, call, file, line);
  }
}

// Checks the kernel launch just made (bad configuration, too many resources). Launch errors are
// reported by cudaGetLastError, not by the <<<>>> expression, so every launch is followed by this.
inline void check_launch(const char* what, const char* file, int line) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw_cuda_error(status, (std::string("launch of ") + what).c_str(), file, line);
}

}  // namespace cuda
}  // namespace renaissance

// Wraps a runtime call: RN_CUDA_CHECK(cudaMalloc(&p, n));
#define RN_CUDA_CHECK(call) ::renaissance::cuda::check_cuda((call), #call, __FILE__, __LINE__)

// Checks the launch just made: RN_CUDA_CHECK_LAUNCH("adam kernel");
#define RN_CUDA_CHECK_LAUNCH(what) ::renaissance::cuda::check_launch((what), __FILE__, __LINE__)
