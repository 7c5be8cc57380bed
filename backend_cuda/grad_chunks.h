// The per-step fill of the gradient table's chunk addresses (grad_chunks.cu; model_copy_key.h's
// GradTableRef::chunk_at) into the plan's T_GRAD_CHUNKS, for the backend class.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/cuda_ops.h"
#include "renaissance/model_copy_key.h"

namespace renaissance {
namespace cuda {

// One view (plan.h, TableView) whose G some node of the step reads through the gradient table:
// its tensor table, the S_GRAD_TABLE array and its chunk addresses (all arena offsets, so a job
// holds for whatever arena the step runs on), its G span's element count and encoding size.
// first_chunk: the sum of the earlier jobs' chunk counts.
struct GradChunkJob {
  TensorTable tensors;
  uint64_t table_offset = 0;
  uint64_t out_offset = 0;
  uint64_t span = 0;
  uint64_t first_chunk = 0;
  uint32_t elem = 4;
};

// The jobs of one step, passed to the kernel by value (at most one per view).
struct GradChunkJobs {
  GradChunkJob job[kNumTableViews];
  uint32_t count = 0;
  uint64_t total = 0;  // chunks of all jobs
};

// The jobs of a step: one per distinct view its table-reading nodes read (none without a table).
GradChunkJobs grad_chunk_jobs(const CompiledStep& step);

// One kernel: chunk k of each job's view gets ref.chunk_address(k, span, elem) at out_offset.
// Nothing when there is no job.
void launch_grad_chunks(char* arena, const GradChunkJobs& jobs, const LaunchConfig& launch, cudaStream_t stream);

}  // namespace cuda
}  // namespace renaissance
