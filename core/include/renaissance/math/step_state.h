// The per-step scalar state machine, written once for both backends: a step whose check found a
// non-finite gradient only counts as skipped; an applied step advances t and, for the kinds with
// bias corrections, 1/(1-β1^t) and 1/(1-β2^t) (formed in double, rounded to float once).
#pragma once

#include <cstdint>

#include "renaissance/math/host_device.h"
#include "renaissance/math/update_rules.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace math {

RN_HD void advance_step(int32_t* i32, float* f32, const double* f64, bool with_bias_correction) {
  if (i32[kHasNonFinite] != 0) {
    i32[kSkippedSteps] += 1;
    return;
  }
  const int32_t t = i32[kStep] + 1;
  i32[kStep] = t;
  if (with_bias_correction) {
    f32[kBiasCorrection1] = bias_correction(f64[kBeta1D], t);
    f32[kBiasCorrection2] = bias_correction(f64[kBeta2D], t);
  }
}

}  // namespace math
}  // namespace renaissance
