// TaskOptions::gradient_table on CUDA (the cheap lookup): the chunk addresses every G reader
// looks at first (model_copy_key.h's GradTableRef::chunk_at). One kernel per step, enqueued
// before the step's first graph (so inside the captured CUDA graph, after the caller's table
// upload), fills them for every node of the step that reads G: the addresses change whenever the
// caller moves a gradient, and the graph is never re-captured for that. The launch count does not
// depend on the number of tensors or nodes: one thread per chunk of all nodes together.
#include "backend_cuda/grad_chunks.h"

#include "backend_cuda/cuda_check.h"

namespace renaissance {
namespace cuda {

namespace {

// Global chunk c belongs to the last job whose first_chunk <= c (jobs in first_chunk order,
// job 0 at 0): a binary search, since a step may have many G-reading nodes.
__device__ __forceinline__ uint32_t job_of(const GradChunkJob* jobs, uint32_t count, uint64_t c) {
  uint32_t lo = 0, hi = count;  // jobs[lo].first_chunk <= c < jobs[hi].first_chunk (hi = count: end)
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (jobs[mid].first_chunk <= c) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

__global__ void grad_chunks_kernel(const char* arena, const GradChunkJob* __restrict__ jobs, uint32_t count,
                                   uint64_t total) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t c = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < total; c += stride) {
    const GradChunkJob& job = jobs[job_of(jobs, count, c)];
    GradTableRef ref = job.ref;
    ref.table = reinterpret_cast<const uint64_t*>(arena + job.table_offset);
    const uint64_t k = c - job.first_chunk;
    job.out[k] = ref.chunk_address(k, job.span, job.elem);
  }
}

}  // namespace

void launch_grad_chunks(const char* arena, const GradChunkJob* jobs, uint32_t count, uint64_t total,
                        const LaunchConfig& launch, cudaStream_t stream) {
  if (count == 0 || total == 0) return;
  constexpr auto kernel = &grad_chunks_kernel;
  const int block = fit_block<kernel>(launch.block);
  grad_chunks_kernel<<<grid_for(total, block, launch), block, 0, stream>>>(arena, jobs, count, total);
  RN_CUDA_CHECK_LAUNCH("GRAD_CHUNKS");
}

}  // namespace cuda
}  // namespace renaissance
