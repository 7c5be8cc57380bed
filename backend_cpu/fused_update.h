// The fused update-and-copy path of the CPU element-wise updates, for speed: with a
// bf16/fp16 model copy or model-dtype gradients, each element is loaded once into registers
// (G's 2-byte encoding widened in-register), updated by the kind's rule, and stored as master
// and copy in the same vector loop (fused_update-inl.h), instead of three passes (widen G into a
// buffer, update, round the copy). The same IEEE operations on the same values, so the same bits
// as the unfused path (cpu_ops.h's run_elementwise chooses between them; CpuTuning::fuse
// off keeps the unfused one). This header is what the drivers and tests see; the loop is per target.
#pragma once

#include <cstdint>

#include "renaissance/precision.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace cpu {

// One run of elements [0, n) of a group span that lies inside one tensor (c non-null: the copy
// is written) or between tensors (c null: padding, whose copy is never written). Pointers are at
// the run's first element; g holds n encodings of the node's grad dtype. With a copy, element k
// has index first + k in tensor `param`, which keys stochastic rounding at step t under seed.
struct FusedPiece {
  float* w = nullptr;
  const void* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  uint16_t* c = nullptr;
  uint64_t n = 0;
  uint64_t first = 0, seed = 0, t = 0;
  uint32_t param = 0;
  // Software prefetch distance in elements (CpuTuning::prefetch_elements; 0: none): the loop asks
  // for the lines of every array this far ahead of the element it updates, one request per line.
  uint64_t ahead = 0;
};

// Which instantiation of the fused loop a piece takes: (G's encoding, copy format, rounding).
// Only the combinations a task can make are compiled: G fp32 with any copy, or G in the copy's
// own format (model_dtype_gradients); each also without a copy, for the padding between tensors.
enum class FusedMode : int {
  kG32,             // G fp32, no copy (padding of a task with an fp32 G)
  kG32Bf16Rne,
  kG32Bf16Sr,
  kG32Fp16Rne,
  kG32Fp16Sr,
  kGBf16,           // G bf16, no copy
  kGBf16Bf16Rne,
  kGBf16Bf16Sr,
  kGFp16,           // G fp16, no copy
  kGFp16Fp16Rne,
  kGFp16Fp16Sr,
  kNone,            // no fused instantiation: the caller takes the unfused path
};

// The mode of a piece with G in `grad`, and a copy in `copy` rounded as `rounding` (copy kFp32:
// no copy).
inline FusedMode fused_mode(Precision grad, Precision copy, Rounding rounding) {
  const bool sr = rounding == Rounding::kStochastic;
  switch (grad) {
    case Precision::kFp32:
      if (copy == Precision::kFp32) return FusedMode::kG32;
      if (copy != Precision::kBf16 && copy != Precision::kFp16) return FusedMode::kNone;
      if (copy == Precision::kBf16) return sr ? FusedMode::kG32Bf16Sr : FusedMode::kG32Bf16Rne;
      return sr ? FusedMode::kG32Fp16Sr : FusedMode::kG32Fp16Rne;
    case Precision::kBf16:
      if (copy == Precision::kFp32) return FusedMode::kGBf16;
      if (copy == Precision::kBf16) return sr ? FusedMode::kGBf16Bf16Sr : FusedMode::kGBf16Bf16Rne;
      return FusedMode::kNone;
    case Precision::kFp16:
      if (copy == Precision::kFp32) return FusedMode::kGFp16;
      if (copy == Precision::kFp16) return sr ? FusedMode::kGFp16Fp16Sr : FusedMode::kGFp16Fp16Rne;
      return FusedMode::kNone;
    default:
      break;  // no fused loop for another encoding: the unfused path (widen_grad, the rule, round_model_copy)
  }
  return FusedMode::kNone;
}

// A kind's fused loop over one piece: the float scalars s, the node's coefficient set and L2
// mode, as ElementwiseFn (cpu_ops.h). Exported per target by the kinds' op files.
using FusedFn = void (*)(const FusedPiece& piece, FusedMode mode, const float* s, CoeffSet set, bool l2);

}  // namespace cpu
}  // namespace renaissance
