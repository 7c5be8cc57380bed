// CPU op ADVANCE_STEP: the step counter and the Adam bias corrections, advanced only when the
// step is applied. Scalar code: it runs once per step.
#include "backend_cpu/cpu_backend.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cpu {

void run_ADVANCE_STEP(const CpuContext& ctx, const GraphNode& node) {
  int32_t* i32 = ctx.scalars.i32;
  if (i32[kHasNonFinite] != 0) {
    i32[kSkippedSteps] += 1;
    return;
  }
  const int32_t t = i32[kStep] + 1;
  i32[kStep] = t;
  if (node.bias_correction) {
    ctx.scalars.f32[kBiasCorrection1] = math::bias_correction(ctx.scalars.f64[kBeta1D], t);
    ctx.scalars.f32[kBiasCorrection2] = math::bias_correction(ctx.scalars.f64[kBeta2D], t);
  }
}

}  // namespace cpu
}  // namespace renaissance
