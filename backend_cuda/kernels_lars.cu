// CUDA ops of the LARS update: the tile walker's update kernel (tile_walker.cuh) over the weight
// group with the LARS rule (plain and Nesterov), each tile with its tensor's trust ratio from N
// (written by the norm pass, kernels_norm.cu). The bias-like group uses the SGD kernels
// (kKindTable).
#include <cuda_runtime.h>

#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/tile_walker.cuh"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {
namespace {

// w and m from ĝ with the tile's lr*η (math::lars); reads G, state M.
template <bool kNesterov>
struct LarsRule {
  static constexpr bool kReadsG = true;
  static constexpr int kStates = 1;
  __host__ __device__ static constexpr bool writes(int) { return true; }
  __device__ static float factor(float lr, float eta) { return math::lars_lr_eta(lr, eta); }
  __device__ static void apply(float& w, float g, float& m, float lr_eta, const Coeffs<float>& c) {
    math::lars<ScalarPolicy, kNesterov>(w, g, m, lr_eta, c);
  }
};

}  // namespace

// The node's flag picks the Nesterov form.
void launch_UPDATE_LARS(const CudaContext& ctx, const GraphNode& node) {
  if (node.flags.nesterov) {
    launch_tile_update<LarsRule<true>>(ctx, node, "lars update kernel (nesterov)", node.span(Family::kM));
  } else {
    launch_tile_update<LarsRule<false>>(ctx, node, "lars update kernel", node.span(Family::kM));
  }
}

}  // namespace cuda
}  // namespace renaissance
