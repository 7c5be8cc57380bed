// The framing of a checkpoint file (docs/checkpoint-format.md), shared by Task::save, Task::load
// and read_checkpoint_info (runtime/src/checkpoint.cc): the header constants, the section tags,
// bounds-checked payload encoding and decoding, the streamed section writer (XXH3 over frame and
// payload), the positional file reader and the section parser. Kept apart from checkpoint.cc so
// that neither file grows past the size limit; checkpoint.cc and checkpoint_codec.cc include it
// (after xxhash.h with XXH_INLINE_ALL).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/src/io/atomic_file.h"
#include "core/src/io/file_checks.h"
#include "renaissance/error.h"
#include "renaissance/region.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the checkpoint writer stores host floats and integers as they are: little-endian hosts only"
#endif

namespace renaissance {
namespace checkpoint_format {

constexpr char kMagic[8] = {'\x89', 'R', 'N', 'C', 'K', 'P', 'T', '\n'};
// Version 2: the fp32 layout. Version 3: version 2 plus PREC and FAMC, written only by a task
// with a bf16/fp16 model copy, so that fp32 checkpoints stay byte-identical to version 2 and a
// build that predates the model copy refuses a file with one by its version.
constexpr uint32_t kFormatVersion = 2;
constexpr uint32_t kFormatVersionModelCopy = 3;
constexpr size_t kHeaderBytes = 24;
constexpr size_t kFrameBytes = 4 + 8;  // tag + length, before the payload
constexpr size_t kChecksumBytes = 8;
constexpr uint64_t kStreamChunkBytes = uint64_t{4} << 20;

// The sections of a file: five of their own, then one per family (Section(kFirstFamily + f) for
// Family f), whose tag and name come from kFamilyTable (region.h): FAMW, FAMM, FAMV, FAMX (VMAX),
// FAMN. A family without a checkpoint_tag (G) has no section in any file.
enum class Section : int { kMeta, kLayout, kScalars, kPrecision, kC, kFirstFamily };
constexpr int kNumSections = static_cast<int>(Section::kFirstFamily) + kNumFamilies;

constexpr Section family_section(Family f) {
  return static_cast<Section>(static_cast<int>(Section::kFirstFamily) + static_cast<int>(f));
}
constexpr bool is_family_section(Section s) { return s >= Section::kFirstFamily; }
constexpr Family section_family_of(Section s) {
  return static_cast<Family>(static_cast<int>(s) - static_cast<int>(Section::kFirstFamily));
}

// File tag and the name errors use ("section M: checksum mismatch") of the sections before the
// families, in Section order.
constexpr const char* kSectionText[][2] = {
    {"META", "META"}, {"LAYT", "LAYOUT"}, {"SCAL", "SCALARS"}, {"PREC", "PRECISION"}, {"FAMC", "C"}};
static_assert(sizeof(kSectionText) / sizeof(kSectionText[0]) == static_cast<int>(Section::kFirstFamily),
              "kSectionText names every section before the families");
inline const char* section_tag(Section s) {
  return is_family_section(s) ? family_info(section_family_of(s)).checkpoint_tag : kSectionText[static_cast<int>(s)][0];
}
inline const char* section_name(Section s) {
  return is_family_section(s) ? family_info(section_family_of(s)).name : kSectionText[static_cast<int>(s)][1];
}

// ---- encoding ----
class Bytes {
 public:
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    data_.insert(data_.end(), b, b + n);
  }
  void u32(uint32_t v) { raw(&v, sizeof(v)); }
  void u64(uint64_t v) { raw(&v, sizeof(v)); }
  void i64(int64_t v) { raw(&v, sizeof(v)); }
  void f64(double v) { raw(&v, sizeof(v)); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  const std::vector<uint8_t>& data() const { return data_; }

 private:
  std::vector<uint8_t> data_;
};

// ---- decoding: every read is bounds-checked and names the section ----
class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t n, std::string where) : p_(p), n_(n), where_(std::move(where)) {}
  void raw(void* dst, uint64_t n) {
    if (n > n_ - pos_) fail("malformed payload (a field runs past the section's end)");
    std::memcpy(dst, p_ + pos_, n);
    pos_ += n;
  }
  uint32_t u32() { uint32_t v; raw(&v, sizeof(v)); return v; }
  uint64_t u64() { uint64_t v; raw(&v, sizeof(v)); return v; }
  int64_t i64() { int64_t v; raw(&v, sizeof(v)); return v; }
  double f64() { double v; raw(&v, sizeof(v)); return v; }
  std::string str() {
    const uint32_t len = u32();
    if (len > n_ - pos_) fail("malformed payload (a string runs past the section's end)");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return s;
  }
  uint64_t remaining() const { return n_ - pos_; }
  void expect_end() {
    if (pos_ != n_) fail("malformed payload (" + std::to_string(n_ - pos_) + " unexpected bytes at its end)");
  }
  [[noreturn]] void fail(const std::string& what) const { throw_format(where_ + what); }

 private:
  const uint8_t* p_;
  uint64_t n_;
  uint64_t pos_ = 0;
  std::string where_;
};

inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

inline std::string errno_text(int err) { return std::strerror(err); }

// Streams one section: frame, payload pieces, checksum over all of them.
class SectionWriter {
 public:
  SectionWriter(AtomicFile& file, Section s, uint64_t length) : file_(file), length_(length) {
    XXH3_64bits_reset(&state_);
    put(section_tag(s), 4);
    put(&length, sizeof(length));
    written_ = 0;
  }
  void payload(const void* p, size_t n) {
    put(p, n);
    written_ += n;
  }
  void finish() {
    if (written_ != length_) {
      throw Error(ErrorKind::kBackend, "checkpoint writer: section length mismatch (internal error)");
    }
    const uint64_t digest = XXH3_64bits_digest(&state_);
    file_.append(&digest, sizeof(digest));
  }

 private:
  void put(const void* p, size_t n) {
    XXH3_64bits_update(&state_, p, n);
    file_.append(p, n);
  }
  AtomicFile& file_;
  XXH3_state_t state_;
  uint64_t length_;
  uint64_t written_ = 0;
};

inline void write_bytes_section(AtomicFile& file, Section s, const Bytes& b) {
  SectionWriter w(file, s, b.data().size());
  w.payload(b.data().data(), b.data().size());
  w.finish();
}

// ---- reading ----
// The checkpoint file, read by position and never held whole in memory: a resume validates it
// in a first pass and streams the state sections into the arena in a second (so the peak
// memory of a resume stays near that of a plain run).
class FileReader {
 public:
  FileReader(const std::string& path, uint64_t max_bytes) : path_(path) {
    fd_ = io::open_regular_file(path, "checkpoint", &size_);
    if (size_ > max_bytes) {
      ::close(fd_);
      throw_format("checkpoint " + path + ": the file has " + std::to_string(size_) +
                   " bytes, more than any checkpoint of this task can have (" + std::to_string(max_bytes) +
                   "): it is not a checkpoint of this task");
    }
  }
  ~FileReader() { ::close(fd_); }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  uint64_t size() const { return size_; }
  // Exactly n bytes at offset (within size(), which the parser checks first).
  void read(uint64_t offset, void* dst, uint64_t n) const {
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, static_cast<size_t>(std::min<uint64_t>(n, 1u << 30)), static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_io("cannot read checkpoint " + path_ + ": " + errno_text(errno));
      if (r == 0) throw_format("checkpoint " + path_ + ": the file shrank while it was being read");
      p += r;
      n -= static_cast<uint64_t>(r);
      offset += static_cast<uint64_t>(r);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};


struct SectionView {
  const uint8_t* payload;  // null for a streamed section (only its offset is known)
  uint64_t length;
  uint64_t offset;        // of the payload in the file
  uint64_t payload_hash;  // XXH3 of the payload alone (streamed sections)
};

class Parser {
 public:
  Parser(const std::string& path, const FileReader& file) : path_(path), file_(file) {}

  [[noreturn]] void fail(const char* section, const std::string& what) const {
    throw_format("checkpoint " + path_ + ": section " + section + ": " + what);
  }
  std::string where(Section s) const { return "checkpoint " + path_ + ": section " + section_name(s) + ": "; }

  // Returns the declared section count; *version_out gets the format version (2 or 3).
  uint32_t header(uint32_t* version_out) {
    uint8_t h[kHeaderBytes];
    const uint64_t size = file_.size();
    file_.read(0, h, std::min<uint64_t>(size, kHeaderBytes));
    if (size < kHeaderBytes) {
      if (size >= sizeof(kMagic) && std::memcmp(h, kMagic, sizeof(kMagic)) != 0) {
        fail("header", "bad magic: not a Renaissance checkpoint");
      }
      fail("header", "truncated (" + std::to_string(size) + " of " + std::to_string(kHeaderBytes) + " bytes)");
    }
    if (std::memcmp(h, kMagic, sizeof(kMagic)) != 0) fail("header", "bad magic: not a Renaissance checkpoint");
    uint64_t stored;
    std::memcpy(&stored, h + 16, sizeof(stored));
    if (XXH3_64bits(h, 16) != stored) fail("header", "checksum mismatch");
    uint32_t version, count;
    std::memcpy(&version, h + 8, sizeof(version));
    std::memcpy(&count, h + 12, sizeof(count));
    if (version != kFormatVersion && version != kFormatVersionModelCopy) {
      fail("header", "unsupported format version " + std::to_string(version) + " (this build reads version " +
                         std::to_string(kFormatVersion) + "), or " + std::to_string(kFormatVersionModelCopy) +
                         " with a bf16/fp16 model copy");
    }
    *version_out = version;
    pos_ = kHeaderBytes;
    return count;
  }

  // Validates the next section (frame, length, checksum) by streaming it. With keep_limit > 0 the
  // payload is kept (valid until the next call) and may be at most that long; 0 streams it.
  SectionView section(Section s, uint64_t keep_limit) {
    const char* name = section_name(s);
    const uint64_t left = file_.size() - pos_;
    if (left == 0) fail(name, "missing: the file ends before it (truncated)");
    if (left < kFrameBytes) fail(name, "truncated (the file ends inside the section's frame)");
    uint8_t frame[kFrameBytes];
    file_.read(pos_, frame, kFrameBytes);
    if (std::memcmp(frame, section_tag(s), 4) != 0) {
      char seen[5] = {};  // printable copy of the 4 tag bytes; seen[4] stays the terminator
      for (int i = 0; i < 4; ++i) seen[i] = (frame[i] >= 32 && frame[i] < 127) ? static_cast<char>(frame[i]) : '?';
      fail(name, std::string("bad tag '") + seen + "' where '" + section_tag(s) + "' belongs (corrupt file)");
    }
    uint64_t length;
    std::memcpy(&length, frame + 4, sizeof(length));
    if (length > left - kFrameBytes || kChecksumBytes > left - kFrameBytes - length) {
      fail(name, "truncated or corrupt: the section declares " + std::to_string(length) +
                     " payload bytes but the file has " + std::to_string(left - kFrameBytes) +
                     " bytes left after its frame");
    }
    if (keep_limit > 0 && length > keep_limit) {
      fail(name, "corrupt: the section declares " + std::to_string(length) + " payload bytes, more than it can hold (" +
                     std::to_string(keep_limit) + ")");
    }
    const uint64_t offset = pos_ + kFrameBytes;
    XXH3_state_t framed, alone;
    XXH3_64bits_reset(&framed);
    XXH3_64bits_reset(&alone);
    XXH3_64bits_update(&framed, frame, kFrameBytes);
    if (keep_limit > 0) {
      kept_.resize(static_cast<size_t>(length));
      if (length > 0) file_.read(offset, kept_.data(), length);
      XXH3_64bits_update(&framed, kept_.data(), kept_.size());
    } else {
      chunk_.resize(static_cast<size_t>(std::min<uint64_t>(length, kStreamChunkBytes)));
      for (uint64_t done = 0; done < length;) {
        const uint64_t n = std::min<uint64_t>(length - done, kStreamChunkBytes);
        file_.read(offset + done, chunk_.data(), n);
        XXH3_64bits_update(&framed, chunk_.data(), n);
        XXH3_64bits_update(&alone, chunk_.data(), n);
        done += n;
      }
    }
    uint64_t stored;
    file_.read(offset + length, &stored, sizeof(stored));
    if (XXH3_64bits_digest(&framed) != stored) fail(name, "checksum mismatch");
    pos_ += kFrameBytes + length + kChecksumBytes;
    return {keep_limit > 0 ? kept_.data() : nullptr, length, offset, XXH3_64bits_digest(&alone)};
  }

  void expect_end(Section last) const {
    if (pos_ != file_.size()) {
      throw_format("checkpoint " + path_ + ": " + std::to_string(file_.size() - pos_) +
                   " unexpected bytes after section " + section_name(last) + " (corrupt file)");
    }
  }

 private:
  const std::string& path_;
  const FileReader& file_;
  uint64_t pos_ = 0;
  std::vector<uint8_t> kept_, chunk_;
};


}  // namespace checkpoint_format
}  // namespace renaissance
