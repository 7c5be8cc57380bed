// Muon's exact matrix product on a CUDA device (renaissance/math/exact_matmul.h defines it; this
// computes the same bits as the host reference). Host-callable; the only CUDA type in the
// interface is the stream, declared opaquely (cudaStream_t is CUstream_st*).
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace renaissance {
namespace cuda {

// A device operand: element (i, p) at data[i * row_stride + p * col_stride] (row-major:
// {data, cols, 1}; the transpose of a row-major r x c matrix: {data, 1, c}).
struct DeviceMatrix {
  const float* data;
  size_t row_stride;
  size_t col_stride;
};

// Device ints that cancel the kernels of a launch when it runs: each kernel does nothing when
// either pointer is non-null and points at a non-zero value (a skipped step's flag, a masked
// tensor's entry).
struct SkipFlags {
  const int32_t* first = nullptr;
  const int32_t* second = nullptr;
};

// The integer product kernel: kAuto takes the tensor cores where the device has int8 mma
// (compute capability 8.0 and later), else the integer units. Both give the same bits (the
// integers are exact); tests choose each to check both.
enum class ExactKernel { kAuto, kTensorCores, kIntegerUnits };

// Bytes of device scratch one exact product of at most these dimensions needs (each dimension
// no larger than the call's: a scratch sized for (m, k, n) serves any m' <= m, k' <= k, n' <= n
// with m'k' <= mk and k'n' <= kn).
size_t exact_matmul_scratch_bytes(size_t m, size_t k, size_t n);

// C = A B in exact mode, enqueued on `stream` (nothing is allocated and nothing waits, so the
// call can be captured in a CUDA graph): a (m x k) and b (k x n) as views, c (m x n, row-major,
// may not alias a or b), scratch of exact_matmul_scratch_bytes(m, k, n) bytes (256-byte aligned).
// With `skip` the kernels do nothing when it says so at run time (C keeps its bytes).
// Throws Error(kInvalidArgument) for k above math::kExactMatmulMaxK, Error(kBackend) for a launch
// failure.
void exact_matmul_launch(DeviceMatrix a, DeviceMatrix b, float* c, size_t m, size_t k, size_t n, void* scratch,
                         CUstream_st* stream, SkipFlags skip = {});

// C = A B in exact mode on the device: a (m x k), b (k x n), c (m x n), row-major device pointers,
// on the default stream; allocates its scratch and returns when C is written. Throws as above, and
// Error(kInvalidArgument) for kTensorCores on a device without int8 mma.
void exact_matmul_device(const float* a, const float* b, float* c, size_t m, size_t k, size_t n,
                         ExactKernel kernel = ExactKernel::kAuto);

// The same on host arrays (copied to the device and back): for tests and tools.
void exact_matmul_on_device(const float* a, const float* b, float* c, size_t m, size_t k, size_t n,
                            ExactKernel kernel = ExactKernel::kAuto);

}  // namespace cuda
}  // namespace renaissance
