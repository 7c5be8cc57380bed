// The host side of the fused bf16/fp16 model copy (issue 14; the device side is
// model_copy.cuh, called by every update kernel). The separate copy kernel that re-read W after
// each update is gone: every op that can carry a copy (the element-wise updates, LARS, LAMB)
// writes it from its registers. What remains here is the chunk index that lets a thread find an
// element's tensor, built once per node at prepare().
#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend_cuda/cuda_ops.h"
#include "renaissance/error.h"

namespace renaissance {
namespace cuda {

std::vector<int32_t> model_copy_chunks(const ModelCopy& copy) {
  // The span the node's kernels address: the copy span, or further where a tile node's tensors
  // (cut to a rank's tiles, which keep group coordinates) reach.
  uint64_t span = copy.c.count;
  for (const CopyTensor& t : copy.tensors) span = std::max(span, t.begin + t.numel);
  if (copy.tensors.size() > static_cast<size_t>(INT32_MAX)) throw_invalid("model copy: too many tensors in one node");
  std::vector<int32_t> chunks((span + kCopyChunk - 1) / kCopyChunk);
  size_t i = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    const uint64_t start = k * kCopyChunk;
    while (i < copy.tensors.size() && copy.tensors[i].begin + copy.tensors[i].numel <= start) ++i;
    chunks[k] = static_cast<int32_t>(i);
  }
  return chunks;
}

}  // namespace cuda
}  // namespace renaissance
