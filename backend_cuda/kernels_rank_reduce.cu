// Backend::reduce_ranks on the device: a sharded step's rank-order mean of the landed blocks (and
// the fast path's widening and division by K) in the communicator's workspace and in G, so the
// reduction never leaves the device. The arithmetic is math::rank_reduce_element, the CPU
// backend's own: every element is independent, so the launch shape changes no bit.
#include "backend_cuda/cuda_ops.h"
#include "renaissance/math/rank_reduction.h"

namespace renaissance {
namespace cuda {

namespace {

__global__ void rank_reduce_kernel(math::RankReduce op) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < op.count; i += stride) {
    math::rank_reduce_element(op, i);
  }
}

}  // namespace

void launch_rank_reduce(const math::RankReduce& op, const LaunchConfig& launch, cudaStream_t stream) {
  if (op.count == 0) return;
  const int block = fit_block<&rank_reduce_kernel>(launch.block);
  rank_reduce_kernel<<<grid_for(op.count, block, launch), block, 0, stream>>>(op);
  RN_CUDA_CHECK_LAUNCH("rank_reduce_kernel");
}

}  // namespace cuda
}  // namespace renaissance
