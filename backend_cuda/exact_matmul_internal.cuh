// What exact_matmul.cu shares with the other exact-mode device code (newton_schulz.cu): the
// product's launcher over a scratch sized by explicit bounds, on a cudaStream_t.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend_cuda/exact_matmul.h"

namespace renaissance {
namespace cuda {

// Upper bounds of the products one scratch serves: rows of A (m), columns of B (n), and the
// digit counts of A (m * padded k) and B (n * padded k); matmul_bounds gives one product's.
struct MatmulBounds {
  size_t m;
  size_t n;
  size_t mk;
  size_t kn;
};
MatmulBounds matmul_bounds(size_t m, size_t k, size_t n);

size_t matmul_scratch_bytes(const MatmulBounds& bounds);

// exact_matmul_launch's body (a, b, c, dims, scratch of matmul_scratch_bytes of bounds that hold
// this call's, stream, skip flags) with a choice of product kernel.
void matmul_launch(DeviceMatrix a, DeviceMatrix b, float* c, size_t m, size_t k, size_t n, void* scratch,
                   cudaStream_t stream, SkipFlags skip, ExactKernel kernel);

__device__ __forceinline__ bool skip_now(SkipFlags skip) {
  return (skip.first != nullptr && *skip.first != 0) || (skip.second != nullptr && *skip.second != 0);
}

}  // namespace cuda
}  // namespace renaissance
