// CUDA ops of the norm passes: NORM_TILE_PARTIALS (the tile walker's norm kernel,
// tile_walker.cuh: the per-tile squared norms of w and of the array the rule node.norm.inputs
// names, in the canonical order of renaissance/math/norm_reduction.h: ĝ for LARS, or LAMB's phase
// 1, which updates m and v and squares u) and NORM_TRUST_RATIO (each tensor's partials combined
// by math::tensor_sum_lane and the lane tree, then the ratio formula of the math file). Each op is
// one launch whatever the number of tensors: tiles and tensors come from tables the node carries.
#include <cuda_runtime.h>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/tile_walker.cuh"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {
namespace {

using math::kNormLanes;

// The norm-pass rules, one per NormInputs member: x, the value squared beside w.

// NormInputs::kWeightAndGradient: x = ĝ = (g*(1/scale))*clip (math::unscale); no state.
struct WeightAndGradientRule {
  static constexpr int kStates = 0;
  __device__ static float apply(float, float g, const Coeffs<float>& c) { return math::unscale<ScalarPolicy>(g, c); }
};

// NormInputs::kLambMoments, LAMB phase 1: m and v updated from ĝ and x = u (math::lamb_moments);
// states M and V, written.
struct LambMomentsRule {
  static constexpr int kStates = 2;
  __host__ __device__ static constexpr bool writes(int) { return true; }
  __device__ static float apply(float w, float g, float& m, float& v, const Coeffs<float>& c) {
    return math::lamb_moments<ScalarPolicy>(w, g, m, v, c);
  }
};

// One block of kNormLanes threads per tensor (grid-stride over tensors): thread k is sum-lane k
// (math::tensor_sum_lane, loads batched), block_lane_tree combines the sum-lanes, thread 0 applies
// the ratio formula. No serial loop over a tensor's tiles.
__global__ void __launch_bounds__(kNormLanes)
    trust_ratio_kernel(const NormTensor* __restrict__ tensors, int64_t num_tensors,
                       const double* __restrict__ partials, const double* __restrict__ f64,
                       const int32_t* __restrict__ flags, NormRatio formula, const int32_t* __restrict__ blocks,
                       float* __restrict__ eta) {
  if (flags[kHasNonFinite] != 0) return;
  static_assert(math::kNormComponents == 2, "block_lane_tree combines two sums");
  __shared__ LaneScratch sh;
  int buf = 0;
  for (int64_t k = blockIdx.x; k < num_tensors; k += gridDim.x, buf ^= 1) {
    const NormTensor tensor = tensors[k];
    double sums[math::kNormComponents];
    math::tensor_sum_lane(partials + math::kNormComponents * tensor.first_tile, tensor.tile_count,
                          static_cast<int>(threadIdx.x), sums);
    block_lane_tree(sh, buf, sums[0], sums[1]);
    // H > 1: the tensor's own block of configured doubles (scalars.h).
    const double* d = blocks == nullptr ? f64 : f64 + blocks[k] * kNumScalarF64;
    if (threadIdx.x == 0) eta[k] = math::trust_ratio(formula == NormRatio::kLamb, sums[0], sums[1], d);
  }
}

}  // namespace

void launch_NORM_TILE_PARTIALS(const CudaContext& ctx, const GraphNode& node) {
  switch (node.norm.inputs) {
    case NormInputs::kWeightAndGradient:
      return launch_tile_partials<WeightAndGradientRule>(ctx, node, "weight and gradient partials kernel");
    case NormInputs::kLambMoments:
      return launch_tile_partials<LambMomentsRule>(ctx, node, "lamb moment partials kernel", node.span(Family::kM), node.span(Family::kV));
  }
}

void launch_NORM_TRUST_RATIO(const CudaContext& ctx, const GraphNode& node) {
  const int64_t num_tensors = static_cast<int64_t>(node.norm.tensors.count);
  if (num_tensors == 0) return;
  trust_ratio_kernel<<<tile_grid(num_tensors, ctx.launch), kNormLanes, 0, ctx.stream>>>(
      ctx.at<const NormTensor>(node.norm.tensors), num_tensors, ctx.at<const double>(node.norm.partials),
      ctx.scalars.f64, ctx.scalars.i32, node.norm.ratio,
      node.work.tensor_blocks.count ? ctx.at<const int32_t>(node.work.tensor_blocks) : nullptr, ctx.at<float>(node.span(Family::kN)));
  RN_CUDA_CHECK_LAUNCH("trust_ratio_kernel");
}

}  // namespace cuda
}  // namespace renaissance
