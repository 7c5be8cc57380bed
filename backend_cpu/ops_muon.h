// Muon's orthogonalisation on the CPU, behind one function (ops_muon.cc): every CPU caller goes
// through orthogonalize_matrix, so a faster implementation of the same bits replaces one body.
#pragma once

#include <cstddef>

#include "renaissance/math/newton_schulz.h"

namespace renaissance {
namespace cpu {

// U (rows x cols, row-major) <- its Newton–Schulz orthogonalisation, in place, with these
// coefficients, steps and eps, on at most `threads` threads. mode 0 (exact): bit for bit
// math::newton_schulz_reference; false (u untouched) when a product would be longer than
// kExactMatmulMaxK. mode 1 (fast): fp32 products (newton_schulz_fast_cpu.h); always true.
// amx_tiles: exact mode's products may use the AMX tile unit (CpuTuning::amx_tiles; same bits).
bool orthogonalize_matrix(float* u, size_t rows, size_t cols, const math::NewtonSchulzCoefficients& coeff, int steps,
                          float eps, int threads, int mode = 0, bool amx_tiles = true);

}  // namespace cpu
}  // namespace renaissance
