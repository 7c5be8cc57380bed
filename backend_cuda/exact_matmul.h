// Muon's exact matrix product on a CUDA device (renaissance/math/exact_matmul.h defines it; this
// computes the same bits as the host reference). Host-callable, no CUDA types in the interface.
#pragma once

#include <cstddef>

namespace renaissance {
namespace cuda {

// C = A B in exact mode on the device: a (m x k), b (k x n), c (m x n), row-major device pointers,
// on the default stream; returns when C is written. Throws Error(kInvalidArgument) for k above
// math::kExactMatmulMaxK and Error(kBackend) for a CUDA failure.
void exact_matmul_device(const float* a, const float* b, float* c, size_t m, size_t k, size_t n);

// The same on host arrays (copied to the device and back): for tests and tools.
void exact_matmul_on_device(const float* a, const float* b, float* c, size_t m, size_t k, size_t n);

}  // namespace cuda
}  // namespace renaissance
