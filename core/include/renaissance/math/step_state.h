// The per-step scalar state machine, written once for both backends: a step whose check found a
// non-finite gradient only counts as skipped; an applied step advances t and, for the kinds with
// bias corrections, 1/(1-β1^t) and 1/(1-β2^t) (formed in double, rounded to float once), and in
// every block the factor of ĝ' in the momentum update (SGD's dampening, 1 at the first step).
#pragma once

#include <cstdint>

#include "renaissance/math/host_device.h"
#include "renaissance/math/update_rules.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace math {

// Scalar block b's factors at applied step t: the momentum factor and, where the kind has them,
// the bias corrections from the block's own betas.
RN_HD void set_block_factors(float* f32, const double* f64, bool with_bias_correction, int b, int32_t t) {
  float* s = f32 + b * kNumScalarF32;
  s[kMomentumGradFactor] = momentum_grad_factor(s[kOneMinusDampening], t);
  if (with_bias_correction) {
    const double* d = f64 + b * kNumScalarF64;
    s[kBiasCorrection1] = bias_correction(d[kBeta1D], t);
    s[kBiasCorrection2] = bias_correction(d[kBeta2D], t);
  }
}

// `groups` scalar blocks (scalars.h): each block's corrections from its own betas.
RN_HD void advance_step(int32_t* i32, float* f32, const double* f64, bool with_bias_correction, int groups = 1) {
  if (i32[kHasNonFinite] != 0) {
    i32[kSkippedSteps] += 1;
    return;
  }
  const int32_t t = i32[kStep] + 1;
  i32[kStep] = t;
  for (int h = 0; h < groups; ++h) set_block_factors(f32, f64, with_bias_correction, h, t);
}

// TaskOptions::tensor_mask, in two parts so that CUDA runs one thread per tensor: the task-wide
// counters as above (advance_task_counters), and block b (tensor b), which advances its own count
// steps[b] and its corrections only when the step is applied and mask[b] == 0 (a masked tensor
// keeps both). Neither part writes what the other reads (kHasNonFinite is read-only here).
RN_HD void advance_task_counters(int32_t* i32) {
  if (i32[kHasNonFinite] != 0) {
    i32[kSkippedSteps] += 1;
  } else {
    i32[kStep] += 1;
  }
}
RN_HD void advance_tensor_step(const int32_t* i32, float* f32, const double* f64, bool with_bias_correction, int b,
                               const int32_t* mask, int32_t* steps) {
  if (i32[kHasNonFinite] != 0 || mask[b] != 0) return;
  const int32_t t = steps[b] + 1;
  steps[b] = t;
  set_block_factors(f32, f64, with_bias_correction, b, t);
}

}  // namespace math
}  // namespace renaissance
