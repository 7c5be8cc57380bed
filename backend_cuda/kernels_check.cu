// CUDA op CHECK_FINITE: does any gradient element anywhere hold NaN or ±Inf? Writes the
// has-non-finite flag (0 or 1) on the device, so that every later node of the step (and of the
// same graph replay) reads the verdict without the host looking at the data.
//
// One launch, no separate reset node: each block votes, counts itself in a backend-owned
// scratch pair (blocks that saw a bad value, blocks done), and the last block to finish writes
// the flag and zeroes the scratch for the next step (the threadfence-reduction pattern).
//
// With gradient-norm clipping, GRAD_NORM_PARTIALS replaces it: the same vote while each block
// squares its grad-norm tiles in the canonical order (math/norm_reduction.h), so G is read once
// for both; CLIP_COEFFICIENT then sums the partials in order into the total norm and the
// coefficient, on the device.
#include <cuda_runtime.h>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/access.cuh"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/math/step_state.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cuda {
namespace {

// An exponent field of all ones is exactly NaN or ±Inf.
__device__ __forceinline__ bool not_finite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

// Elements per thread per loop trip, in float4: independent loads in flight, since the grid is
// bounded (see launch_CHECK_FINITE) and each thread makes several trips.
constexpr int kCheckUnroll = 4;

// G through the reader of its encoding (grad_load.cuh): a widened bf16 / fp16 value is NaN or
// ±Inf exactly when its encoding is.
template <class G>
__global__ void check_finite_kernel(const G g_elements, uint64_t n4, int32_t* __restrict__ flags,
                                    unsigned* __restrict__ scratch) {
  bool bad = false;
  const auto g = g_elements.quads();
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t q0 = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; q0 < n4;
       q0 += kCheckUnroll * stride) {
    float4 v[kCheckUnroll];
#pragma unroll
    for (int k = 0; k < kCheckUnroll; ++k) {
      const uint64_t q = q0 + k * stride;
      v[k] = q < n4 ? g[q] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int k = 0; k < kCheckUnroll; ++k) {
      bad = bad || not_finite(v[k].x) || not_finite(v[k].y) || not_finite(v[k].z) || not_finite(v[k].w);
    }
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x != 0) return;
  if (bad) atomicAdd(&scratch[0], 1u);
  __threadfence();  // this block's count is visible before its ticket
  const unsigned ticket = atomicAdd(&scratch[1], 1u);
  if (ticket == gridDim.x - 1) {
    // Every other block has taken its ticket, so every count is in.
    const unsigned bad_blocks = atomicExch(&scratch[0], 0u);
    scratch[1] = 0u;
    flags[kHasNonFinite] = bad_blocks != 0u ? 1 : 0;
  }
}

// The vote's tail shared by both kernels: thread 0 of each block counts the block, the last one
// writes the flag and zeroes the scratch.
__device__ __forceinline__ void finish_vote(bool block_bad, int32_t* flags, unsigned* scratch) {
  if (block_bad) atomicAdd(&scratch[0], 1u);
  __threadfence();
  const unsigned ticket = atomicAdd(&scratch[1], 1u);
  if (ticket == gridDim.x - 1) {
    const unsigned bad_blocks = atomicExch(&scratch[0], 0u);
    scratch[1] = 0u;
    flags[kHasNonFinite] = bad_blocks != 0u ? 1 : 0;
  }
}

// tensor_mask (graph.h): the unmasked tensors' items of both groups (bias-like items first, then
// weight items), one block per item (grid-stride), each over its group's G span; same vote.
// G is read through its encoding's reader (grad_load.cuh), as in check_finite_kernel.
template <class G>
__global__ void check_finite_items_kernel(const G g_bias_elements, const HyperItem* __restrict__ bias_items,
                                          int64_t bias_count, const G g_weight_elements,
                                          const HyperItem* __restrict__ weight_items, int64_t weight_count,
                                          const int32_t* __restrict__ mask, int32_t* __restrict__ flags,
                                          unsigned* __restrict__ scratch) {
  bool bad = false;
  for (int64_t k = blockIdx.x; k < bias_count + weight_count; k += gridDim.x) {
    const bool bias = k < bias_count;
    const HyperItem item = bias ? bias_items[k] : weight_items[k - bias_count];
    if (mask[item.block] != 0) continue;
    const auto g = (bias ? g_bias_elements : g_weight_elements).quads();
    const uint64_t first = static_cast<uint64_t>(item.start) / 4;
    const uint64_t end = first + static_cast<uint64_t>(item.count) / 4;
    for (uint64_t q = first + threadIdx.x; q < end; q += blockDim.x) {
      const float4 v = g[q];
      bad = bad || not_finite(v.x) || not_finite(v.y) || not_finite(v.z) || not_finite(v.w);
    }
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) finish_vote(bad, flags, scratch);
}

using math::kNormLanes;

// Loads in flight per thread in the grad-norm kernel, consumed in order.
constexpr int kGradNormBatch = 16;

// tensor_mask (graph.h): which elements of the node's G span belong to masked tensors. The
// grad-norm tiles cross tensor boundaries, so the kernel finds each element's work item: the
// items of a group are disjoint and in span order, and a thread's elements come in increasing
// order, so a cursor per group (placed by binary search at the thread's first element of each
// tile) only moves forward.
struct GradMask {
  const int32_t* mask = nullptr;  // nullptr: no element is masked (no tensor_mask, or its clear program)
  const HyperItem* items[2] = {nullptr, nullptr};  // bias-like, weight (Group order)
  int64_t count[2] = {0, 0};
  int64_t first[2] = {0, 0};  // the group span's first element in the node's G span
};

// The first item of a group that ends after element `local` of the group span.
__device__ __forceinline__ int64_t first_item_ending_after(const HyperItem* items, int64_t count, int64_t local) {
  int64_t lo = 0, hi = count;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (items[mid].start + items[mid].count <= local) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Is element e of the G span in a masked tensor? The weight group lies after the bias-like one;
// padding between or after the groups belongs to no item.
__device__ __forceinline__ bool masked_element(const GradMask& gm, int64_t e, int64_t* cursor) {
  const int group = e >= gm.first[1] ? 1 : 0;
  const int64_t local = e - gm.first[group];
  const HyperItem* items = gm.items[group];
  int64_t k = cursor[group];
  while (k < gm.count[group] && items[k].start + items[k].count <= local) ++k;
  cursor[group] = k;
  return k < gm.count[group] && items[k].start <= local && gm.mask[items[k].block] != 0;
}

// One block of kNormLanes threads per grad-norm tile (grid-stride over tiles): thread j is lane j
// and adds, in order, the squares in double of g*(1/scale) at j, j + 256, ... of the tile; then
// the fixed halving tree (math::norm_lane_tree's additions). With `check`, every element is also
// tested and the block votes as in check_finite_kernel. With a GradMask, a masked tensor's
// element is read as +0.0 (it adds +0.0 and is finite: the bits of a zeroed G).
template <class G>
__global__ void __launch_bounds__(kNormLanes)
    grad_norm_partials_kernel(const G g, uint64_t count, int64_t num_tiles,
                              const float* __restrict__ s, bool check, int32_t* __restrict__ flags,
                              unsigned* __restrict__ scratch, double* __restrict__ partials, const GradMask gm) {
  __shared__ double lanes[kNormLanes];
  const math::Coeffs<float> c = math::make_coeffs<float>(s, CoeffSet::kWeight, [](float x) { return x; });
  const int j = threadIdx.x;
  bool bad = false;
  for (int64_t t = blockIdx.x; t < num_tiles; t += gridDim.x) {
    const uint64_t begin = static_cast<uint64_t>(t) * math::kGradNormTile;
    const uint64_t left = count - begin;
    const int64_t length = left < static_cast<uint64_t>(math::kGradNormTile) ? static_cast<int64_t>(left)
                                                                             : math::kGradNormTile;
    const G tg = g + static_cast<int64_t>(begin);
    int64_t cursor[2] = {0, 0};
    if (gm.mask != nullptr) {
      const int64_t at = static_cast<int64_t>(begin) + j;
      for (int group = 0; group < 2; ++group) {
        const int64_t local = at - gm.first[group];
        cursor[group] = first_item_ending_after(gm.items[group], gm.count[group], local < 0 ? 0 : local);
      }
    }
    double acc = 0.0;
    for (int64_t base = j; base < length; base += static_cast<int64_t>(kGradNormBatch) * kNormLanes) {
      float x[kGradNormBatch];
#pragma unroll
      for (int k = 0; k < kGradNormBatch; ++k) {
        const int64_t idx = base + static_cast<int64_t>(k) * kNormLanes;
        x[k] = idx < length ? tg[idx] : 0.0f;
        if (gm.mask != nullptr && idx < length && masked_element(gm, static_cast<int64_t>(begin) + idx, cursor)) {
          x[k] = 0.0f;
        }
      }
#pragma unroll
      for (int k = 0; k < kGradNormBatch; ++k) {
        // Past the tile's end x is +0.0: its square adds +0.0, which changes no sum.
        bad = bad || not_finite(x[k]);
        acc = acc + math::square_in_double(math::loss_unscale<math::ScalarPolicy>(x[k], c));
      }
    }
    lanes[j] = acc;
    __syncthreads();
    for (int stride = kNormLanes / 2; stride > 0; stride >>= 1) {
      if (j < stride) lanes[j] = lanes[j] + lanes[j + stride];
      __syncthreads();
    }
    if (j == 0) partials[t] = math::stored_grad_norm_partial(lanes[0]);
    __syncthreads();
  }
  if (!check) return;
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) finish_vote(bad, flags, scratch);
}

// One block of kGradNormSumLanes threads: thread j is sum-lane j (math::grad_norm_sum_lane), then
// the fixed halving tree in shared memory (math::grad_norm_sum_tree's additions), then the total
// and the coefficient from the math file. A skipped step changes neither. Thread 0 then advances
// the step (math::advance_step): with clipping this node replaces ADVANCE_STEP.
constexpr int kCoefficientBlock = math::kGradNormSumLanes;

// tensor_mask (tensor_state non-null, n tensors): the threads advance the per-tensor counts as
// advance_tensor_steps_kernel does, thread 0 the task-wide counters (disjoint slots).
__device__ __forceinline__ void advance_clipped_step(int32_t* i32, float* f32, const double* f64,
                                                     bool bias_correction, int hyper_groups,
                                                     int32_t* tensor_state, int n) {
  if (tensor_state == nullptr) {
    if (threadIdx.x == 0) math::advance_step(i32, f32, f64, bias_correction, hyper_groups);
    return;
  }
  for (int b = threadIdx.x; b < n; b += blockDim.x) {
    math::advance_tensor_step(i32, f32, f64, bias_correction, b, tensor_state, tensor_state + n);
  }
  if (threadIdx.x == 0) math::advance_task_counters(i32);
}

__global__ void __launch_bounds__(kCoefficientBlock)
    clip_coefficient_kernel(const double* __restrict__ partials, int64_t num_tiles, int32_t* __restrict__ i32,
                            float* __restrict__ f32, double* __restrict__ f64, bool bias_correction,
                            int hyper_groups, int32_t* __restrict__ tensor_state, int tensors) {
  if (i32[kHasNonFinite] != 0) {
    advance_clipped_step(i32, f32, f64, bias_correction, hyper_groups, tensor_state, tensors);
    return;
  }
  __shared__ double lanes[kCoefficientBlock];
  const int j = threadIdx.x;
  lanes[j] = math::grad_norm_sum_lane(partials, num_tiles, j);
  __syncthreads();
  for (int stride = kCoefficientBlock / 2; stride > 0; stride >>= 1) {
    if (j < stride) lanes[j] = lanes[j] + lanes[j + stride];
    __syncthreads();
  }
  if (j == 0) {
    const double total = math::grad_norm_total(lanes[0]);
    f64[kGradNormD] = total;
    // Task-wide: the same coefficient in every hyperparameter block (scalars.h).
    const float coefficient = math::clip_coefficient(total, f64[kMaxGradNormD]);
    for (int h = 0; h < hyper_groups; ++h) f32[h * kNumScalarF32 + kClipCoefficient] = coefficient;
  }
  // Then the step counters (they share no slot with the coefficient and the total).
  advance_clipped_step(i32, f32, f64, bias_correction, hyper_groups, tensor_state, tensors);
}

}  // namespace

void launch_GRAD_NORM_PARTIALS(const CudaContext& ctx, const GraphNode& node) {
  const int64_t num_tiles = static_cast<int64_t>(node.norm.partials.count);
  // Launched even without tiles (one block) when it must write the flag every step.
  unsigned grid = tile_grid(num_tiles, ctx.launch);
  if (ctx.launch.grid == 0) grid = std::min<unsigned>(grid, ctx.launch.sm_count * (2048 / kNormLanes));
  GradMask gm;
  if (node.work.tensor_state.count != 0) {
    const uint64_t element_bytes = precision_bytes(node.grad.encoding);
    gm.mask = ctx.at<const int32_t>(node.work.tensor_state);
    for (int group = 0; group < 2; ++group) {
      gm.items[group] = ctx.at<const HyperItem>(node.work.group_items[group]);
      gm.count[group] = static_cast<int64_t>(node.work.group_items[group].count);
      // Signed: a sharded step's node starts inside the group (ShardedStep cuts the node's G span to its tiles).
      gm.first[group] = (static_cast<int64_t>(node.work.group_g[group].offset) - static_cast<int64_t>(node.span(Family::kG).offset)) /
                        static_cast<int64_t>(element_bytes);
    }
  }
  with_grad(ctx, node, [&](auto g) {
    grad_norm_partials_kernel<<<grid, kNormLanes, 0, ctx.stream>>>(
        g, node.span(Family::kG).count, num_tiles, ctx.scalars.f32, node.flags.check_finite, ctx.scalars.i32, ctx.check_scratch,
        ctx.at<double>(node.norm.partials), gm);
    RN_CUDA_CHECK_LAUNCH("grad_norm_partials_kernel");
  });
}

void launch_CLIP_COEFFICIENT(const CudaContext& ctx, const GraphNode& node) {
  clip_coefficient_kernel<<<1, kCoefficientBlock, 0, ctx.stream>>>(
      ctx.at<const double>(node.norm.partials), static_cast<int64_t>(node.norm.partials.count), ctx.scalars.i32,
      ctx.scalars.f32, ctx.scalars.f64, node.flags.bias_correction, node.work.hyper_groups,
      node.work.tensor_state.count ? ctx.at<int32_t>(node.work.tensor_state) : nullptr,
      static_cast<int>(node.work.tensor_state.count / 2));
  RN_CUDA_CHECK_LAUNCH("clip_coefficient_kernel");
}

void launch_CHECK_FINITE(const CudaContext& ctx, const GraphNode& node) {
  if (node.work.tensor_state.count != 0) {
    const int64_t bias = static_cast<int64_t>(node.work.group_items[0].count);
    const int64_t weight = static_cast<int64_t>(node.work.group_items[1].count);
    // The two groups' G spans: the node's reader (arena or gradient table) moved to each group's
    // first element in node.g (group_g lie inside it).
    const int64_t element_bytes = precision_bytes(node.grad.encoding);
    const int64_t bias_first = (static_cast<int64_t>(node.work.group_g[0].offset) - static_cast<int64_t>(node.span(Family::kG).offset)) / element_bytes;
    const int64_t weight_first = (static_cast<int64_t>(node.work.group_g[1].offset) - static_cast<int64_t>(node.span(Family::kG).offset)) / element_bytes;
    with_grad(ctx, node, [&](auto g) {
      const auto g_bias = g + bias_first;
      const auto g_weight = g + weight_first;
      constexpr auto kernel = &check_finite_items_kernel<decltype(g_bias)>;
      const int block = fit_block<kernel>(ctx.launch.block);
      // At least one block: the flag is written every step.
      kernel<<<tile_grid(std::max<int64_t>(bias + weight, 1), ctx.launch), block, 0, ctx.stream>>>(
          g_bias, ctx.at<const HyperItem>(node.work.group_items[0]), bias, g_weight,
          ctx.at<const HyperItem>(node.work.group_items[1]), weight, ctx.at<const int32_t>(node.work.tensor_state),
          ctx.scalars.i32, ctx.check_scratch);
      RN_CUDA_CHECK_LAUNCH("check_finite_items_kernel");
    });
    return;
  }
  // G spans hold multiples of 64 elements, a sharded step's slice multiples of 4 (rule A).
  const uint64_t n4 = node.span(Family::kG).count / 4;
  // Launched even for an empty G (one block): the flag is written every step. The default grid
  // is what stays resident at once (2048 threads per multiprocessor), so that the blocks' atomic
  // tickets number about a thousand, not one per 4 KB of gradients.
  with_grad(ctx, node, [&](auto g) {
    constexpr auto kernel = &check_finite_kernel<decltype(g)>;
    const int block = fit_block<kernel>(ctx.launch.block);
    unsigned grid = grid_for((n4 + kCheckUnroll - 1) / kCheckUnroll, block, ctx.launch);
    if (ctx.launch.grid == 0) grid = std::min<unsigned>(grid, ctx.launch.sm_count * (2048 / block));
    kernel<<<grid, block, 0, ctx.stream>>>(g, n4, ctx.scalars.i32, ctx.check_scratch);
    RN_CUDA_CHECK_LAUNCH("check_finite_kernel");
  });
}

}  // namespace cuda
}  // namespace renaissance
