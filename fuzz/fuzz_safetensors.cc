// libFuzzer target: the safetensors reader (core/src/io/safetensors.cc) on arbitrary file bytes.
// Opening validates the header; every tensor is then read in each conversion the callers use
// (read_f32, read_f64, read_i64). Contract under test: a malformed file is an Error, never a
// crash, a sanitizer report, another exception type or an allocation beyond the file's size.
#include <cstdint>
#include <cstring>

#include "fuzz/fuzz_util.h"
#include "renaissance/error.h"
#include "renaissance/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static renaissance_fuzz::MemFile file;
  file.set(data, size);
  try {
    const renaissance::SafetensorsReader reader(file.path(), "fuzz.safetensors");
    for (const auto& kv : reader.tensors()) {
      const renaissance::StTensorInfo& t = kv.second;
      // Validation promises data_offsets inside the file and matching numel * dtype size.
      if (t.end < t.begin || t.end - t.begin != t.numel() * renaissance::st_dtype_size(t.dtype)) {
        renaissance_fuzz::property_failed("a tensor's byte range disagrees with its shape and dtype");
      }
      // StTensorInfo::shape is int64: an accepted extent must fit it (callers compare it with
      // ParamSpec shapes and multiply it out as int64).
      for (int64_t extent : t.shape) {
        if (extent < 0) renaissance_fuzz::property_failed("an accepted tensor has a negative extent");
      }
      for (int conversion = 0; conversion < 3; ++conversion) {
        try {
          if (conversion == 0) (void)reader.read_f32(kv.first);
          if (conversion == 1) (void)reader.read_f64(kv.first);
          if (conversion == 2) (void)reader.read_i64(kv.first);
        } catch (const renaissance::Error&) {
          // A dtype the conversion does not take: an Error is the documented answer.
        }
      }
    }
    (void)reader.metadata();
  } catch (const renaissance::Error&) {
    // Refused with an Error: the documented outcome for a malformed file.
  }
  return 0;
}
