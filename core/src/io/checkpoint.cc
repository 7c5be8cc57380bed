// Checkpoints: Task::save and Task::load.
//
// The format (version 2: header, then META, LAYOUT, W, M, V, N, SCALARS, each framed and
// checksummed) is specified in docs/checkpoint-format.md. Nothing in a file depends on the backend
// or the arena's padding. Version 1 files (META without the check-finite flag and the run
// settings) are refused naming both versions: a resume must not guess what it continues.
//
// Save writes a temporary file in the destination folder, fsyncs it, renames it over the final
// name and fsyncs the folder, so the final name only ever carries a complete checkpoint. Load
// validates every byte in a first pass over the file before it changes anything in the task, then
// streams the state sections into the arena in a second (the file is never held whole in memory).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/src/io/atomic_file.h"
#include "core/src/io/file_checks.h"
#include "renaissance/error.h"
#include "renaissance/layout.h"
#include "renaissance/scalars.h"
#include "renaissance/task.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the checkpoint writer stores host floats and integers as they are: little-endian hosts only"
#endif

namespace renaissance {

namespace {

constexpr char kMagic[8] = {'\x89', 'R', 'N', 'C', 'K', 'P', 'T', '\n'};
constexpr uint32_t kFormatVersion = 2;
constexpr size_t kHeaderBytes = 24;
constexpr size_t kFrameBytes = 4 + 8;  // tag + length, before the payload
constexpr size_t kChecksumBytes = 8;
constexpr uint64_t kMaxMetaBytes = 64 * 1024;  // kind, decay mode, numbers, schedule name
constexpr size_t kMaxScheduleName = 64;

enum class Section { kMeta, kLayout, kW, kM, kV, kN, kScalars };

// File tag and the name errors use ("section M: checksum mismatch"), in Section order.
constexpr const char* kSectionText[][2] = {{"META", "META"}, {"LAYT", "LAYOUT"}, {"FAMW", "W"},      {"FAMM", "M"},
                                           {"FAMV", "V"},    {"FAMN", "N"},      {"SCAL", "SCALARS"}};
const char* section_tag(Section s) { return kSectionText[static_cast<int>(s)][0]; }
const char* section_name(Section s) { return kSectionText[static_cast<int>(s)][1]; }

Family section_family(Section s) {
  switch (s) {
    case Section::kM: return Family::kM;
    case Section::kV: return Family::kV;
    case Section::kN: return Family::kN;
    default: return Family::kW;
  }
}

// The sections a checkpoint of this optimizer kind holds, in file order.
std::vector<Section> sections_for(OptimizerKind kind) {
  const PlanConfig need = plan_config_from_optimizer(kind);
  std::vector<Section> s = {Section::kMeta, Section::kLayout, Section::kW};
  if (need.has_m) s.push_back(Section::kM);
  if (need.has_v) s.push_back(Section::kV);
  if (need.has_n) s.push_back(Section::kN);
  s.push_back(Section::kScalars);
  return s;
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

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string errno_text(int err) { return std::strerror(err); }

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

void write_bytes_section(AtomicFile& file, Section s, const Bytes& b) {
  SectionWriter w(file, s, b.data().size());
  w.payload(b.data().data(), b.data().size());
  w.finish();
}

// ---- reading ----
// The checkpoint file, read by position and never held whole in memory: a resume validates it
// in a first pass and streams the state sections into the arena in a second (issue 12: the peak
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

constexpr uint64_t kStreamChunkBytes = uint64_t{4} << 20;

// Everything a checkpoint holds, decoded and validated, not yet applied.
struct Decoded {
  CheckpointInfo info;
  uint64_t family_data[kNumFamilies] = {};     // file offset of each state section's elements
  uint64_t family_hash[kNumFamilies] = {};     // XXH3 of its payload, re-checked while applying
  std::vector<float> f32;
  std::vector<int32_t> i32;
  std::vector<double> f64;
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

  // Returns the declared section count.
  uint32_t header() {
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
    if (version != kFormatVersion) {
      fail("header", "unsupported format version " + std::to_string(version) + " (this build reads version " +
                         std::to_string(kFormatVersion) + ")");
    }
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

// META, decoded and validated on its own (no task needed): read_checkpoint_info and load share it.
void decode_meta(Cursor& c, CheckpointInfo* info) {
  const std::string kind_name = c.str();
  const uint32_t mode = c.u32();
  OptimizerConfig& cfg = info->config;
  cfg.lr = c.f64();
  cfg.weight_decay = c.f64();
  cfg.momentum = c.f64();
  cfg.beta1 = c.f64();
  cfg.beta2 = c.f64();
  cfg.eps = c.f64();
  cfg.trust_coefficient = c.f64();
  info->lr = c.f64();
  info->loss_scale = c.f64();
  info->step = c.i64();
  info->skipped = c.i64();
  const uint32_t check_finite = c.u32();
  info->run.schedule = c.str();
  info->run.schedule_steps = c.i64();
  info->run.warmup = c.i64();
  info->run.seed = c.u64();
  cfg.max_grad_norm = c.f64();
  c.expect_end();
  if (!parse_optimizer_kind(kind_name, &cfg.kind)) c.fail("unknown optimizer kind '" + io::printable(kind_name) + "'");
  if (mode > static_cast<uint32_t>(WeightDecayMode::kL2)) c.fail("unknown weight decay mode " + std::to_string(mode));
  cfg.weight_decay_mode = static_cast<WeightDecayMode>(mode);
  if (check_finite > 1) c.fail("check-finite flag " + std::to_string(check_finite) + " is neither 0 nor 1");
  info->check_finite = check_finite == 1;
  try {
    cfg.validate();
    check_lr(info->lr);
    check_loss_scale(info->loss_scale);
  } catch (const Error& e) {
    c.fail(std::string("invalid hyperparameters: ") + e.what());
  }
  if (info->step < 0 || info->step > std::numeric_limits<int32_t>::max() || info->skipped < 0 ||
      info->skipped > std::numeric_limits<int32_t>::max()) {
    c.fail("step counts out of range (" + std::to_string(info->step) + " applied, " + std::to_string(info->skipped) +
           " skipped)");
  }
  if (info->run.schedule.size() > kMaxScheduleName || info->run.schedule_steps < 0 || info->run.warmup < 0 ||
      info->run.schedule_steps > std::numeric_limits<int32_t>::max() ||
      info->run.warmup > std::numeric_limits<int32_t>::max()) {
    c.fail("run settings out of range");
  }
}

uint64_t family_elements(const MemoryPlan& plan, Family f) {
  if (f == Family::kN) return plan.num_params();
  uint64_t n = 0;
  for (const TensorInfo& t : plan.tensors()) n += static_cast<uint64_t>(t.numel);
  return n;
}

uint64_t tensor_elements(const MemoryPlan& plan, Family f, size_t id) {
  return f == Family::kN ? 1 : static_cast<uint64_t>(plan.tensor(id).numel);
}

}  // namespace

void Task::save(const std::string& path) {
  require_compiled("save()");
  if (plan_.has_model_copy()) throw_invalid("save(): checkpoints do not carry a bf16/fp16 model copy yet (issue 14)");
  if (path.empty()) throw_invalid("save(): the checkpoint path is empty");
  check_layout_limits(params_);  // what load accepts, so that no save writes an unloadable file
  if (run_settings_.schedule.size() > kMaxScheduleName) throw_invalid("save(): the run's schedule name is too long");

  // The scalars are copied first; the state is streamed tensor by tensor into the file (a backend
  // error part-way removes the temporary file: the final name keeps the previous checkpoint).
  std::vector<float> f32(kNumScalarF32);
  std::vector<int32_t> i32(kNumScalarI32);
  std::vector<double> f64(kNumScalarF64);
  backend_->download(plan_.region(S_SCALAR_FP32).offset, f32.data(), f32.size() * sizeof(float));
  backend_->download(plan_.region(S_SCALAR_INT32).offset, i32.data(), i32.size() * sizeof(int32_t));
  backend_->download(plan_.region(S_SCALAR_FP64).offset, f64.data(), f64.size() * sizeof(double));

  const std::vector<Section> sections = sections_for(config_.kind);

  Bytes meta;
  meta.str(optimizer_kind_name(config_.kind));
  meta.u32(static_cast<uint32_t>(config_.weight_decay_mode));
  for (double v : {config_.lr, config_.weight_decay, config_.momentum, config_.beta1, config_.beta2, config_.eps,
                   config_.trust_coefficient, lr_, loss_scale_}) {
    meta.f64(v);
  }
  meta.i64(i32[kStep]);
  meta.i64(i32[kSkippedSteps]);
  meta.u32(options_.check_finite ? 1 : 0);
  meta.str(run_settings_.schedule);
  meta.i64(run_settings_.schedule_steps);
  meta.i64(run_settings_.warmup);
  meta.u64(run_settings_.seed);
  meta.f64(config_.max_grad_norm);

  Bytes layout;
  layout.u64(params_.size());
  for (const ParamSpec& p : params_) {
    layout.str(p.name);
    layout.u32(static_cast<uint32_t>(p.role));
    layout.u32(static_cast<uint32_t>(p.shape.size()));
    for (int64_t d : p.shape) layout.i64(d);
  }

  Bytes scalars;
  scalars.u32(kNumScalarF32);
  scalars.raw(f32.data(), f32.size() * sizeof(float));
  scalars.u32(kNumScalarI32);
  scalars.raw(i32.data(), i32.size() * sizeof(int32_t));
  scalars.u32(kNumScalarF64);
  scalars.raw(f64.data(), f64.size() * sizeof(double));

  AtomicFile file(path, "checkpoint");
  uint8_t header[kHeaderBytes];
  std::memcpy(header, kMagic, sizeof(kMagic));
  const uint32_t version = kFormatVersion;
  const uint32_t count = static_cast<uint32_t>(sections.size());
  std::memcpy(header + 8, &version, sizeof(version));
  std::memcpy(header + 12, &count, sizeof(count));
  const uint64_t header_sum = XXH3_64bits(header, 16);
  std::memcpy(header + 16, &header_sum, sizeof(header_sum));
  file.append(header, sizeof(header));

  for (Section s : sections) {
    if (s == Section::kMeta) {
      write_bytes_section(file, s, meta);
    } else if (s == Section::kLayout) {
      write_bytes_section(file, s, layout);
    } else if (s == Section::kScalars) {
      write_bytes_section(file, s, scalars);
    } else {
      const Family f = section_family(s);
      const uint64_t elements = family_elements(plan_, f);
      SectionWriter w(file, s, sizeof(uint64_t) + elements * sizeof(float));
      w.payload(&elements, sizeof(elements));
      std::vector<uint8_t> chunk;
      for (size_t id = 0; id < params_.size(); ++id) {
        const uint64_t bytes = tensor_elements(plan_, f, id) * sizeof(float);
        for (uint64_t done = 0; done < bytes;) {
          const uint64_t n = std::min<uint64_t>(bytes - done, kStreamChunkBytes);
          chunk.resize(static_cast<size_t>(n));
          backend_->download(plan_.tensor_offset(f, id) + done, chunk.data(), n);
          w.payload(chunk.data(), n);
          done += n;
        }
      }
      w.finish();
    }
  }
  file.commit();
}

void Task::load(const std::string& path) {
  require_compiled("load()");
  if (plan_.has_model_copy()) throw_invalid("load(): checkpoints do not carry a bf16/fp16 model copy yet (issue 14)");
  if (path.empty()) throw_invalid("load(): the checkpoint path is empty");

  // A bound on the size of any checkpoint of this task, so a wrong path to a huge file is
  // refused before it is read into memory.
  uint64_t max_bytes = kHeaderBytes + 7 * (kFrameBytes + kChecksumBytes) + 4096;
  max_bytes += kMaxMetaBytes + 8 + params_.size() * (4 + 4 + 4 + kMaxParamRank * 8);
  for (const ParamSpec& p : params_) max_bytes += p.name.size();
  for (Family f : {Family::kW, Family::kM, Family::kV, Family::kN}) {
    if (plan_.has_family(f)) max_bytes += 8 + family_elements(plan_, f) * sizeof(float);
  }
  max_bytes += 3 * 4 + (kNumScalarF32 + kNumScalarI32) * 4 + kNumScalarF64 * 8;
  // Checkpoints of another kind may hold more families (Adam: W, M, V): let those through so
  // that the error says which kind it is.
  max_bytes += 3 * (8 + family_elements(plan_, Family::kW) * sizeof(float));

  const FileReader file(path, max_bytes);
  Parser parser(path, file);
  const uint64_t layout_limit = 8 + params_.size() * (4 + 4 + 4 + kMaxParamRank * 8 + kMaxParamNameBytes);
  Decoded d;

  // ---- validate everything; nothing in the task changes until the end ----
  const uint32_t declared_sections = parser.header();

  {
    const SectionView v = parser.section(Section::kMeta, kMaxMetaBytes);
    Cursor c(v.payload, v.length, parser.where(Section::kMeta));
    decode_meta(c, &d.info);
    const OptimizerConfig& cfg = d.info.config;
    // The compiled step depends on the kind, the decay mode and the check-finite flag; everything
    // else is adopted.
    if (cfg.kind != config_.kind) {
      throw_invalid("checkpoint " + path + ": checkpoint is for optimizer " + optimizer_kind_name(cfg.kind) +
                    ", task uses " + optimizer_kind_name(config_.kind));
    }
    if (cfg.weight_decay_mode != config_.weight_decay_mode) {
      auto mode_name = [](WeightDecayMode m) { return m == WeightDecayMode::kL2 ? "l2" : "decoupled"; };
      throw_invalid("checkpoint " + path + ": checkpoint uses weight decay mode " + mode_name(cfg.weight_decay_mode) +
                    ", task uses " + mode_name(config_.weight_decay_mode));
    }
    if ((cfg.max_grad_norm > 0.0) != (config_.max_grad_norm > 0.0)) {
      throw_invalid("checkpoint " + path + ": checkpoint was made " + (cfg.max_grad_norm > 0.0 ? "with" : "without") +
                    " gradient-norm clipping, task runs " + (config_.max_grad_norm > 0.0 ? "with" : "without") + " it");
    }
    if (d.info.check_finite != options_.check_finite) {
      throw_invalid("checkpoint " + path + ": checkpoint was made " +
                    (d.info.check_finite ? "with" : "without") + " the non-finite check, task runs " +
                    (options_.check_finite ? "with" : "without") + " it");
    }
  }

  const std::vector<Section> sections = sections_for(d.info.config.kind);
  if (declared_sections != sections.size()) {
    parser.fail("header", "declares " + std::to_string(declared_sections) + " sections, a checkpoint for " +
                              optimizer_kind_name(d.info.config.kind) + " has " + std::to_string(sections.size()));
  }

  {
    const SectionView v = parser.section(Section::kLayout, layout_limit);
    Cursor c(v.payload, v.length, parser.where(Section::kLayout));
    const uint64_t count = c.u64();
    const std::string differs = "checkpoint " + path + ": checkpoint layout differs from the task's";
    if (count != params_.size()) {
      throw_invalid(differs + ": " + std::to_string(count) + " parameters (checkpoint) vs " +
                    std::to_string(params_.size()) + " (task)");
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      const ParamSpec& p = params_[i];
      const std::string name = c.str();
      const uint32_t role = c.u32();
      const uint32_t rank = c.u32();
      if (rank > kMaxParamRank || rank * uint64_t{8} > c.remaining()) c.fail("malformed payload (rank " + std::to_string(rank) + ")");
      std::vector<int64_t> shape(rank);
      for (auto& e : shape) e = c.i64();
      const std::string at = differs + " at parameter " + std::to_string(i);
      if (name != p.name) throw_invalid(at + ": name '" + name + "' (checkpoint) vs '" + p.name + "' (task)");
      const std::string named = at + " '" + p.name + "'";
      if (shape != p.shape) {
        throw_invalid(named + ": shape " + shape_text(shape) + " (checkpoint) vs " + shape_text(p.shape) + " (task)");
      }
      if (role != static_cast<uint32_t>(p.role)) {
        const std::string seen = role < static_cast<uint32_t>(kNumRoles) ? role_name(static_cast<Role>(role))
                                                                         : "#" + std::to_string(role);
        throw_invalid(named + ": role " + seen + " (checkpoint) vs " + role_name(p.role) + " (task)");
      }
    }
    c.expect_end();
  }

  for (Section s : sections) {
    if (s == Section::kMeta || s == Section::kLayout || s == Section::kScalars) continue;
    const SectionView v = parser.section(s, 0);  // streamed: checked here, applied below
    const Family f = section_family(s);
    const uint64_t want = family_elements(plan_, f);
    uint64_t count = 0;
    uint8_t count_bytes[8];
    if (v.length < sizeof(count_bytes)) throw_format(parser.where(s) + "malformed payload (a field runs past the section's end)");
    file.read(v.offset, count_bytes, sizeof(count_bytes));
    Cursor c(count_bytes, sizeof(count_bytes), parser.where(s));
    count = c.u64();
    if (count != want) {
      c.fail("holds " + std::to_string(count) + " elements, the task's layout needs " + std::to_string(want));
    }
    if (v.length - 8 != want * sizeof(float)) c.fail("malformed payload (its length does not match its count)");
    d.family_data[static_cast<int>(f)] = v.offset;
    d.family_hash[static_cast<int>(f)] = v.payload_hash;
  }

  {
    const SectionView v = parser.section(Section::kScalars, 64 * 1024);
    Cursor c(v.payload, v.length, parser.where(Section::kScalars));
    auto slots = [&](uint32_t want, const char* what) {
      const uint32_t n = c.u32();
      if (n != want) {
        c.fail("holds " + std::to_string(n) + " " + what + " slots, this build has " + std::to_string(want));
      }
    };
    slots(kNumScalarF32, "fp32");
    d.f32.resize(kNumScalarF32);
    c.raw(d.f32.data(), d.f32.size() * sizeof(float));
    slots(kNumScalarI32, "int32");
    d.i32.resize(kNumScalarI32);
    c.raw(d.i32.data(), d.i32.size() * sizeof(int32_t));
    slots(kNumScalarF64, "fp64");
    d.f64.resize(kNumScalarF64);
    c.raw(d.f64.data(), d.f64.size() * sizeof(double));
    c.expect_end();
    if (d.i32[kStep] != d.info.step || d.i32[kSkippedSteps] != d.info.skipped) {
      c.fail("step counts (" + std::to_string(d.i32[kStep]) + ", " + std::to_string(d.i32[kSkippedSteps]) +
             ") disagree with section META (" + std::to_string(d.info.step) + ", " + std::to_string(d.info.skipped) + ")");
    }
    if (d.i32[kHasNonFinite] != 0 && d.i32[kHasNonFinite] != 1) {
      c.fail("non-finite flag " + std::to_string(d.i32[kHasNonFinite]) + " is neither 0 nor 1");
    }
  }
  parser.expect_end(Section::kScalars);

  // ---- apply: the file is valid; stream each state section into the arena, tensor by tensor
  // (the host never holds more than one chunk). Padding is zero in every live task and is not
  // touched. The payload is hashed again on the way: a file rewritten in place between the two
  // passes is reported, and the task's state is then undefined (load a checkpoint again); the
  // same holds for a backend failure part-way. An invalid file never changes anything. ----
  std::vector<uint8_t> chunk;
  for (Section s : sections) {
    if (s == Section::kMeta || s == Section::kLayout || s == Section::kScalars) continue;
    const Family f = section_family(s);
    XXH3_state_t again;
    XXH3_64bits_reset(&again);
    uint64_t pos = d.family_data[static_cast<int>(f)];
    uint8_t count_bytes[8];
    file.read(pos, count_bytes, sizeof(count_bytes));
    XXH3_64bits_update(&again, count_bytes, sizeof(count_bytes));
    pos += sizeof(count_bytes);
    for (size_t id = 0; id < params_.size(); ++id) {
      const uint64_t bytes = tensor_elements(plan_, f, id) * sizeof(float);
      const uint64_t base = plan_.tensor_offset(f, id);
      for (uint64_t done = 0; done < bytes;) {
        const uint64_t n = std::min<uint64_t>(bytes - done, kStreamChunkBytes);
        chunk.resize(static_cast<size_t>(n));
        file.read(pos, chunk.data(), n);
        XXH3_64bits_update(&again, chunk.data(), n);
        backend_->upload(base + done, chunk.data(), n);
        pos += n;
        done += n;
      }
    }
    if (XXH3_64bits_digest(&again) != d.family_hash[static_cast<int>(f)]) {
      throw_format("checkpoint " + path + ": section " + section_name(s) +
                   " changed while it was being loaded; the task's state is undefined: load a checkpoint again");
    }
  }
  backend_->upload(plan_.region(S_SCALAR_FP32).offset, d.f32.data(), d.f32.size() * sizeof(float));
  backend_->upload(plan_.region(S_SCALAR_INT32).offset, d.i32.data(), d.i32.size() * sizeof(int32_t));
  backend_->upload(plan_.region(S_SCALAR_FP64).offset, d.f64.data(), d.f64.size() * sizeof(double));
  // Hyperparameter slots are rewritten from the restored doubles by the same code that wrote
  // them before the save, so they come out with the same bits; the bias corrections, the step
  // counters and the non-finite flag are device-owned state and keep the file's values.
  config_ = d.info.config;
  lr_ = d.info.lr;
  loss_scale_ = d.info.loss_scale;
  run_settings_ = d.info.run;
  write_hyperparameters();
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  if (path.empty()) throw_invalid("checkpoint path is empty");
  // Only the header and META are read: a resume learns its configuration without reading the
  // state.
  const FileReader file(path, std::numeric_limits<uint64_t>::max());
  Parser parser(path, file);
  CheckpointInfo info;
  parser.header();
  info.version = kFormatVersion;
  const SectionView v = parser.section(Section::kMeta, kMaxMetaBytes);
  Cursor c(v.payload, v.length, parser.where(Section::kMeta));
  decode_meta(c, &info);
  return info;
}

}  // namespace renaissance
