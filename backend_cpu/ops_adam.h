// The Adam-family chunk kernels by name, for the op runners (ops_adam.cc) and for
// bench_cpu_step's compute-only loop, which times the very kernel a step runs on data in L1.
#pragma once

#include "backend_cpu/cpu_ops.h"

namespace renaissance {
namespace cpu {

// adamw (decoupled) or adam (L2) over one chunk (simd_policy-inl.h, for_each_element).
ElementwiseFn adam_kernel(bool decoupled);
// The same with amsgrad: also reads and writes the chunk's VMAX (the running max of v).
ElementwiseXFn adam_amsgrad_kernel(bool decoupled);

}  // namespace cpu
}  // namespace renaissance
