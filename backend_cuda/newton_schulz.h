// Muon's orthogonalisation in exact mode on a CUDA device: the bits of
// math::newton_schulz_reference (renaissance/math/newton_schulz.h) for one matrix in device
// memory. Host-callable; the only CUDA type in the interface is the stream, declared opaquely.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend_cuda/exact_matmul.h"
#include "renaissance/math/newton_schulz.h"

struct CUstream_st;

namespace renaissance {
namespace cuda {

// The iteration's fp32 scalars as device pointers, read by the kernels when they run (a
// captured graph follows later changes of the scalar block without a new capture): the
// coefficients a, b, c and eps. The step count is a launch argument (the number of kernels), so
// it is fixed when the launches are enqueued (or captured).
struct NewtonSchulzScalars {
  const float* a;
  const float* b;
  const float* c;
  const float* eps;
};

// Bytes of device scratch newton_schulz_device needs for a rows x cols matrix (or its transpose).
size_t newton_schulz_scratch_bytes(size_t rows, size_t cols);

// out (rows x cols, row-major, device) = math::newton_schulz_reference(u, rows, cols, ...) bit for
// bit, enqueued on `stream`: nothing is allocated and nothing waits, so the call can be captured
// in a CUDA graph. out may be u (in place). scratch: newton_schulz_scratch_bytes(rows, cols) bytes,
// 256-byte aligned. With `skip` every kernel does nothing when it says so at run time (out keeps
// its bytes). Throws Error(kInvalidArgument) where the reference returns false
// (max(rows, cols) above math::kExactMatmulMaxK) and for steps < 0; Error(kBackend) for a launch
// failure.
void newton_schulz_device(const float* u, size_t rows, size_t cols, float* out, const NewtonSchulzScalars& scalars,
                          int steps, void* scratch, CUstream_st* stream, SkipFlags skip = {});

// The same on host arrays (copied to the device and back, synchronously): for tests and tools.
// Returns false (out untouched) where the reference does.
bool newton_schulz_on_device(const float* u, size_t rows, size_t cols, float* out,
                             const math::NewtonSchulzCoefficients& coeff = {},
                             int steps = math::kDefaultNewtonSchulzSteps, float eps = math::kDefaultNewtonSchulzEps);

}  // namespace cuda
}  // namespace renaissance
