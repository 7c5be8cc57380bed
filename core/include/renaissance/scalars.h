// Slots of the scalar regions. Hyperparameters and per-step state live in the arena so that
// kernels read them through pointers: a captured CUDA graph stays valid when lr or the loss
// scale changes, and the step counter and bias corrections are advanced on the device.
#pragma once

#include <cstdint>

namespace renaissance {

enum ScalarF32 : int {
  kLr = 0,
  kWeightDecay,
  kDecayFactor,  // 1 - lr*wd, formed in double on the host whenever lr or wd is set
  kMomentum,
  kBeta1,
  kBeta2,
  kOneMinusBeta1,  // formed in double from the configured beta1 (never 1.0f - beta1f)
  kOneMinusBeta2,
  kEps,
  kInvLossScale,  // 1/scale, formed in double
  kBiasCorrection1,  // 1/(1 - beta1^t), advanced on the device each applied step
  kBiasCorrection2,
  // Global gradient-norm clipping (docs/math.md): min(1, max_norm/(total + 1e-6)) rounded to
  // float once, written on the device each step; 1.0f when clipping is off (x*1.0f == x).
  kClipCoefficient,
  kNumScalarF32
};

enum ScalarI32 : int {
  kStep = 0,         // applied steps t
  kHasNonFinite,     // 1 when the last check found NaN/Inf in G: the step is skipped
  kSkippedSteps,     // total skipped steps
  kNumScalarI32
};

enum ScalarF64 : int {
  kBeta1D = 0,  // beta1, beta2 as configured, for beta^t in double
  kBeta2D,
  kWeightDecayD,  // the trust ratio is computed in double from the configured values
  kEpsD,
  kTrustCoefficientD,
  kMaxGradNormD,  // clipping's max_norm as configured (0: off)
  kGradNormD,     // the total ‖ĝ‖ of the last step (clipping on), for Task::last_grad_norm()
  kNumScalarF64
};

// Host/device-visible pointers to the three scalar regions.
struct ScalarPtrs {
  float* f32;
  int32_t* i32;
  double* f64;
};

// One tile of the canonical norm reduction (math/norm_reduction.h): a run of at most kNormTile
// elements of one tensor of the group a norm pass covers. `start` is relative to the first
// element of that group.
struct NormTile {
  int64_t start;
  int32_t length;
  int32_t tensor;  // index of the tensor within its group
};
static_assert(sizeof(NormTile) == 16, "NormTile is shared with device code");

// The tiles of one tensor: tiles [first_tile, first_tile + tile_count).
struct NormTensor {
  int64_t first_tile;
  int64_t tile_count;
};
static_assert(sizeof(NormTensor) == 16, "NormTensor is shared with device code");

}  // namespace renaissance
