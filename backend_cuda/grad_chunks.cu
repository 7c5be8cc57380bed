// TaskOptions::gradient_table on CUDA (the cheap lookup): the chunk addresses every G reader
// looks at first (model_copy_key.h's GradTableRef::chunk_at, in the plan's T_GRAD_CHUNKS). One
// kernel per step, enqueued before the step's first graph (so inside the captured CUDA graph,
// after the caller's table upload), fills them for every view the step's nodes read G through:
// the addresses change whenever the caller moves a gradient, and the graph is never re-captured
// for that. The launch count does not depend on the number of tensors or nodes: one thread per
// chunk of all views together.
#include "backend_cuda/grad_chunks.h"

#include "backend_cuda/cuda_check.h"
#include "renaissance/error.h"

namespace renaissance {
namespace cuda {

namespace {

__global__ void grad_chunks_kernel(char* arena, const GradChunkJobs jobs) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t c = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < jobs.total; c += stride) {
    // Global chunk c belongs to the last job whose first_chunk <= c (job 0 starts at 0).
    uint32_t j = 0;
    while (j + 1 < jobs.count && jobs.job[j + 1].first_chunk <= c) ++j;
    const GradChunkJob& job = jobs.job[j];
    GradTableRef ref;
    ref.lookup = table_lookup(arena, job.tensors);
    ref.table = reinterpret_cast<const uint64_t*>(arena + job.table_offset);
    const uint64_t k = c - job.first_chunk;
    reinterpret_cast<uint64_t*>(arena + job.out_offset)[k] = ref.chunk_address(k, job.span, job.elem);
  }
}

}  // namespace

GradChunkJobs grad_chunk_jobs(const CompiledStep& step) {
  GradChunkJobs jobs;
  for (const auto& graph : step.graphs) {
    for (const GraphNode& node : graph) {
      const Span& out = node.grad.chunk_addresses;
      if (node.grad.table.count == 0 || out.count == 0) continue;
      bool listed = false;
      for (uint32_t j = 0; j < jobs.count; ++j) listed = listed || jobs.job[j].out_offset == out.offset;
      if (listed) continue;
      if (jobs.count == kNumTableViews) {
        throw Error(ErrorKind::kBackend, "cuda backend: a step reads G through more than " +
                                             std::to_string(kNumTableViews) + " tensor tables");
      }
      GradChunkJob& job = jobs.job[jobs.count++];
      job.tensors = node.grad.tensors;
      job.table_offset = node.grad.table.offset;
      job.out_offset = out.offset;
      job.span = node.span(Family::kG).count;
      job.first_chunk = jobs.total;
      job.elem = precision_bytes(node.grad.encoding);
      jobs.total += out.count;
    }
  }
  return jobs;
}

void launch_grad_chunks(char* arena, const GradChunkJobs& jobs, const LaunchConfig& launch, cudaStream_t stream) {
  if (jobs.count == 0 || jobs.total == 0) return;
  constexpr auto kernel = &grad_chunks_kernel;
  const int block = fit_block<kernel>(launch.block);
  grad_chunks_kernel<<<grid_for(jobs.total, block, launch), block, 0, stream>>>(arena, jobs);
  RN_CUDA_CHECK_LAUNCH("GRAD_CHUNKS");
}

}  // namespace cuda
}  // namespace renaissance
