// The model copy of one rank's slice (docs/distributed.md): an update node's
// ModelCopy cut to elements [lo, hi) of its group. Each tensor keeps its stochastic-rounding key
// (param, index within the tensor): a cut tensor records the index of its first kept element in
// CopyTensor::first, so a rank rounds exactly the bits one device rounds for those elements,
// also where the cut falls inside an 8-element Philox block.
#include <algorithm>

#include "renaissance/shard_layout.h"

namespace renaissance {

ModelCopy cut_model_copy(const ModelCopy& copy, uint64_t lo, uint64_t hi, bool move_span) {
  ModelCopy out = copy;
  out.tensors.clear();
  hi = std::max(lo, hi);
  const uint64_t base = move_span ? lo : 0;
  if (move_span) {
    out.c.offset += lo * sizeof(uint16_t);
    out.c.count = hi - lo;
  }
  for (const CopyTensor& t : copy.tensors) {
    const uint64_t b = std::max(lo, t.begin), e = std::min(hi, t.begin + t.numel);
    if (e <= b) continue;
    CopyTensor kept = t;
    kept.begin = b - base;
    kept.numel = e - b;
    kept.first = t.first + (b - t.begin);
    out.tensors.push_back(kept);
  }
  return out;
}

}  // namespace renaissance
