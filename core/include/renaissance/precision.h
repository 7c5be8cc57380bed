// The precision of the model weights a task keeps besides its fp32 masters: fp32
// (no model copy, the default), or a model copy in one of the table's encodings (bf16, fp16, ...)
// written by every update from the new master, rounded to nearest even or stochastically
// (docs/math.md, "Mixed precision").
#pragma once

#include <cstdint>
#include <string>

#include "renaissance/name_table.h"

namespace renaissance {

enum class Precision : int { kFp32 = 0, kBf16 = 1, kFp16 = 2 };
constexpr int kNumPrecisions = 3;  // the enumerators above; kPrecisionRows holds one row each
enum class Rounding : int { kNearest = 0, kStochastic = 1 };

struct PrecisionOptions {
  Precision precision = Precision::kFp32;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;  // the stochastic-rounding key's seed (unused with kNearest)
  // With a model copy only: the gradients G are held in the model dtype (its encodings in W's
  // layout, as the backward pass of such a model writes them) instead of fp32. Every op widens
  // them exactly to fp32 before it computes, so the bits equal an fp32-gradient task fed the
  // widened values; the step reads the encoding's bytes per param of G instead of 4 (docs/math.md,
  // "Mixed precision").
  bool model_dtype_gradients = false;
};

// The encoding of G that these options give (graph.h's GraphNode::grad.encoding on every node that
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

// The precision table: one row per Precision, in the enum's order (static_assert'ed below), read
// by every consumer outside the backends that names, sizes or decodes an encoding. A new encoding
// is one enumerator and one row here and its codec in math/precision.h (docs/adding-a-kind.md,
// "Adding a precision"); the backends reach it through that file's encoded_to_f32 family.
struct PrecisionRow {
  Precision value;
  const char* name;         // the CLI / case.json / Python name ("bf16")
  uint32_t bytes;           // bytes of one element (a G or model-copy element)
  const char* torch_dtype;  // torch's dtype name, as `torch.<name>`
  const char* safetensors;  // the safetensors dtype string of a tensor in this encoding
  // Whose exact widening and round-to-nearest definitions (math/precision.h) this encoding uses:
  // kFp32 is the identity (4-byte fp32), else the encoding itself (bf16, fp16, ...).
  Precision codec;
};

inline constexpr PrecisionRow kPrecisionRows[] = {
    {Precision::kFp32, "fp32", 4, "float32", "F32", Precision::kFp32},
    {Precision::kBf16, "bf16", 2, "bfloat16", "BF16", Precision::kBf16},
    {Precision::kFp16, "fp16", 2, "float16", "F16", Precision::kFp16},
};
// A forgotten row, or rows out of enum order, is a compile error.
static_assert(sizeof kPrecisionRows / sizeof kPrecisionRows[0] == kNumPrecisions,
              "kPrecisionRows needs one row per Precision");
static_assert(rows_in_enum_order(kPrecisionRows, &PrecisionRow::value),
              "kPrecisionRows: one row per Precision, in the enum's order");

// The row of p (p is an enumerator, hence a valid index: the static_assert above).
constexpr const PrecisionRow& precision_row(Precision p) { return kPrecisionRows[static_cast<int>(p)]; }

// Bytes of one element in this encoding (a G or model-copy element): 4 for fp32, 2 for bf16/fp16.
constexpr uint32_t precision_bytes(Precision p) { return precision_row(p).bytes; }
constexpr const char* precision_name(Precision p) { return precision_row(p).name; }
// True for a 2-byte encoding that math::half_to_f32 / f32_to_half_rne decode as bf16 (their
// `bf16` argument); false for an fp16-coded one. Meaningless for fp32 (no 2-byte codec).
constexpr bool precision_bf16_coded(Precision p) { return precision_row(p).codec == Precision::kBf16; }

// Sets *out to the precision named `text`; false, *out untouched, where no row has that name.
inline bool parse_precision(const std::string& text, Precision* out) {
  return parse_by_name(kPrecisionRows, &PrecisionRow::value, text, out);
}
// The table's names as a sentence's list ("fp32, bf16 or fp16"); with copy_formats_only, the
// model-copy formats only (every row but fp32: "bf16 or fp16").
inline std::string precision_names_text(bool copy_formats_only) {
  std::string text;
  const int first = copy_formats_only ? 1 : 0;
  for (int i = first; i < kNumPrecisions; ++i) {
    if (i > first) text += i + 1 == kNumPrecisions ? " or " : ", ";
    text += kPrecisionRows[i].name;
  }
  return text;
}
static_assert(static_cast<int>(Precision::kFp32) == 0, "precision_names_text: fp32 is row 0, the copy formats follow");

// Sets *out to the precision whose enum value is `code` (a checkpoint's field); false where none.
inline bool precision_from_code(uint32_t code, Precision* out) {
  if (code >= static_cast<uint32_t>(kNumPrecisions)) return false;
  *out = kPrecisionRows[code].value;
  return true;
}
inline const char* rounding_name(Rounding r) { return r == Rounding::kStochastic ? "stochastic" : "nearest"; }

}  // namespace renaissance
