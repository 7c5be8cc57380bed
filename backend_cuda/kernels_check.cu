// CUDA op CHECK_FINITE: does any gradient element anywhere hold NaN or ±Inf? Writes the
// has-non-finite flag (0 or 1) on the device, so that every later node of the step (and of the
// same graph replay) reads the verdict without the host looking at the data.
//
// One launch, no separate reset node: each block votes, counts itself in a backend-owned
// scratch pair (blocks that saw a bad value, blocks done), and the last block to finish writes
// the flag and zeroes the scratch for the next step (the threadfence-reduction pattern).
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

__global__ void check_finite_kernel(const float4* __restrict__ g, uint64_t n4, int32_t* __restrict__ flags,
                                    unsigned* __restrict__ scratch) {
  bool bad = false;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t q = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q < n4; q += stride) {
    const float4 v = g[q];
    bad = bad || not_finite(v.x) || not_finite(v.y) || not_finite(v.z) || not_finite(v.w);
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x != 0) return;
  if (bad) atomicAdd(&scratch[0], 1u);
  __threadfence();  // this block's count is visible before its ticket
  const unsigned ticket = atomicAdd(&scratch[1], 1u);
  if (ticket == gridDim.x - 1) {
    // Every other block has taken its ticket, so every count is in.
    const unsigned bad_blocks = atomicExch(&scratch[0], 0u);
    scratch[1] = 0u;
    flags[kHasNonFinite] = bad_blocks != 0u ? 1 : 0;
  }
}

}  // namespace

void launch_CHECK_FINITE(const CudaContext& ctx, const GraphNode& node) {
  const uint64_t n4 = node.g.count / 4;  // G spans are multiples of 64 elements
  // Launched even for an empty G (one block): the flag is written every step.
  const int block = fit_block<&check_finite_kernel>(ctx.launch.block);
  check_finite_kernel<<<grid_for(n4, block, ctx.launch), block, 0, ctx.stream>>>(
      ctx.at<const float4>(node.g), n4, ctx.scalars.i32, ctx.check_scratch);
  RN_CUDA_CHECK_LAUNCH("check_finite_kernel");
}

}  // namespace cuda
}  // namespace renaissance
