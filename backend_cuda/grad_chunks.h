// The per-step fill of the gradient table's chunk addresses (grad_chunks.cu; model_copy_key.h's
// GradTableRef::chunk_at), shared by the backend class, which owns the memory and the job lists.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend_cuda/cuda_ops.h"
#include "renaissance/model_copy_key.h"

namespace renaissance {
namespace cuda {

// One G-reading node of a step: its lookup (tensors and chunk index in device memory; ref.table
// unused: the S_GRAD_TABLE array is read at arena + table_offset, so a job list stays valid for
// whatever arena the step runs on), its G span's element count and encoding size, and where its
// grad_chunk_count(span) addresses go. first_chunk: the sum of the earlier jobs' counts.
struct GradChunkJob {
  GradTableRef ref;
  uint64_t table_offset = 0;
  uint64_t* out = nullptr;
  uint64_t span = 0;
  uint64_t first_chunk = 0;
  uint32_t elem = 4;
};

// One kernel: out[k] = ref.chunk_address(k, span, elem) for every chunk k of every job (jobs in
// device memory, first_chunk ascending from 0; total = the sum of the counts). Nothing when empty.
void launch_grad_chunks(const char* arena, const GradChunkJob* jobs, uint32_t count, uint64_t total,
                        const LaunchConfig& launch, cudaStream_t stream);

}  // namespace cuda
}  // namespace renaissance
