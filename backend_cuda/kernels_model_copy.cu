// The bf16/fp16 model copy on CUDA (issue 14): after a group's update, each new master is
// rounded into C_MODEL_COPY with math/precision.h, the code the CPU backend uses. The group is
// cut into pieces of at most kCopyPiece elements of one tensor, so every thread knows its
// element's index in its tensor (the stochastic-rounding key) without a search. A separate
// kernel re-reads W (4 B per element more than fusing it into the update; a fused version is a
// performance follow-up that must keep these bits).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "renaissance/math/precision.h"

namespace renaissance {
namespace cuda {
namespace {

constexpr uint64_t kCopyPiece = 4096;

template <Precision kPrecision, Rounding kRounding>
__device__ __forceinline__ uint16_t round_master(float x, uint64_t seed, uint32_t t, uint32_t param, uint64_t idx) {
  if (kRounding == Rounding::kNearest) {
    return kPrecision == Precision::kBf16 ? math::f32_to_bf16_rne(x) : math::f32_to_f16_rne(x);
  }
  const uint32_t r = math::sr_random_word(seed, t, param, idx);
  return kPrecision == Precision::kBf16 ? math::f32_to_bf16_sr(x, r) : math::f32_to_f16_sr(x, r);
}

template <Precision kPrecision, Rounding kRounding>
__global__ void model_copy_kernel(const float* __restrict__ w, uint16_t* __restrict__ c,
                                  const CopyPiece* __restrict__ pieces, int64_t count,
                                  const int32_t* __restrict__ flags, uint64_t seed) {
  if (flags[kHasNonFinite] != 0) return;  // a skipped step writes no copy (nor a master)
  const uint32_t t = static_cast<uint32_t>(flags[kStep]);
  for (int64_t p = blockIdx.x; p < count; p += gridDim.x) {
    const CopyPiece piece = pieces[p];
    for (uint32_t i = threadIdx.x; i < piece.length; i += blockDim.x) {
      const uint64_t e = piece.begin + i;
      c[e] = round_master<kPrecision, kRounding>(w[e], seed, t, piece.param, piece.first_index + i);
    }
  }
}

template <Precision kPrecision, Rounding kRounding>
void launch(const CudaContext& ctx, const GraphNode& node, const CopyPiece* pieces, int64_t count) {
  constexpr auto kernel = &model_copy_kernel<kPrecision, kRounding>;
  const int block = fit_block<kernel>(ctx.launch.block);
  kernel<<<tile_grid(count, ctx.launch), block, 0, ctx.stream>>>(ctx.at<const float>(node.w), ctx.at<uint16_t>(node.copy.c),
                                                                  pieces, count, ctx.scalars.i32, node.copy.seed);
  RN_CUDA_CHECK_LAUNCH("model copy kernel");
}

}  // namespace

std::vector<CopyPiece> model_copy_pieces(const ModelCopy& copy) {
  std::vector<CopyPiece> pieces;
  for (const CopyTensor& t : copy.tensors) {
    for (uint64_t first = 0; first < t.numel; first += kCopyPiece) {
      CopyPiece piece;
      piece.begin = t.begin + first;
      piece.first_index = first;
      piece.length = static_cast<uint32_t>(std::min(kCopyPiece, t.numel - first));
      piece.param = t.param;
      pieces.push_back(piece);
    }
  }
  return pieces;
}

void launch_model_copy(const CudaContext& ctx, const GraphNode& node, const CopyPiece* pieces, int64_t count) {
  if (count == 0) return;
  const bool bf16 = node.copy.precision == Precision::kBf16;
  if (node.copy.rounding == Rounding::kNearest) {
    if (bf16) launch<Precision::kBf16, Rounding::kNearest>(ctx, node, pieces, count);
    else launch<Precision::kFp16, Rounding::kNearest>(ctx, node, pieces, count);
  } else {
    if (bf16) launch<Precision::kBf16, Rounding::kStochastic>(ctx, node, pieces, count);
    else launch<Precision::kFp16, Rounding::kStochastic>(ctx, node, pieces, count);
  }
}

}  // namespace cuda
}  // namespace renaissance
