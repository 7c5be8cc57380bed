// CUDA ops of LAMB's updates. UPDATE_LAMB is phase 2 of the weight group (phase 1, the moments
// and the ‖w‖², ‖u‖² partials, is NORM_TILE_PARTIALS in kernels_norm.cu): the tile walker's
// update kernel (tile_walker.cuh) with the LAMB rule, u recomputed from the new m, v by
// math::lamb_direction (the function phase 1 used, so the same bits) and w = w - (lr*r)*u with the
// tensor's r from N. UPDATE_LAMB_BIAS is the bias-like group in one element-wise pass with r = 1.
// One launch each whatever the number of tensors.
#include <cuda_runtime.h>

#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/elementwise.cuh"
#include "backend_cuda/tile_walker.cuh"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {
namespace {

// w from m, v with the tile's lr*r (math::lamb_apply); reads no G, states M and V read only.
struct LambRule {
  static constexpr bool kReadsG = false;
  static constexpr int kStates = 2;
  __host__ __device__ static constexpr bool writes(int) { return false; }
  __device__ static float factor(float lr, float r) { return math::lamb_lr_ratio(lr, r); }
  __device__ static void apply(float& w, float m, float v, float lr_r, const Coeffs<float>& c) {
    math::lamb_apply<ScalarPolicy>(w, m, v, lr_r, c);
  }
};

// The bias-like group (element-wise, elementwise.cuh): m, v and w with r = 1.
struct LambBiasRule {
  static __device__ void apply(float& w, float g, float& m, float& v, const Coeffs<float>& c) {
    math::lamb_unit_ratio<ScalarPolicy>(w, g, m, v, c);
  }
};

}  // namespace

void launch_UPDATE_LAMB(const CudaContext& ctx, const GraphNode& node) {
  launch_tile_update<LambRule>(ctx, node, "lamb update kernel", node.span(Family::kM), node.span(Family::kV));
}

void launch_UPDATE_LAMB_BIAS(const CudaContext& ctx, const GraphNode& node) {
  launch_elementwise<LambBiasRule, true, true>(ctx, node, "lamb bias-like update kernel");
}

}  // namespace cuda
}  // namespace renaissance
