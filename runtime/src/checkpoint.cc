// Checkpoints: Task::save and Task::load.
//
// The format (version 2: header, then META, LAYOUT, W, M, V, N, SCALARS, each framed and
// checksummed; version 3, written only by a task with a bf16/fp16 model copy: PRECISION after
// META and the copy C before SCALARS) is specified in docs/checkpoint-format.md. Nothing in a file
// depends on the backend or the arena's padding. Version 1 files (META without the check-finite
// flag and the run settings) are refused naming both versions: a resume must not guess what it
// continues. The framing is in checkpoint_framing.h, the META, PREC and LAYT codec in
// checkpoint_codec.cc; here: the sections a file holds, the state sections and the scalars, and
// the save and the two passes of a load.
//
// Save writes a temporary file in the destination folder, fsyncs it, renames it over the final
// name and fsyncs the folder, so the final name only ever carries a complete checkpoint. Load
// validates every byte in a first pass over the file before it changes anything in the task, then
// streams the state sections into the arena in a second (the file is never held whole in memory).
#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/src/io/atomic_file.h"
#include "runtime/src/checkpoint_codec.h"
#include "runtime/src/checkpoint_framing.h"
#include "core/src/io/file_checks.h"
#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/layout.h"
#include "renaissance/precision.h"
#include "renaissance/scalars.h"
#include "renaissance/task.h"

namespace renaissance {

namespace {

using namespace checkpoint_format;

// The family whose elements a state section holds (the model copy C: W's).
Family section_family(Section s) { return is_family_section(s) ? section_family_of(s) : Family::kW; }

bool is_state_section(Section s) {
  return s == Section::kC || (is_family_section(s) && family_info(section_family_of(s)).checkpoint_tag != nullptr);
}

// The sections read and written through the optimizer-state slice (read_state, write_state_part).
bool is_sliced_section(Section s) {
  return is_family_section(s) && family_info(section_family_of(s)).optimizer_state;
}

// The sections a checkpoint of this configuration holds, in file order: META, PRECISION (a task
// with a model copy, format version 3), LAYOUT, the families the plan holds in kFamilyTable's
// order (amsgrad adds VMAX after V: a file without it keeps its bytes), the copy C, SCALARS.
std::vector<Section> sections_for(const OptimizerConfig& config, bool model_copy) {
  const PlanConfig need = plan_config_from_optimizer(config);
  std::vector<Section> s = {Section::kMeta};
  if (model_copy) s.push_back(Section::kPrecision);
  s.push_back(Section::kLayout);
  for (Family f : kFamiliesInOrder) {
    if (need.has(f) && family_info(f).checkpoint_tag != nullptr) s.push_back(family_section(f));
  }
  if (model_copy) s.push_back(Section::kC);
  s.push_back(Section::kScalars);
  return s;
}

// Everything a checkpoint holds, decoded and validated, not yet applied.
struct Decoded {
  CheckpointInfo info;
  uint32_t version = 0;
  PrecisionOptions precision;                 // fp32 for a version-2 file
  uint64_t section_data[kNumSections] = {};   // file offset of each state section's elements
  uint64_t section_hash[kNumSections] = {};   // XXH3 of its payload, re-checked while applying
  std::vector<float> f32;
  std::vector<int32_t> i32;
  std::vector<double> f64;
  std::vector<int32_t> tensor_steps;  // tensor_mask only
  std::vector<Section> sections;      // the sections a file of its kind, amsgrad and version holds
};

uint64_t family_elements(const MemoryPlan& plan, Family f) {
  if (family_info(f).extent == FamilyExtent::kPerTensor) return plan.num_params();
  uint64_t n = 0;
  for (const TensorInfo& t : plan.tensors()) n += static_cast<uint64_t>(t.numel);
  return n;
}

uint64_t tensor_elements(const MemoryPlan& plan, Family f, size_t id) {
  return family_info(f).extent == FamilyExtent::kPerTensor ? 1 : static_cast<uint64_t>(plan.tensor(id).numel);
}

// A state section's stored elements: the family's (float32 for W, M, V, VMAX, N); the copy format's encodings for
// the copy C (element j of C pairs with element j of W).
uint64_t element_bytes(const MemoryPlan& plan, Section s) {
  return s == Section::kC ? precision_bytes(plan.config().precision) : family_info(section_family(s)).elem_bytes;
}
uint64_t section_elements(const MemoryPlan& plan, Section s) { return family_elements(plan, section_family(s)); }
uint64_t section_tensor_bytes(const MemoryPlan& plan, Section s, size_t id) {
  return tensor_elements(plan, section_family(s), id) * element_bytes(plan, s);
}
uint64_t section_tensor_offset(const MemoryPlan& plan, Section s, size_t id) {
  return s == Section::kC ? plan.model_copy_offset(id) : plan.tensor_offset(section_family(s), id);
}

}  // namespace

void Task::save(const std::string& path) {
  require_whole_state("save()");
  save(path, [this](Family family, size_t id, uint64_t first, uint64_t count, float* dst) {
    backend_->download(plan_.tensor_offset(family, id) + first * sizeof(float), dst, count * sizeof(float));
  }, true);
}

void Task::save(const std::string& path, const StateReader& read_state, bool write_file) {
  require_compiled("save()");
  if (path.empty()) throw_invalid("save(): the checkpoint path is empty");
  check_layout_limits(params_);  // what load accepts, so that no save writes an unloadable file
  if (run_settings_.schedule.size() > kMaxScheduleName) throw_invalid("save(): the run's schedule name is too long");

  // The scalars are copied first; the state is streamed tensor by tensor into the file (a backend
  // error part-way removes the temporary file: the final name keeps the previous checkpoint).
  // Every hyperparameter group's block (scalars.h): the file holds H blocks of each.
  // Of the fp32 slots only the first kNumStoredScalarF32 of each block (scalars.h: the rest are
  // formed again before they are read), so a run without dampening writes the bytes it always did.
  std::vector<float> all32(plan_.region(S_SCALAR_FP32).count);
  std::vector<int32_t> i32(kNumScalarI32);
  std::vector<double> f64(plan_.region(S_SCALAR_FP64).count);
  backend_->download(plan_.region(S_SCALAR_FP32).offset, all32.data(), all32.size() * sizeof(float));
  std::vector<float> f32;
  for (size_t b = 0; b < all32.size() / kNumScalarF32; ++b) {
    f32.insert(f32.end(), all32.begin() + b * kNumScalarF32, all32.begin() + b * kNumScalarF32 + kNumStoredScalarF32);
  }
  backend_->download(plan_.region(S_SCALAR_INT32).offset, i32.data(), i32.size() * sizeof(int32_t));
  backend_->download(plan_.region(S_SCALAR_FP64).offset, f64.data(), f64.size() * sizeof(double));

  const bool model_copy = plan_.has_model_copy();
  const std::vector<Section> sections = sections_for(config(), model_copy);

  CheckpointInfo info;  // what META holds
  info.config = config();
  info.lr = lr();
  info.loss_scale = loss_scale_;
  info.step = i32[kStep];
  info.skipped = i32[kSkippedSteps];
  info.check_finite = options_.check_finite;
  info.run = run_settings_;
  Bytes meta, precision, layout;
  encode_meta(info, &meta);
  encode_precision(options_.precision, &precision);
  encode_layout(params_, &layout);

  Bytes scalars;
  scalars.u32(static_cast<uint32_t>(f32.size()));
  scalars.raw(f32.data(), f32.size() * sizeof(float));
  scalars.u32(kNumScalarI32);
  scalars.raw(i32.data(), i32.size() * sizeof(int32_t));
  scalars.u32(static_cast<uint32_t>(f64.size()));
  scalars.raw(f64.data(), f64.size() * sizeof(double));
  if (options_.tensor_mask) {
    // tensor_mask: a block per tensor above, then each tensor's applied-step count (the mask is
    // the caller's input, not state: it is not stored).
    std::vector<int32_t> steps(params_.size());
    if (!steps.empty()) {
      backend_->download(plan_.region(S_TENSOR_INT32).offset + steps.size() * sizeof(int32_t), steps.data(),
                         steps.size() * sizeof(int32_t));
    }
    scalars.u32(static_cast<uint32_t>(steps.size()));
    scalars.raw(steps.data(), steps.size() * sizeof(int32_t));
  }

  // A state section's payload, tensor by tensor in chunks, into `sink`; M and V through read_state.
  std::vector<float> chunk;
  auto stream_section = [&](Section s, const std::function<void(const void*, size_t)>& sink) {
    for (size_t id = 0; id < params_.size(); ++id) {
      const uint64_t bytes = section_tensor_bytes(plan_, s, id);
      for (uint64_t done = 0; done < bytes;) {
        const uint64_t n = std::min<uint64_t>(bytes - done, kStreamChunkBytes);
        chunk.resize(static_cast<size_t>((n + sizeof(float) - 1) / sizeof(float)));
        if (is_sliced_section(s)) {
          static_assert(kStreamChunkBytes % sizeof(float) == 0, "M and V chunks are whole floats");
          read_state(section_family(s), id, done / sizeof(float), n / sizeof(float), chunk.data());
        } else {
          backend_->download(section_tensor_offset(plan_, s, id) + done, chunk.data(), n);
        }
        sink(chunk.data(), static_cast<size_t>(n));
        done += n;
      }
    }
  };
  // The file (this rank writes it): opened first; a failure to open or write it is kept and
  // thrown once every read of M and V has been made, because with read_state those reads are
  // collectives that the other ranks of a sharded save wait in.
  std::optional<AtomicFile> file;
  std::exception_ptr write_error;
  auto guarded = [&](const std::function<void()>& write) {
    if (write_error) return;
    try {
      write();
    } catch (...) {
      write_error = std::current_exception();
    }
  };
  if (write_file) guarded([&] { file.emplace(path, "checkpoint"); });
  if (!file) {
    // Another rank writes, or this one could not open the file: the same reads of M and V, in
    // the same order.
    for (Section s : sections) {
      if (is_sliced_section(s)) stream_section(s, [](const void*, size_t) {});
    }
    if (write_error) std::rethrow_exception(write_error);
    return;
  }

  guarded([&] {
    uint8_t header[kHeaderBytes];
    std::memcpy(header, kMagic, sizeof(kMagic));
    const uint32_t version = model_copy ? kFormatVersionModelCopy : kFormatVersion;
    const uint32_t count = static_cast<uint32_t>(sections.size());
    std::memcpy(header + 8, &version, sizeof(version));
    std::memcpy(header + 12, &count, sizeof(count));
    const uint64_t header_sum = XXH3_64bits(header, 16);
    std::memcpy(header + 16, &header_sum, sizeof(header_sum));
    file->append(header, sizeof(header));
  });

  for (Section s : sections) {
    if (s == Section::kMeta) {
      guarded([&] { write_bytes_section(*file, s, meta); });
    } else if (s == Section::kPrecision) {
      guarded([&] { write_bytes_section(*file, s, precision); });
    } else if (s == Section::kLayout) {
      guarded([&] { write_bytes_section(*file, s, layout); });
    } else if (s == Section::kScalars) {
      guarded([&] { write_bytes_section(*file, s, scalars); });
    } else {
      const uint64_t elements = section_elements(plan_, s);
      std::optional<SectionWriter> w;
      guarded([&] {
        w.emplace(*file, s, sizeof(uint64_t) + elements * element_bytes(plan_, s));
        w->payload(&elements, sizeof(elements));
      });
      stream_section(s, [&](const void* p, size_t n) { guarded([&] { w->payload(p, n); }); });
      guarded([&] { w->finish(); });
    }
  }
  if (write_error) std::rethrow_exception(write_error);  // ~AtomicFile removes the temporary file
  file->commit();
}

namespace {

// A bound on the size of any checkpoint of this task, so a wrong path to a huge file is refused
// before it is read into memory.
uint64_t checkpoint_bytes_bound(const std::vector<ParamSpec>& params, const MemoryPlan& plan, bool tensor_mask) {
  uint64_t max_bytes = kHeaderBytes + kNumSections * (kFrameBytes + kChecksumBytes) + 4096;
  max_bytes += kMaxMetaBytes + 8 + params.size() * (4 + 4 + 4 + kMaxParamRank * 8);
  for (const ParamSpec& p : params) max_bytes += p.name.size();
  for (const FamilyInfo& f : kFamilyTable) {
    if (f.checkpoint_tag != nullptr && plan.has_family(f.family)) {
      max_bytes += 8 + family_elements(plan, f.family) * f.elem_bytes;
    }
  }
  max_bytes += 3 * 4 + (plan.region(S_SCALAR_FP32).count + kNumScalarI32) * 4 + plan.region(S_SCALAR_FP64).count * 8;
  if (tensor_mask) max_bytes += 4 + params.size() * 4;  // the per-tensor steps
  // Checkpoints of another kind may hold more families (Adam: W, M, V): let those through so
  // that the error says which kind it is.
  max_bytes += 3 * (8 + family_elements(plan, Family::kW) * sizeof(float));
  // A model copy (PRECISION and C), also for a task without one, so that the error names it.
  max_bytes += kPrecisionBytes + 8 + family_elements(plan, Family::kW) * sizeof(uint16_t);
  return max_bytes;
}

// The frame of each state section (streamed: checked here, applied later): its element count is
// the task's and its length matches; records where its elements start and the payload's hash.
void check_state_sections(const FileReader& file, Parser& parser, const MemoryPlan& plan, Decoded* d) {
  for (Section s : d->sections) {
    if (!is_state_section(s)) continue;
    const SectionView v = parser.section(s, 0);
    const uint64_t want = section_elements(plan, s);
    uint64_t count = 0;
    uint8_t count_bytes[8];
    if (v.length < sizeof(count_bytes)) throw_format(parser.where(s) + "malformed payload (a field runs past the section's end)");
    file.read(v.offset, count_bytes, sizeof(count_bytes));
    Cursor c(count_bytes, sizeof(count_bytes), parser.where(s));
    count = c.u64();
    if (count != want) {
      c.fail("holds " + std::to_string(count) + " elements, the task's layout needs " + std::to_string(want));
    }
    if (v.length - 8 != want * element_bytes(plan, s)) c.fail("malformed payload (its length does not match its count)");
    d->section_data[static_cast<int>(s)] = v.offset;
    d->section_hash[static_cast<int>(s)] = v.payload_hash;
  }
}

// SCALARS: H hyperparameter groups' blocks of fp32 and fp64 slots (scalars.h), as many as the
// task has; with tensor_mask a block per tensor (plan.h), then the per-tensor step counts
// (`tensor_steps` of them, else 0). The step counts must agree with META's.
void decode_scalars(Parser& parser, const MemoryPlan& plan, uint64_t tensor_steps, Decoded* d) {
  const uint64_t hyper = static_cast<uint64_t>(plan.scalar_blocks());
  const uint64_t want32 = hyper * kNumStoredScalarF32, want64 = hyper * kNumScalarF64;
  const SectionView v = parser.section(Section::kScalars, 64 * 1024 + want32 * 4 + want64 * 8 + tensor_steps * 4);
  Cursor c(v.payload, v.length, parser.where(Section::kScalars));
  auto slots = [&](uint64_t want, const char* what) {
    const uint32_t n = c.u32();
    if (n != want) {
      c.fail("holds " + std::to_string(n) + " " + what + " slots, this build has " + std::to_string(want) +
             (hyper > 1 || n > want ? " (the task has " + std::to_string(hyper) +
                                          " hyperparameter groups: a block of slots per group)"
                                    : std::string()));
    }
  };
  slots(want32, "fp32");
  d->f32.resize(want32);
  c.raw(d->f32.data(), d->f32.size() * sizeof(float));
  slots(kNumScalarI32, "int32");
  d->i32.resize(kNumScalarI32);
  c.raw(d->i32.data(), d->i32.size() * sizeof(int32_t));
  slots(want64, "fp64");
  d->f64.resize(want64);
  c.raw(d->f64.data(), d->f64.size() * sizeof(double));
  if (tensor_steps != 0) {
    slots(tensor_steps, "per-tensor step");
    d->tensor_steps.resize(tensor_steps);
    c.raw(d->tensor_steps.data(), d->tensor_steps.size() * sizeof(int32_t));
    for (int32_t t : d->tensor_steps) {
      if (t < 0) c.fail("a per-tensor step count is negative (" + std::to_string(t) + ")");
    }
  }
  c.expect_end();
  if (d->i32[kStep] != d->info.step || d->i32[kSkippedSteps] != d->info.skipped) {
    c.fail("step counts (" + std::to_string(d->i32[kStep]) + ", " + std::to_string(d->i32[kSkippedSteps]) +
           ") disagree with section META (" + std::to_string(d->info.step) + ", " + std::to_string(d->info.skipped) + ")");
  }
  if (d->i32[kHasNonFinite] != 0 && d->i32[kHasNonFinite] != 1) {
    c.fail("non-finite flag " + std::to_string(d->i32[kHasNonFinite]) + " is neither 0 nor 1");
  }
}

// The first pass: every byte of the file validated against the task (its parameters, plan,
// options and group 0's configuration) and decoded; nothing in the task changes.
Decoded decode_checkpoint(const std::string& path, const FileReader& file, const std::vector<ParamSpec>& params,
                          const MemoryPlan& plan, const TaskOptions& options, const OptimizerConfig& config) {
  Parser parser(path, file);
  Decoded d;
  const uint32_t declared_sections = parser.header(&d.version);
  const bool file_copy = d.version == kFormatVersionModelCopy;
  {
    const SectionView v = parser.section(Section::kMeta, kMaxMetaBytes);
    Cursor c(v.payload, v.length, parser.where(Section::kMeta));
    decode_meta(c, &d.info);
    check_meta_matches(path, d.info, config, options.check_finite);
  }
  d.sections = sections_for(d.info.config, file_copy);
  if (declared_sections != d.sections.size()) {
    parser.fail("header", "declares " + std::to_string(declared_sections) + " sections, a checkpoint for " +
                              optimizer_kind_name(d.info.config.kind) + (file_copy ? " with a model copy" : "") +
                              " has " + std::to_string(d.sections.size()));
  }
  // The model copy's dtype and rounding key decide the compiled step and the bits of every later
  // copy: they must be the task's (a version-2 file has no copy).
  if (file_copy) {
    const SectionView v = parser.section(Section::kPrecision, kPrecisionBytes);
    Cursor c(v.payload, v.length, parser.where(Section::kPrecision));
    decode_precision(c, &d.precision);
  }
  check_precision(path, d.precision, options.precision);
  {
    const uint64_t layout_limit = 8 + params.size() * (4 + 4 + 4 + kMaxParamRank * 8 + kMaxParamNameBytes);
    const SectionView v = parser.section(Section::kLayout, layout_limit);
    Cursor c(v.payload, v.length, parser.where(Section::kLayout));
    check_layout(c, path, params);
  }
  check_state_sections(file, parser, plan, &d);
  decode_scalars(parser, plan, options.tensor_mask ? params.size() : 0, &d);
  parser.expect_end(Section::kScalars);
  return d;
}

// The second pass over the state sections, tensor by tensor in chunks (the host never holds more
// than one): write(section, tensor id, first byte of the tensor, data, bytes) applies a chunk.
// The payload is hashed again on the way: a file rewritten in place between the two passes is
// reported, and the task's state is then undefined (load a checkpoint again).
template <typename Write>
void stream_state_sections(const std::string& path, const FileReader& file, const Decoded& d, const MemoryPlan& plan,
                           size_t num_params, Write write) {
  std::vector<uint8_t> chunk;
  for (Section s : d.sections) {
    if (!is_state_section(s)) continue;
    XXH3_state_t again;
    XXH3_64bits_reset(&again);
    uint64_t pos = d.section_data[static_cast<int>(s)];
    uint8_t count_bytes[8];
    file.read(pos, count_bytes, sizeof(count_bytes));
    XXH3_64bits_update(&again, count_bytes, sizeof(count_bytes));
    pos += sizeof(count_bytes);
    for (size_t id = 0; id < num_params; ++id) {
      const uint64_t bytes = section_tensor_bytes(plan, s, id);
      for (uint64_t done = 0; done < bytes;) {
        const uint64_t n = std::min<uint64_t>(bytes - done, kStreamChunkBytes);
        chunk.resize(static_cast<size_t>(n));
        file.read(pos, chunk.data(), n);
        XXH3_64bits_update(&again, chunk.data(), n);
        write(s, id, done, chunk.data(), n);
        pos += n;
        done += n;
      }
    }
    if (XXH3_64bits_digest(&again) != d.section_hash[static_cast<int>(s)]) {
      throw_format("checkpoint " + path + ": section " + section_name(s) +
                   " changed while it was being loaded; the task's state is undefined: load a checkpoint again");
    }
  }
}

}  // namespace

void Task::load(const std::string& path) {
  require_compiled("load()");
  if (path.empty()) throw_invalid("load(): the checkpoint path is empty");
  const FileReader file(path, checkpoint_bytes_bound(params_, plan_, options_.tensor_mask));
  const Decoded d = decode_checkpoint(path, file, params_, plan_, options_, config());

  // ---- apply: the file is valid; stream each state section into the arena. Padding is zero in
  // every live task and is not touched. A file changed between the passes or a backend failure
  // part-way leaves the task's state undefined; an invalid file never changes anything. ----
  stream_state_sections(path, file, d, plan_, params_.size(),
                        [&](Section s, size_t id, uint64_t done, const uint8_t* data, uint64_t n) {
                          if (is_sliced_section(s)) {
                            // A sliced task (a rank of a sharded step) keeps the part inside its slice.
                            write_state_part(section_family(s), id, done / sizeof(float), n / sizeof(float),
                                             reinterpret_cast<const float*>(data));
                          } else {
                            backend_->upload(section_tensor_offset(plan_, s, id) + done, data, n);
                          }
                        });
  backend_->upload_rows(plan_.region(S_SCALAR_FP32).offset, kNumScalarF32 * sizeof(float), d.f32.data(),
                        kNumStoredScalarF32 * sizeof(float), d.f32.size() / kNumStoredScalarF32);
  backend_->upload(plan_.region(S_SCALAR_INT32).offset, d.i32.data(), d.i32.size() * sizeof(int32_t));
  backend_->upload(plan_.region(S_SCALAR_FP64).offset, d.f64.data(), d.f64.size() * sizeof(double));
  if (!d.tensor_steps.empty()) {
    backend_->upload(plan_.region(S_TENSOR_INT32).offset + d.tensor_steps.size() * sizeof(int32_t),
                     d.tensor_steps.data(), d.tensor_steps.size() * sizeof(int32_t));
    // The unmasked program may run again when every count is the task's (task.h).
    steps_equal_ = std::all_of(d.tensor_steps.begin(), d.tensor_steps.end(),
                               [&](int32_t t) { return t == d.i32[kStep]; });
  }
  // Hyperparameter slots are rewritten from the restored doubles by the same code that wrote
  // them before the save, so they come out with the same bits; the bias corrections, the step
  // counters and the non-finite flag are device-owned state and keep the file's values. META
  // holds group 0's configuration (maximize included): groups 1..H-1 keep the hyperparameters
  // and maximize flags this task has (set_group_hyper), only their device-owned slots come from
  // the file.
  groups_[0] = d.info.config;
  lrs_[0] = d.info.lr;
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
  parser.header(&info.version);
  const SectionView v = parser.section(Section::kMeta, kMaxMetaBytes);
  Cursor c(v.payload, v.length, parser.where(Section::kMeta));
  decode_meta(c, &info);
  // A version-3 file's PRECISION follows META: a resume takes the copy's dtype and key from it.
  if (info.version == kFormatVersionModelCopy) {
    const SectionView p = parser.section(Section::kPrecision, kPrecisionBytes);
    Cursor pc(p.payload, p.length, parser.where(Section::kPrecision));
    decode_precision(pc, &info.precision);
  }
  return info;
}

}  // namespace renaissance