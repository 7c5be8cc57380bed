// CPU op ADVANCE_STEP: the step counter and the Adam bias corrections, advanced only when the
// step is applied (math::advance_step, the same function the CUDA kernel runs). Scalar code: it
// runs once per step.
#include "backend_cpu/cpu_ops.h"
#include "renaissance/math/step_state.h"

namespace renaissance {
namespace cpu {

void advance_counters(const CpuContext& ctx, const GraphNode& node) {
  if (node.work.tensor_state.count == 0) {
    math::advance_step(ctx.scalars.i32, ctx.scalars.f32, ctx.scalars.f64, node.flags.bias_correction, node.work.hyper_groups);
    return;
  }
  // tensor_mask: every tensor's own count (block b = tensor b), then the task-wide counters.
  int32_t* mask = ctx.at<int32_t>(node.work.tensor_state);
  const int n = static_cast<int>(node.work.tensor_state.count / 2);
  for (int b = 0; b < n; ++b) {
    math::advance_tensor_step(ctx.scalars.i32, ctx.scalars.f32, ctx.scalars.f64, node.flags.bias_correction, b, mask, mask + n);
  }
  math::advance_task_counters(ctx.scalars.i32);
}

void run_ADVANCE_STEP(const CpuContext& ctx, const GraphNode& node) { advance_counters(ctx, node); }

}  // namespace cpu
}  // namespace renaissance
