// The precision of the model weights a task keeps besides its fp32 masters: fp32
// (no model copy, the default), or a bf16 / fp16 model copy written by every update from the new
// master, rounded to nearest even or stochastically (docs/math.md, "Mixed precision").
#pragma once

#include <cstdint>
#include <string>

namespace renaissance {

enum class Precision : int { kFp32 = 0, kBf16 = 1, kFp16 = 2 };
enum class Rounding : int { kNearest = 0, kStochastic = 1 };

struct PrecisionOptions {
  Precision precision = Precision::kFp32;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;  // the stochastic-rounding key's seed (unused with kNearest)
  // bf16/fp16 only: the gradients G are held in the model dtype (2-byte encodings in W's layout,
  // as the backward pass of a bf16/fp16 model writes them) instead of fp32. Every op widens them
  // exactly to fp32 before it computes, so the bits equal an fp32-gradient task fed the widened
  // values; the step reads 2 B/param of G instead of 4 (docs/math.md, "Mixed precision").
  bool model_dtype_gradients = false;
};

// The encoding of G that these options give (graph.h's GraphNode::grad_dtype on every node that
// reads G): the model dtype with model_dtype_gradients, else fp32.
constexpr Precision gradient_precision(const PrecisionOptions& p) {
  return p.model_dtype_gradients ? p.precision : Precision::kFp32;
}

// The rule of which (G encoding, model-copy format, rounding) combinations exist, stated once:
// copy kFp32 is no model copy, which rounds nothing (nearest) and has fp32 gradients; a bf16 or
// fp16 copy, rounded either way, has fp32 gradients or gradients in its own format. Task::compile
// and the step compiler refuse any other, and the CUDA backend instantiates its update kernels for
// exactly these (backend_cuda/access.cuh checks its table against this function).
constexpr bool precision_combination_valid(Precision grad, Precision copy, Rounding rounding) {
  if (copy == Precision::kFp32) return grad == Precision::kFp32 && rounding == Rounding::kNearest;
  return grad == Precision::kFp32 || grad == copy;
}

// Bytes of one element in this encoding (a G or model-copy element): 4 for fp32, 2 for bf16/fp16.
constexpr uint32_t precision_bytes(Precision p) { return p == Precision::kFp32 ? 4u : 2u; }

inline const char* precision_name(Precision p) {
  return p == Precision::kBf16 ? "bf16" : p == Precision::kFp16 ? "fp16" : "fp32";
}
inline bool parse_precision(const std::string& text, Precision* out) {
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    if (text == precision_name(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}
inline const char* rounding_name(Rounding r) { return r == Rounding::kStochastic ? "stochastic" : "nearest"; }

}  // namespace renaissance
