// CUDA op ADVANCE_STEP (the step counter and the Adam bias corrections, advanced on the device
// only when the step is applied) and the synthetic gradient fill of Backend::fill_synthetic_gradients.
#include <cuda_runtime.h>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "renaissance/math/precision.h"
#include "renaissance/math/synthetic_gradient.h"
#include "renaissance/math/step_state.h"

namespace renaissance {
namespace cuda {
namespace {

// One thread runs math::advance_step, the function the CPU's run_ADVANCE_STEP calls.
__global__ void advance_step_kernel(int32_t* __restrict__ i32, float* __restrict__ f32,
                                    const double* __restrict__ f64, bool bias_correction, int hyper_groups) {
  math::advance_step(i32, f32, f64, bias_correction, hyper_groups);
}

// tensor_mask: one thread per tensor (its count and corrections), thread 0 also the task-wide
// counters; the parts write disjoint slots (math/step_state.h).
__global__ void advance_tensor_steps_kernel(int32_t* __restrict__ i32, float* __restrict__ f32,
                                            const double* __restrict__ f64, bool bias_correction, int n,
                                            int32_t* __restrict__ tensor_state) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < n) math::advance_tensor_step(i32, f32, f64, bias_correction, b, tensor_state, tensor_state + n);
  if (b == 0) math::advance_task_counters(i32);
}

__global__ void synthetic_gradient_kernel(float* __restrict__ g, uint64_t count, uint64_t seed, uint64_t step,
                                          uint64_t tensor, float amplitude) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    g[i] = math::synthetic_gradient(seed, step, tensor, i, amplitude);
  }
}

// Model-dtype gradients: the synthetic value rounded to nearest even into `dtype`'s encoding
// (math::encoding_bytes(dtype) bytes each).
__global__ void synthetic_gradient_half_kernel(char* __restrict__ g, uint64_t count, uint64_t seed, uint64_t step,
                                               uint64_t tensor, float amplitude, Precision dtype) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float x = math::synthetic_gradient(seed, step, tensor, i, amplitude);
    math::store_encoding(dtype, g, i, math::f32_to_encoded_rne(dtype, x));
  }
}

}  // namespace

void launch_synthetic_gradient_half(void* g, uint64_t count, uint64_t seed, uint64_t step, uint64_t tensor,
                                    float amplitude, Precision dtype, const LaunchConfig& launch, cudaStream_t stream) {
  if (count == 0) return;
  const int block = fit_block<&synthetic_gradient_half_kernel>(launch.block);
  synthetic_gradient_half_kernel<<<grid_for(count, block, launch), block, 0, stream>>>(
      static_cast<char*>(g), count, seed, step, tensor, amplitude, dtype);
  RN_CUDA_CHECK_LAUNCH("synthetic_gradient_half_kernel");
}

void launch_ADVANCE_STEP(const CudaContext& ctx, const GraphNode& node) {
  if (node.work.tensor_state.count != 0) {
    const int n = static_cast<int>(node.work.tensor_state.count / 2);
    constexpr int kThreads = 128;
    advance_tensor_steps_kernel<<<(n + kThreads - 1) / kThreads + (n == 0 ? 1 : 0), kThreads, 0, ctx.stream>>>(
        ctx.scalars.i32, ctx.scalars.f32, ctx.scalars.f64, node.flags.bias_correction, n, ctx.at<int32_t>(node.work.tensor_state));
    RN_CUDA_CHECK_LAUNCH("advance_tensor_steps_kernel");
    return;
  }
  advance_step_kernel<<<1, 1, 0, ctx.stream>>>(ctx.scalars.i32, ctx.scalars.f32, ctx.scalars.f64,
                                               node.flags.bias_correction, node.work.hyper_groups);
  RN_CUDA_CHECK_LAUNCH("advance_step_kernel");
}

void launch_synthetic_gradient(float* g, uint64_t count, uint64_t seed, uint64_t step, uint64_t tensor,
                               float amplitude, const LaunchConfig& launch, cudaStream_t stream) {
  if (count == 0) return;
  const int block = fit_block<&synthetic_gradient_kernel>(launch.block);
  synthetic_gradient_kernel<<<grid_for(count, block, launch), block, 0, stream>>>(g, count, seed, step, tensor,
                                                                                  amplitude);
  RN_CUDA_CHECK_LAUNCH("synthetic_gradient_kernel");
}

}  // namespace cuda
}  // namespace renaissance
