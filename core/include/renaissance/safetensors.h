// safetensors reader and writer (https://github.com/huggingface/safetensors): the format replay
// cases and `renaissance replay --out` use. The reader trusts nothing in the file: every length
// and offset is checked against the file size before it is used, so a truncated or hostile file
// is an Error naming the file and the tensor, never a crash or a huge allocation. Data is read
// lazily per tensor, so a large gradient file is validated up front but not held in memory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "renaissance/precision.h"

namespace renaissance {

// The dtypes of the format. The reader knows all of them (so it can validate any file), but
// converts only F32, F64 and I64, and reads the encodings of precision.h's table (each row's
// safetensors dtype, its bytes per element); the writer writes those.
enum class StDtype { kBool, kU8, kI8, kF8E4M3, kF8E5M2, kI16, kU16, kF16, kBF16, kI32, kU32, kF32, kF64, kI64, kU64 };
const char* st_dtype_name(StDtype dtype);
size_t st_dtype_size(StDtype dtype);
// The dtype of a tensor in encoding p (precision.h's table: a model copy, model-dtype gradients).
StDtype st_dtype_of(Precision p);

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets in the data section
  uint64_t end = 0;
  uint64_t numel() const;
};

// A largest header accepted; real headers are a few KB per thousand tensors.
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

class SafetensorsReader {
 public:
  // Reads and validates the header; throws Error(kIo) when the file cannot be opened and
  // Error(kFormat) for anything malformed. `display_name` is what messages call the file
  // (defaults to `path`).
  explicit SafetensorsReader(const std::string& path, const std::string& display_name = "");

  const std::string& path() const { return path_; }
  const std::string& display_name() const { return display_; }
  // Tensors sorted by name.
  const std::map<std::string, StTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws Error(kFormat) naming the file when there is no such tensor.
  const StTensorInfo& info(const std::string& name) const;

  // Reads a tensor, converting F32 or F64 to the requested float type (F64 -> F32 rounds).
  // Any other dtype is Error(kFormat) naming the file, the tensor and the dtype.
  std::vector<float> read_f32(const std::string& name) const;
  std::vector<double> read_f64(const std::string& name) const;
  std::vector<int64_t> read_i64(const std::string& name) const;
  // The encodings of a tensor in precision p's safetensors dtype (precision.h's table), as
  // stored, one per uint16_t (a 1-byte encoding in the low byte): replay's model-dtype tensors.
  // Any other dtype is Error(kFormat) naming the file, the tensor and both dtypes.
  std::vector<uint16_t> read_encodings(const std::string& name, Precision p) const;

 private:
  std::vector<char> read_bytes(const StTensorInfo& t) const;
  template <typename T>
  std::vector<T> read_floats(const std::string& name) const;  // read_f32, read_f64

  std::string path_;
  std::string display_;
  uint64_t data_start_ = 0;
  uint64_t data_size_ = 0;
  std::map<std::string, StTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write; `data` points to numel(shape) elements of `dtype` (F32, F64, I64, or the
// safetensors dtype of a precision.h row, its encodings packed at the row's bytes each).
struct StTensorView {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes a safetensors file atomically: a temporary file in the same folder, fsync, rename over
// `path`, fsync of the folder. On any failure the temporary is removed and nothing exists
// under `path` that was not there before. Throws Error(kIo) or Error(kInvalidArgument).
void write_safetensors(const std::string& path, const std::vector<StTensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace renaissance
