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

// Elements per thread per loop trip, in float4: independent loads in flight, since the grid is
// bounded (see launch_CHECK_FINITE) and each thread makes several trips.
constexpr int kCheckUnroll = 4;

__global__ void check_finite_kernel(const float4* __restrict__ g, uint64_t n4, int32_t* __restrict__ flags,
                                    unsigned* __restrict__ scratch) {
  bool bad = false;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t q0 = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q0 < n4;
       q0 += kCheckUnroll * stride) {
    float4 v[kCheckUnroll];
#pragma unroll
    for (int k = 0; k < kCheckUnroll; ++k) {
      const uint64_t q = q0 + k * stride;
      v[k] = q < n4 ? g[q] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kCheckUnroll; ++k) {
      bad = bad || not_finite(v[k].x) || not_finite(v[k].y) || not_finite(v[k].z) || not_finite(v[k].w);
    }
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
  // Launched even for an empty G (one block): the flag is written every step. The default grid
  // is what stays resident at once (2048 threads per multiprocessor), so that the blocks' atomic
  // tickets number about a thousand, not one per 4 KB of gradients.
  const int block = fit_block<&check_finite_kernel>(ctx.launch.block);
  unsigned grid = grid_for((n4 + kCheckUnroll - 1) / kCheckUnroll, block, ctx.launch);
  if (ctx.launch.grid == 0) grid = std::min<unsigned>(grid, ctx.launch.sm_count * (2048 / block));
  check_finite_kernel<<<grid, block, 0, ctx.stream>>>(
      ctx.at<const float4>(node.g), n4, ctx.scalars.i32, ctx.check_scratch);
  RN_CUDA_CHECK_LAUNCH("check_finite_kernel");
}

}  // namespace cuda
}  // namespace renaissance
