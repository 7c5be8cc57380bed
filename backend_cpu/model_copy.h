// The CPU model copy's rounding loop (ops_model_copy.cc), declared for write_model_copy and for
// tests/cpu/test_model_copy_simd.cc, which runs it under every compiled Highway target and compares
// it bit for bit with the scalar definitions of math/precision.h.
#pragma once

#include <cstdint>

#include "renaissance/precision.h"

namespace renaissance {
namespace cpu {

// Rounds the masters w[0, n) into c[0, n); w[i] is element first + i of parameter `param`, the
// index that keys stochastic rounding at applied step t under `seed`. Runs on the Highway target
// the dispatcher picks (hwy::SetSupportedTargetsForTest restricts it).
// c holds n encodings of precision_bytes(precision) each (bf16 / fp16 vectorised, any other
// encoding by the scalar definitions).
void round_model_copy(Precision precision, Rounding rounding, const float* w, void* c, uint64_t n,
                      uint64_t first, uint64_t seed, uint64_t t, uint32_t param);

// The name of the Highway target round_model_copy dispatches to now.
const char* model_copy_target();

}  // namespace cpu
}  // namespace renaissance
