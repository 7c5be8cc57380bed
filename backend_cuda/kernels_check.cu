// CUDA op CHECK_FINITE: does any gradient element anywhere hold NaN or ±Inf? Clears the
// has-non-finite flag and sets it to 1 when it finds one, all on the device, so that every later
// node of the step (and of the same graph replay) reads the verdict without the host looking.
#include <cuda_runtime.h>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"

namespace renaissance {
namespace cuda {
namespace {

// An exponent field of all ones is exactly NaN or ±Inf.
__device__ __forceinline__ bool not_finite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

__global__ void check_finite_kernel(const float4* __restrict__ g, uint64_t n4, int32_t* __restrict__ flags) {
  bool bad = false;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t q = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < n4; q += stride) {
    const float4 v = g[q];
    bad = bad || not_finite(v.x) || not_finite(v.y) || not_finite(v.z) || not_finite(v.w);
  }
  // One write per block at most; every writer stores the same value, so the order is irrelevant.
  if (__syncthreads_or(bad) && threadIdx.x == 0) flags[kHasNonFinite] = 1;
}

}  // namespace

void launch_CHECK_FINITE(const CudaContext& ctx, const GraphNode& node) {
  int32_t* flags = ctx.scalars.i32;
  // The verdict is per step: cleared first (a memset node in the graph), then set if needed.
  RN_CUDA_CHECK(cudaMemsetAsync(flags + kHasNonFinite, 0, sizeof(int32_t), ctx.stream));
  const uint64_t n4 = node.g.count / 4;  // G spans are multiples of 64 elements
  if (n4 == 0) return;
  const int block = ctx.launch.block;
  check_finite_kernel<<<grid_for(n4, block, ctx.launch), block, 0, ctx.stream>>>(ctx.at<const float4>(node.g), n4,
                                                                                  flags);
  RN_CUDA_CHECK_LAUNCH("check_finite_kernel");
}

}  // namespace cuda
}  // namespace renaissance
