// CPU op ADVANCE_STEP: the step counter and the Adam bias corrections, advanced only when the
// step is applied (math::advance_step, the same function the CUDA kernel runs). Scalar code: it
// runs once per step.
#include "backend_cpu/cpu_ops.h"
#include "renaissance/math/step_state.h"

namespace renaissance {
namespace cpu {

void run_ADVANCE_STEP(const CpuContext& ctx, const GraphNode& node) {
  int32_t* state = node.tensor_state.count ? ctx.at<int32_t>(node.tensor_state) : nullptr;
  math::advance_step_node(ctx.scalars.i32, ctx.scalars.f32, ctx.scalars.f64, node.bias_correction, node.hyper_groups,
                          state, static_cast<int64_t>(node.tensor_state.count));
}

}  // namespace cpu
}  // namespace renaissance
