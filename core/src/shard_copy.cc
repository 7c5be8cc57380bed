// The model copy of one rank's slice (docs/distributed.md): an element-wise update node's
// ModelCopy cut to elements [lo, hi) of its group. The tensor table stays the group's: the copy
// span moves to lo and the writer looks element j up as group element base + j, so each element
// keeps its stochastic-rounding key (param, index within the tensor) and a rank rounds exactly
// the bits one device rounds for those elements, also where the cut falls inside an 8-element
// Philox block.
#include <algorithm>

#include "renaissance/shard_layout.h"

namespace renaissance {

ModelCopy cut_model_copy(const ModelCopy& copy, uint64_t lo, uint64_t hi) {
  ModelCopy out = copy;
  hi = std::max(lo, hi);
  out.c.offset += lo * precision_bytes(copy.precision);
  out.c.count = hi - lo;
  out.base = copy.base + lo;
  return out;
}

}  // namespace renaissance
