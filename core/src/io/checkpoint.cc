// Checkpoints: Task::save and Task::load.
//
// File format (version 2, little-endian, no padding between fields; docs/checkpoint-format.md):
//
//   header   magic "\x89RNCKPT\n" (8 bytes), u32 format version, u32 section count,
//            u64 XXH3-64 of the 16 bytes before it
//   sections, in this order: META, LAYOUT, W, M (if used), V (if used), N (if used), SCALARS.
//            Each is: 4-byte tag, u64 payload length, payload, u64 XXH3-64 of tag+length+payload.
//
//   META     str kind ("adamw", ...), u32 weight-decay mode, f64 lr, weight_decay, momentum,
//            beta1, beta2, eps, trust_coefficient (the configured values), f64 the task's current
//            lr and loss scale, i64 applied steps, i64 skipped steps; since version 2: u32
//            check-finite flag, the run settings (str schedule, i64 schedule steps, i64 warm-up,
//            u64 seed), f64 max_grad_norm (0: no clipping). Version 1 files (without these) are refused naming both versions: a resume
//            must not guess the configuration it continues.
//   LAYOUT   u64 parameter count; per parameter: str name, u32 role, u32 rank, i64 extents
//   W/M/V/N  u64 element count, then the elements of every tensor in parameter order (N: one
//            trust ratio per tensor). Padding is not stored: the format does not depend on the
//            arena layout, so a later change of padding keeps old checkpoints loadable.
//   SCALARS  u32 n, n f32 slots; u32 n, n i32 slots; u32 n, n f64 slots (scalars.h order)
//
// str is a u32 length then the bytes. G is not state and is not stored. Nothing in the file
// depends on the backend, so a checkpoint written on CUDA loads on the CPU and vice versa.
//
// Save writes a temporary file in the destination folder, fsyncs it, renames it over the final
// name and fsyncs the folder, so the final name only ever carries a complete checkpoint. Load
// reads the whole file and validates every byte before it changes anything in the task.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
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

const char* section_tag(Section s) {
  switch (s) {
    case Section::kMeta: return "META";
    case Section::kLayout: return "LAYT";
    case Section::kW: return "FAMW";
    case Section::kM: return "FAMM";
    case Section::kV: return "FAMV";
    case Section::kN: return "FAMN";
    case Section::kScalars: return "SCAL";
  }
  return "????";
}

// The name errors use ("section M: checksum mismatch").
const char* section_name(Section s) {
  switch (s) {
    case Section::kMeta: return "META";
    case Section::kLayout: return "LAYOUT";
    case Section::kW: return "W";
    case Section::kM: return "M";
    case Section::kV: return "V";
    case Section::kN: return "N";
    case Section::kScalars: return "SCALARS";
  }
  return "?";
}

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
std::vector<uint8_t> read_whole_file(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = io::open_regular_file(path, "checkpoint", &size);
  if (size > max_bytes) {
    ::close(fd);
    throw_format("checkpoint " + path + ": the file has " + std::to_string(size) +
                 " bytes, more than any checkpoint of this task can have (" + std::to_string(max_bytes) +
                 "): it is not a checkpoint of this task");
  }
  std::vector<uint8_t> data(static_cast<size_t>(size));
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t r = ::read(fd, data.data() + got, data.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw_io("cannot read checkpoint " + path + ": " + errno_text(err));
    }
    if (r == 0) break;  // the file shrank under us: parse what is there, it will be refused
    got += static_cast<size_t>(r);
  }
  data.resize(got);
  ::close(fd);
  return data;
}

// Everything a checkpoint holds, decoded and validated, not yet applied.
struct Decoded {
  CheckpointInfo info;
  std::vector<float> family[kNumFamilies];  // per-tensor data in parameter order
  std::vector<float> f32;
  std::vector<int32_t> i32;
  std::vector<double> f64;
};

struct SectionView {
  const uint8_t* payload;
  uint64_t length;
};

class Parser {
 public:
  Parser(const std::string& path, const std::vector<uint8_t>& file) : path_(path), file_(file) {}

  [[noreturn]] void fail(const char* section, const std::string& what) const {
    throw_format("checkpoint " + path_ + ": section " + section + ": " + what);
  }
  std::string where(Section s) const { return "checkpoint " + path_ + ": section " + section_name(s) + ": "; }

  // Returns the declared section count.
  uint32_t header() {
    if (file_.size() < kHeaderBytes) {
      if (file_.size() >= sizeof(kMagic) && std::memcmp(file_.data(), kMagic, sizeof(kMagic)) != 0) {
        fail("header", "bad magic: not a Renaissance checkpoint");
      }
      fail("header", "truncated (" + std::to_string(file_.size()) + " of " + std::to_string(kHeaderBytes) +
                         " bytes)");
    }
    if (std::memcmp(file_.data(), kMagic, sizeof(kMagic)) != 0) {
      fail("header", "bad magic: not a Renaissance checkpoint");
    }
    uint64_t stored;
    std::memcpy(&stored, file_.data() + 16, sizeof(stored));
    if (XXH3_64bits(file_.data(), 16) != stored) fail("header", "checksum mismatch");
    uint32_t version, count;
    std::memcpy(&version, file_.data() + 8, sizeof(version));
    std::memcpy(&count, file_.data() + 12, sizeof(count));
    if (version != kFormatVersion) {
      fail("header", "unsupported format version " + std::to_string(version) + " (this build reads version " +
                         std::to_string(kFormatVersion) + ")");
    }
    pos_ = kHeaderBytes;
    return count;
  }

  SectionView section(Section s) {
    const char* name = section_name(s);
    const uint64_t left = file_.size() - pos_;
    if (left == 0) fail(name, "missing: the file ends before it (truncated)");
    if (left < kFrameBytes) fail(name, "truncated (the file ends inside the section's frame)");
    const uint8_t* frame = file_.data() + pos_;
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
    uint64_t stored;
    std::memcpy(&stored, frame + kFrameBytes + length, sizeof(stored));
    if (XXH3_64bits(frame, kFrameBytes + length) != stored) fail(name, "checksum mismatch");
    pos_ += kFrameBytes + length + kChecksumBytes;
    return {frame + kFrameBytes, length};
  }

  void expect_end(Section last) const {
    if (pos_ != file_.size()) {
      throw_format("checkpoint " + path_ + ": " + std::to_string(file_.size() - pos_) +
                   " unexpected bytes after section " + section_name(last) + " (corrupt file)");
    }
  }

 private:
  const std::string& path_;
  const std::vector<uint8_t>& file_;
  uint64_t pos_ = 0;
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

// The whole span of one family, from its first region's start to its last region's end.
Span family_span(const MemoryPlan& plan, Family f) {
  return plan.region_range(family_region(f, Role::kBnBias), family_region(f, Role::kDeepConv));
}

// Element offset of tensor `id` inside the span of family `f`.
uint64_t index_in_span(const MemoryPlan& plan, Family f, size_t id) {
  return (plan.tensor_offset(f, id) - family_span(plan, f).offset) / sizeof(float);
}

uint64_t tensor_elements(const MemoryPlan& plan, Family f, size_t id) {
  return f == Family::kN ? 1 : static_cast<uint64_t>(plan.tensor(id).numel);
}

}  // namespace

void Task::save(const std::string& path) {
  require_compiled("save()");
  if (path.empty()) throw_invalid("save(): the checkpoint path is empty");
  check_layout_limits(params_);  // what load accepts, so that no save writes an unloadable file
  if (run_settings_.schedule.size() > kMaxScheduleName) throw_invalid("save(): the run's schedule name is too long");

  // Everything is copied to the host before the temporary file exists, so a backend error
  // leaves nothing behind on disk.
  std::vector<float> f32(kNumScalarF32);
  std::vector<int32_t> i32(kNumScalarI32);
  std::vector<double> f64(kNumScalarF64);
  backend_->download(plan_.region(S_SCALAR_FP32).offset, f32.data(), f32.size() * sizeof(float));
  backend_->download(plan_.region(S_SCALAR_INT32).offset, i32.data(), i32.size() * sizeof(int32_t));
  backend_->download(plan_.region(S_SCALAR_FP64).offset, f64.data(), f64.size() * sizeof(double));

  const std::vector<Section> sections = sections_for(config_.kind);
  std::vector<std::vector<float>> spans(kNumFamilies);
  for (Section s : sections) {
    if (s == Section::kMeta || s == Section::kLayout || s == Section::kScalars) continue;
    const Family f = section_family(s);
    const Span span = family_span(plan_, f);
    spans[static_cast<int>(f)].resize(span.count);
    if (span.count > 0) backend_->download(span.offset, spans[static_cast<int>(f)].data(), span.count * sizeof(float));
  }

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
      const std::vector<float>& span = spans[static_cast<int>(f)];
      for (size_t id = 0; id < params_.size(); ++id) {
        const uint64_t n = tensor_elements(plan_, f, id);
        if (n > 0) w.payload(span.data() + index_in_span(plan_, f, id), n * sizeof(float));
      }
      w.finish();
    }
  }
  file.commit();
}

void Task::load(const std::string& path) {
  require_compiled("load()");
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

  const std::vector<uint8_t> file = read_whole_file(path, max_bytes);
  Parser parser(path, file);
  Decoded d;

  // ---- validate everything; nothing in the task changes until the end ----
  const uint32_t declared_sections = parser.header();

  {
    const SectionView v = parser.section(Section::kMeta);
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
    const SectionView v = parser.section(Section::kLayout);
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
    const SectionView v = parser.section(s);
    Cursor c(v.payload, v.length, parser.where(s));
    const Family f = section_family(s);
    const uint64_t want = family_elements(plan_, f);
    const uint64_t count = c.u64();
    if (count != want) {
      c.fail("holds " + std::to_string(count) + " elements, the task's layout needs " + std::to_string(want));
    }
    if (c.remaining() != want * sizeof(float)) c.fail("malformed payload (its length does not match its count)");
    std::vector<float>& data = d.family[static_cast<int>(f)];
    data.resize(want);
    if (want > 0) c.raw(data.data(), want * sizeof(float));
  }

  {
    const SectionView v = parser.section(Section::kScalars);
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

  // ---- apply. Host copies of everything this overwrites come first, so that a backend
  // failure half-way (a CUDA error) puts the task back as it was. ----
  struct Saved {
    uint64_t offset;
    std::vector<uint8_t> bytes;
  };
  std::vector<Saved> before;
  auto keep = [&](uint64_t offset, uint64_t bytes) {
    Saved s{offset, std::vector<uint8_t>(bytes)};
    if (bytes > 0) backend_->download(offset, s.bytes.data(), bytes);
    before.push_back(std::move(s));
  };
  for (Section s : sections) {
    if (s == Section::kMeta || s == Section::kLayout || s == Section::kScalars) continue;
    const Span span = family_span(plan_, section_family(s));
    keep(span.offset, span.count * sizeof(float));
  }
  keep(plan_.region(S_SCALAR_FP32).offset, kNumScalarF32 * sizeof(float));
  keep(plan_.region(S_SCALAR_INT32).offset, kNumScalarI32 * sizeof(int32_t));
  keep(plan_.region(S_SCALAR_FP64).offset, kNumScalarF64 * sizeof(double));
  const OptimizerConfig old_config = config_;
  const double old_lr = lr_, old_loss_scale = loss_scale_;

  try {
    for (Section s : sections) {
      if (s == Section::kMeta || s == Section::kLayout || s == Section::kScalars) continue;
      const Family f = section_family(s);
      const Span span = family_span(plan_, f);
      // Padding is zero in every live task and stays zero: build the span with zero padding.
      std::vector<float> image(span.count, 0.0f);
      const std::vector<float>& data = d.family[static_cast<int>(f)];
      uint64_t next = 0;
      for (size_t id = 0; id < params_.size(); ++id) {
        const uint64_t n = tensor_elements(plan_, f, id);
        if (n > 0) std::memcpy(image.data() + index_in_span(plan_, f, id), data.data() + next, n * sizeof(float));
        next += n;
      }
      if (span.count > 0) backend_->upload(span.offset, image.data(), span.count * sizeof(float));
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
  } catch (...) {
    config_ = old_config;
    lr_ = old_lr;
    loss_scale_ = old_loss_scale;
    try {
      for (const Saved& s : before) {
        if (!s.bytes.empty()) backend_->upload(s.offset, s.bytes.data(), s.bytes.size());
      }
    } catch (...) {
      // The backend is failing; the original error below is the one worth reporting.
    }
    throw;
  }
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  if (path.empty()) throw_invalid("checkpoint path is empty");
  // Only the header and META are read: a resume learns its configuration without reading the
  // state (a bigger META than kMaxMetaBytes is not one this build wrote).
  uint64_t size = 0;
  const int fd = io::open_regular_file(path, "checkpoint", &size);
  std::vector<uint8_t> head(static_cast<size_t>(std::min<uint64_t>(size, kHeaderBytes + kFrameBytes + kMaxMetaBytes + kChecksumBytes)));
  size_t got = 0;
  while (got < head.size()) {
    const ssize_t r = ::pread(fd, head.data() + got, head.size() - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      throw_io("cannot read checkpoint " + path + ": " + errno_text(err));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  head.resize(got);
  Parser parser(path, head);
  CheckpointInfo info;
  parser.header();
  info.version = kFormatVersion;
  const SectionView v = parser.section(Section::kMeta);
  Cursor c(v.payload, v.length, parser.where(Section::kMeta));
  decode_meta(c, &info);
  return info;
}

}  // namespace renaissance
