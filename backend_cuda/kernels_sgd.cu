// CUDA ops of the SGD family: sgd, sgd_momentum, sgd_nesterov, each in decoupled or L2 weight
// decay mode. The per-element rules are those of renaissance/math/update_rules.h.
#include "backend_cuda/elementwise.cuh"

namespace renaissance {
namespace cuda {
namespace {

template <bool kL2>
struct SgdPlainRule {
  static __device__ __forceinline__ void apply(float& w, float g, float&, float&, const Coeffs<float>& c) {
    math::sgd<ScalarPolicy, kL2>(w, g, c);
  }
};
template <bool kL2>
struct SgdMomentumRule {
  static __device__ __forceinline__ void apply(float& w, float g, float& m, float&, const Coeffs<float>& c) {
    math::sgd_momentum<ScalarPolicy, kL2>(w, g, m, c);
  }
};
template <bool kL2>
struct SgdNesterovRule {
  static __device__ __forceinline__ void apply(float& w, float g, float& m, float&, const Coeffs<float>& c) {
    math::sgd_nesterov<ScalarPolicy, kL2>(w, g, m, c);
  }
};

template <template <bool> class Rule, bool kHasM>
void launch_sgd_kind(const CudaContext& ctx, const GraphNode& node, const char* name) {
  if (node.flags.weight_decay_mode == WeightDecayMode::kL2) {
    launch_elementwise<Rule<true>, kHasM, false>(ctx, node, name);
  } else {
    launch_elementwise<Rule<false>, kHasM, false>(ctx, node, name);
  }
}

}  // namespace

void launch_UPDATE_SGD(const CudaContext& ctx, const GraphNode& node) {
  launch_sgd_kind<SgdPlainRule, false>(ctx, node, "sgd update kernel");
}
void launch_UPDATE_SGD_MOMENTUM(const CudaContext& ctx, const GraphNode& node) {
  launch_sgd_kind<SgdMomentumRule, true>(ctx, node, "sgd_momentum update kernel");
}
void launch_UPDATE_SGD_NESTEROV(const CudaContext& ctx, const GraphNode& node) {
  launch_sgd_kind<SgdNesterovRule, true>(ctx, node, "sgd_nesterov update kernel");
}

}  // namespace cuda
}  // namespace renaissance
