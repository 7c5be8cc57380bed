// safetensors reader and writer. Layout of a file: an 8-byte little-endian header length N, N
// bytes of JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}),
// then the data section; offsets are relative to the data section. Every number read from the
// file is checked before it is used for a seek, a size or an allocation.
#include "renaissance/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "core/src/io/atomic_file.h"
#include "core/src/io/file_checks.h"
#include "renaissance/error.h"
#include "renaissance/math/precision.h"
#include "renaissance/name_table.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it verbatim and needs a little-endian host"
#endif

namespace renaissance {

namespace {

struct DtypeEntry {
  StDtype dtype;
  const char* name;
  size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {StDtype::kBool, "BOOL", 1}, {StDtype::kU8, "U8", 1},     {StDtype::kI8, "I8", 1},
    {StDtype::kF8E4M3, "F8_E4M3", 1}, {StDtype::kF8E5M2, "F8_E5M2", 1}, {StDtype::kI16, "I16", 2},
    {StDtype::kU16, "U16", 2},   {StDtype::kF16, "F16", 2},   {StDtype::kBF16, "BF16", 2},
    {StDtype::kI32, "I32", 4},   {StDtype::kU32, "U32", 4},   {StDtype::kF32, "F32", 4},
    {StDtype::kF64, "F64", 8},   {StDtype::kI64, "I64", 8},   {StDtype::kU64, "U64", 8},
};

// Every precision.h row names a dtype of the format whose size is the row's bytes: a typo'd or
// mis-sized row is a compile error (read_encodings and the writer size encodings by the row).
constexpr bool same_text(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) {
    ++a;
    ++b;
  }
  return *a == *b;
}
constexpr bool precision_rows_match_dtypes() {
  for (const PrecisionRow& row : kPrecisionRows) {
    bool found = false;
    for (const DtypeEntry& e : kDtypes) found = found || (same_text(e.name, row.safetensors) && e.size == row.bytes);
    if (!found) return false;
  }
  return true;
}
static_assert(precision_rows_match_dtypes(), "kPrecisionRows: a row's safetensors dtype is unknown or not `bytes` wide");

bool parse_dtype(const std::string& text, StDtype* out) {
  return parse_by_name(kDtypes, &DtypeEntry::dtype, text, out);
}

std::string sq(const std::string& s) { return "'" + s + "'"; }

// Closes a descriptor on every path out of a function.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly `bytes` at `offset`; false on a short read or an error (errno set).
bool pread_all(int fd, void* dst, uint64_t bytes, uint64_t offset) {
  char* p = static_cast<char*>(dst);
  while (bytes > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(bytes, 1u << 30));
    const ssize_t got = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (got == 0) {
      errno = 0;
      return false;
    }
    p += got;
    bytes -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

std::string errno_text() { return errno != 0 ? std::strerror(errno) : "unexpected end of file"; }

// A JSON number that is a non-negative integer (1.0 and -1 are not).
bool json_u64(const nlohmann::json& j, uint64_t* out) {
  if (!j.is_number_unsigned()) return false;
  *out = j.get<uint64_t>();
  return true;
}

}  // namespace

const char* st_dtype_name(StDtype dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

StDtype st_dtype_of(Precision p) {
  StDtype dtype = StDtype::kF32;
  if (!parse_dtype(precision_row(p).safetensors, &dtype)) throw_invalid(std::string("no safetensors dtype ") + precision_row(p).safetensors);
  return dtype;
}

size_t st_dtype_size(StDtype dtype) {
  for (const DtypeEntry& e : kDtypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

uint64_t StTensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path, const std::string& display_name)
    : path_(path), display_(display_name.empty() ? path : display_name) {
  const std::string& file = display_;
  Fd f;
  uint64_t file_size = 0;
  f.fd = io::open_regular_file(path, "safetensors file", &file_size);
  if (file_size < 8) {
    throw_format(file + ": truncated: " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  }
  unsigned char len_bytes[8];
  if (!pread_all(f.fd, len_bytes, 8, 0)) throw_io(file + ": cannot read the header length: " + errno_text());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxSafetensorsHeaderBytes) {
    throw_format(file + ": header length " + std::to_string(header_len) + " exceeds the maximum of " +
                 std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (header_len > file_size - 8) {
    throw_format(file + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                 std::to_string(file_size) + " bytes)");
  }
  if (header_len < 2) throw_format(file + ": header length " + std::to_string(header_len) + " is too small for a JSON object");
  std::string header(static_cast<size_t>(header_len), '\0');
  if (!pread_all(f.fd, &header[0], header_len, 8)) throw_io(file + ": cannot read the header: " + errno_text());
  data_start_ = 8 + header_len;
  data_size_ = file_size - data_start_;

  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw_format(file + ": the header is not valid JSON");
  if (!j.is_object()) throw_format(file + ": the header is not a JSON object");

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw_format(file + ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw_format(file + ": __metadata__ key " + sq(m.key()) + " is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = file + ": tensor " + sq(name);
    if (name.empty()) throw_format(file + ": a tensor has an empty name");
    if (!v.is_object()) throw_format(where + ": entry is not an object");
    for (auto k = v.begin(); k != v.end(); ++k) {
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets") {
        throw_format(where + ": unknown key " + sq(k.key()));
      }
    }
    if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      throw_format(where + ": needs dtype, shape and data_offsets");
    }
    StTensorInfo t;
    t.name = name;
    if (!v["dtype"].is_string()) throw_format(where + ": dtype is not a string");
    const std::string dtype = v["dtype"].get<std::string>();
    if (!parse_dtype(dtype, &t.dtype)) throw_format(where + ": unknown dtype " + sq(dtype));
    const nlohmann::json& shape = v["shape"];
    if (!shape.is_array()) throw_format(where + ": shape is not an array");
    // numel * dtype size must fit in 64 bits; anything beyond the file size is rejected below.
    uint64_t bytes = st_dtype_size(t.dtype);
    bool overflow = false;
    for (const nlohmann::json& d : shape) {
      uint64_t extent = 0;
      if (!json_u64(d, &extent)) throw_format(where + ": shape " + shape.dump() + " has an entry that is not a non-negative integer");
      // Extents are int64 in StTensorInfo: refuse larger ones outright, even next to a zero
      // extent (which makes the size 0 and would let [0, 2^64-1] through as shape [0, -1]).
      if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw_format(where + ": shape " + shape.dump() + " has an extent beyond 2^63-1");
      }
      if (extent != 0 && bytes > std::numeric_limits<uint64_t>::max() / extent) overflow = true;
      bytes = overflow ? 0 : bytes * extent;
      t.shape.push_back(static_cast<int64_t>(extent));
    }
    // A zero extent makes the size 0 whatever overflowed before it.
    if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) {
      overflow = false;
      bytes = 0;
    }
    if (overflow) throw_format(where + ": shape " + shape.dump() + " overflows 64-bit sizes");
    const nlohmann::json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !json_u64(off[0], &t.begin) || !json_u64(off[1], &t.end)) {
      throw_format(where + ": data_offsets " + off.dump() + " is not a pair of non-negative integers");
    }
    if (t.begin > t.end) throw_format(where + ": data_offsets " + off.dump() + " has begin > end");
    if (t.end > data_size_) {
      throw_format(where + ": data_offsets " + off.dump() + " run past the end of the data section (" +
                   std::to_string(data_size_) + " bytes; file truncated?)");
    }
    if (t.end - t.begin != bytes) {
      throw_format(where + ": shape " + shape.dump() + " of " + dtype + " needs " + std::to_string(bytes) +
                   " bytes but data_offsets " + off.dump() + " hold " + std::to_string(t.end - t.begin));
    }
    tensors_.emplace(name, std::move(t));
  }

  // No two non-empty byte ranges may overlap.
  std::vector<const StTensorInfo*> by_offset;
  for (const auto& kv : tensors_) {
    if (kv.second.end > kv.second.begin) by_offset.push_back(&kv.second);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const StTensorInfo* a, const StTensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      throw_format(file + ": tensor " + sq(by_offset[i]->name) + " overlaps tensor " +
                   sq(by_offset[i - 1]->name) + " in the data section");
    }
  }
}

const StTensorInfo& SafetensorsReader::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw_format(display_ + ": missing tensor " + sq(name));
  return it->second;
}

std::vector<char> SafetensorsReader::read_bytes(const StTensorInfo& t) const {
  std::vector<char> bytes(static_cast<size_t>(t.end - t.begin));
  if (bytes.empty()) return bytes;
  Fd f;
  f.fd = io::open_regular_file(path_, "safetensors file", nullptr);
  // The file may have shrunk since the header was validated.
  if (!pread_all(f.fd, bytes.data(), bytes.size(), data_start_ + t.begin)) {
    throw_io(display_ + ": tensor " + sq(t.name) + ": cannot read its data: " + errno_text());
  }
  return bytes;
}

namespace {

// The F32 or F64 data `bytes` of a tensor as n elements of type To: copied when the file holds To,
// converted element by element when it holds the other one; false for any other dtype.
template <typename To>
bool float_data(StDtype dtype, const std::vector<char>& bytes, size_t n, std::vector<To>* out) {
  static_assert(std::is_same<To, float>::value || std::is_same<To, double>::value, "F32 or F64 data only");
  constexpr bool to_f32 = std::is_same<To, float>::value;
  using Other = std::conditional_t<to_f32, double, float>;
  out->resize(n);
  if (dtype == (to_f32 ? StDtype::kF32 : StDtype::kF64)) {
    if (!out->empty()) std::memcpy(out->data(), bytes.data(), bytes.size());
  } else if (dtype == (to_f32 ? StDtype::kF64 : StDtype::kF32)) {
    for (size_t i = 0; i < n; ++i) {
      Other x;
      std::memcpy(&x, bytes.data() + i * sizeof(Other), sizeof(Other));
      (*out)[i] = static_cast<To>(x);
    }
  } else {
    return false;
  }
  return true;
}

}  // namespace

template <typename T>
std::vector<T> SafetensorsReader::read_floats(const std::string& name) const {
  const StTensorInfo& t = info(name);
  std::vector<char> bytes = read_bytes(t);
  std::vector<T> out;
  if (!float_data(t.dtype, bytes, static_cast<size_t>(t.numel()), &out)) {
    throw_format(display_ + ": tensor " + sq(name) + " has dtype " + st_dtype_name(t.dtype) + "; expected F32 or F64");
  }
  return out;
}

std::vector<float> SafetensorsReader::read_f32(const std::string& name) const { return read_floats<float>(name); }
std::vector<double> SafetensorsReader::read_f64(const std::string& name) const { return read_floats<double>(name); }

std::vector<int64_t> SafetensorsReader::read_i64(const std::string& name) const {
  const StTensorInfo& t = info(name);
  if (t.dtype != StDtype::kI64) {
    throw_format(display_ + ": tensor " + sq(name) + " has dtype " + st_dtype_name(t.dtype) + "; expected I64");
  }
  std::vector<char> bytes = read_bytes(t);
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<uint16_t> SafetensorsReader::read_encodings(const std::string& name, Precision p) const {
  if (p == Precision::kFp32) throw_invalid("read_encodings: fp32 is not an encoding (read_f32 reads F32)");
  const StTensorInfo& t = info(name);
  const StDtype want = st_dtype_of(p);
  if (t.dtype != want) {
    throw_format(display_ + ": tensor " + sq(name) + " has dtype " + st_dtype_name(t.dtype) + "; expected " +
                 st_dtype_name(want));
  }
  // The header's extent was checked against numel * st_dtype_size, the row's bytes (static_assert'ed).
  const std::vector<char> bytes = read_bytes(t);
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = math::load_encoding(p, bytes.data(), i);
  return out;
}

namespace {
// The dtype of some precision.h row (F32, BF16, F16, ...): the writer takes its packed encodings.
bool is_encoding_dtype(StDtype dtype) {
  for (const PrecisionRow& row : kPrecisionRows) {
    if (st_dtype_of(row.value) == dtype) return true;
  }
  return false;
}
}  // namespace

void write_safetensors(const std::string& path, const std::vector<StTensorView>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Validate and lay out first, so that nothing touches the disk for a bad request.
  std::vector<const StTensorView*> sorted;
  for (const StTensorView& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const StTensorView* a, const StTensorView* b) { return a->name < b->name; });
  nlohmann::json header = nlohmann::json::object();
  std::vector<uint64_t> sizes;
  uint64_t offset = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const StTensorView& t = *sorted[i];
    if (t.name.empty() || t.name == "__metadata__") throw_invalid(path + ": invalid tensor name " + sq(t.name));
    if (i > 0 && sorted[i - 1]->name == t.name) throw_invalid(path + ": tensor " + sq(t.name) + " is given twice");
    if (t.dtype != StDtype::kF32 && t.dtype != StDtype::kF64 && t.dtype != StDtype::kI64 && !is_encoding_dtype(t.dtype)) {
      throw_invalid(path + ": tensor " + sq(t.name) + ": cannot write dtype " + st_dtype_name(t.dtype));
    }
    uint64_t bytes = st_dtype_size(t.dtype);
    for (int64_t d : t.shape) {
      if (d < 0) throw_invalid(path + ": tensor " + sq(t.name) + " has a negative extent");
      bytes *= static_cast<uint64_t>(d);
    }
    if (bytes > 0 && t.data == nullptr) throw_invalid(path + ": tensor " + sq(t.name) + " has no data");
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    sizes.push_back(bytes);
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned (readers may map it directly).
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(len >> (8 * i));

  // A failed write never leaves a partial file under the final name (atomic_file.h).
  AtomicFile file(path, "safetensors file");
  file.append(len_bytes, 8);
  file.append(text.data(), text.size());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sizes[i] > 0) file.append(sorted[i]->data, sizes[i]);
  }
  file.commit();
}

}  // namespace renaissance
