// CUDA ops of the Adam family: adam (L2 weight decay) and adamw (decoupled). The per-element
// rules are those of renaissance/math/update_rules.h; the bias corrections come from the
// scalar region, advanced on the device by ADVANCE_STEP.
#include "backend_cuda/elementwise.cuh"

namespace renaissance {
namespace cuda {
namespace {

// apply_x: amsgrad, x the element's running max of v (VMAX); the kernels take it where the node
// has a VMAX span (elementwise.cuh's run-time branch: no kernel of its own).
template <bool kDecoupled>
struct AdamRule {
  static constexpr bool kHasX = true;
  static __device__ __forceinline__ void apply(float& w, float g, float& m, float& v, const Coeffs<float>& c) {
    if constexpr (kDecoupled) {
      math::adamw<ScalarPolicy>(w, g, m, v, c);
    } else {
      math::adam<ScalarPolicy>(w, g, m, v, c);
    }
  }
  static __device__ __forceinline__ void apply_x(float& w, float g, float& m, float& v, float& x,
                                                 const Coeffs<float>& c) {
    if constexpr (kDecoupled) {
      math::adamw_amsgrad<ScalarPolicy>(w, g, m, v, x, c);
    } else {
      math::adam_amsgrad<ScalarPolicy>(w, g, m, v, x, c);
    }
  }
};

}  // namespace

void launch_UPDATE_ADAM(const CudaContext& ctx, const GraphNode& node) {
  launch_elementwise<AdamRule<false>, true, true>(ctx, node, "adam update kernel");
}
void launch_UPDATE_ADAMW(const CudaContext& ctx, const GraphNode& node) {
  launch_elementwise<AdamRule<true>, true, true>(ctx, node, "adamw update kernel");
}

}  // namespace cuda
}  // namespace renaissance
