// CUDA ops of the Adam family: adam (L2 weight decay) and adamw (decoupled). The per-element
// rules are those of renaissance/math/update_rules.h; the bias corrections come from the
// scalar region, advanced on the device by ADVANCE_STEP.
#include "backend_cuda/elementwise.cuh"

namespace renaissance {
namespace cuda {
namespace {

struct AdamRule {
  static __device__ __forceinline__ void apply(float& w, float g, float& m, float& v, const Coeffs<float>& c) {
    math::adam<ScalarPolicy>(w, g, m, v, c);
  }
};
struct AdamWRule {
  static __device__ __forceinline__ void apply(float& w, float g, float& m, float& v, const Coeffs<float>& c) {
    math::adamw<ScalarPolicy>(w, g, m, v, c);
  }
};

}  // namespace

void launch_UPDATE_ADAM(const CudaContext& ctx, const GraphNode& node) {
  launch_elementwise<AdamRule, true, true>(ctx, node, "adam update kernel");
}
void launch_UPDATE_ADAMW(const CudaContext& ctx, const GraphNode& node) {
  launch_elementwise<AdamWRule, true, true>(ctx, node, "adamw update kernel");
}

}  // namespace cuda
}  // namespace renaissance
