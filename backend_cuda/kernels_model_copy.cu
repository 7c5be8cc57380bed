// The bf16/fp16 model copy on CUDA (issue 14): after a group's update, each new master is
// rounded into C_MODEL_COPY with math/precision.h, the code the CPU backend uses. The group is
// cut into pieces of at most kCopyPiece elements of one tensor, so every thread knows its
// element's index in its tensor (the stochastic-rounding key) without a search. Each thread
// rounds a quad: four consecutive elements whose tensor index starts at a multiple of 4, i.e.
// exactly one block of math::sr_random_block, so one Philox call serves four elements (the words
// sr_random_word would give each of them) and W / C move as 16-byte / 8-byte accesses where
// aligned. A separate kernel still re-reads W (4 B per element more than fusing it into the
// update; a fused version is a performance follow-up that must keep these bits).
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
// A piece starts at a multiple of kCopyPiece of its tensor (or at a sharded step's cut), so its
// quads, counted from the multiple of 4 at or below its start, are Philox blocks.
static_assert(kCopyPiece % 4 == 0, "pieces must start on a stochastic-rounding block");

template <Precision kPrecision, Rounding kRounding>
__device__ __forceinline__ uint16_t round_master(float x, uint32_t r) {
  if (kRounding == Rounding::kNearest) {
    return kPrecision == Precision::kBf16 ? math::f32_to_bf16_rne(x) : math::f32_to_f16_rne(x);
  }
  return kPrecision == Precision::kBf16 ? math::f32_to_bf16_sr(x, r) : math::f32_to_f16_sr(x, r);
}

template <Precision kPrecision, Rounding kRounding>
__global__ void model_copy_kernel(const float* __restrict__ w, uint16_t* __restrict__ c,
                                  const CopyPiece* __restrict__ pieces, int64_t count,
                                  const int32_t* __restrict__ flags, uint64_t seed,
                                  const int32_t* __restrict__ tensor_steps) {
  if (flags[kHasNonFinite] != 0) return;  // a skipped step writes no copy (nor a master)
  const uint32_t task_t = static_cast<uint32_t>(flags[kStep]);
  for (int64_t p = blockIdx.x; p < count; p += gridDim.x) {
    const CopyPiece piece = pieces[p];
    // tensor_mask: the tensor's own count (a masked tensor's copy is rewritten with its bits).
    const uint32_t t = tensor_steps != nullptr ? static_cast<uint32_t>(tensor_steps[piece.param]) : task_t;
    // A piece of a tensor a sharded step cut may start inside a quad (first_index not a
    // multiple of 4): the quads are then counted from the block boundary `lead` elements before
    // it, and the elements of the first quad before the piece are not written.
    const uint32_t lead = static_cast<uint32_t>(piece.first_index & 3u);
    for (uint32_t q = 4 * threadIdx.x; q < piece.length + lead; q += 4 * blockDim.x) {
      uint32_t r[4] = {0, 0, 0, 0};
      if (kRounding == Rounding::kStochastic) {
        const math::Philox4x32 block = math::sr_random_block(seed, t, piece.param, (piece.first_index - lead + q) >> 2);
        for (int j = 0; j < 4; ++j) r[j] = block.v[j];
      }
      if (lead == 0) {
        const uint64_t e = piece.begin + q;
        const bool aligned =
            ((reinterpret_cast<uintptr_t>(w + e) & 15u) | (reinterpret_cast<uintptr_t>(c + e) & 7u)) == 0;
        if (q + 4 <= piece.length && aligned) {
          const float4 x = *reinterpret_cast<const float4*>(w + e);
          ushort4 out;
          out.x = round_master<kPrecision, kRounding>(x.x, r[0]);
          out.y = round_master<kPrecision, kRounding>(x.y, r[1]);
          out.z = round_master<kPrecision, kRounding>(x.z, r[2]);
          out.w = round_master<kPrecision, kRounding>(x.w, r[3]);
          *reinterpret_cast<ushort4*>(c + e) = out;
          continue;
        }
      }
      // Element j of the quad is element q + j - lead of the piece.
      for (uint32_t j = q < lead ? lead - q : 0; j < 4 && q + j < piece.length + lead; ++j) {
        const uint64_t e = piece.begin + (q + j - lead);
        c[e] = round_master<kPrecision, kRounding>(w[e], r[j]);
      }
    }
  }
}

template <Precision kPrecision, Rounding kRounding>
void launch(const CudaContext& ctx, const GraphNode& node, const CopyPiece* pieces, int64_t count) {
  constexpr auto kernel = &model_copy_kernel<kPrecision, kRounding>;
  const int block = fit_block<kernel>(ctx.launch.block);
  kernel<<<tile_grid(count, ctx.launch), block, 0, ctx.stream>>>(ctx.at<const float>(node.w), ctx.at<uint16_t>(node.copy.c),
                                                                  pieces, count, ctx.scalars.i32, node.copy.seed,
                                                                  node.tensor_state.count ? ctx.at<const int32_t>(node.tensor_state) + node.tensor_state.count / 2 : nullptr);
  RN_CUDA_CHECK_LAUNCH("model copy kernel");
}

}  // namespace

std::vector<CopyPiece> model_copy_pieces(const ModelCopy& copy) {
  std::vector<CopyPiece> pieces;
  for (const CopyTensor& t : copy.tensors) {
    // Pieces end on multiples of kCopyPiece of the tensor index; a cut tensor's first piece
    // starts where the cut is (t.first) and may be shorter.
    const uint64_t end = t.first + t.numel;
    for (uint64_t first = t.first; first < end; first = (first / kCopyPiece + 1) * kCopyPiece) {
      CopyPiece piece;
      piece.begin = t.begin + (first - t.first);
      piece.first_index = first;
      piece.length = static_cast<uint32_t>(std::min((first / kCopyPiece + 1) * kCopyPiece, end) - first);
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
