// libFuzzer target: the checkpoint loader (Task::load, runtime/src/checkpoint.cc) on arbitrary file
// bytes, against small fixed tasks, one per optimizer kind (the input's META kind picks the
// task, so a mutated checkpoint reaches the section checks of the right kind).
//
// Properties checked besides "no crash / no sanitizer report / only Error is thrown":
//   - a refused load leaves the task as it was (fingerprint of W, M, V and the step count, lr,
//     loss scale, hyperparameters, skipped steps);
//   - an accepted load gives a task that can step.
// Random bytes almost never carry valid XXH3 checksums, so every input is also loaded a second
// time with its header and section checksums recomputed: that reaches the payload decoding
// behind the checksums, which is where a bounds bug would be.
//
// RENAISSANCE_FUZZ_WRITE_SEEDS=DIR makes the target write a valid checkpoint of each task into
// DIR at start-up (how fuzz/corpus/fuzz_checkpoint/ was made) and exit.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "fuzz/fuzz_util.h"
#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/optimizer.h"
#include "renaissance/task.h"

namespace {

using namespace renaissance;

struct Fixture {
  OptimizerKind kind;
  std::unique_ptr<Task> task;
  std::vector<uint8_t> baseline;  // a valid checkpoint of the task's start-up state
  std::string baseline_fingerprint;
};

std::vector<ParamSpec> fixture_params() {
  // Every role once, small and with odd sizes so that padding exists between tensors.
  return {{"conv1.weight", {3, 2, 3, 3}, Role::kFirstConv}, {"bn1.weight", {3}, Role::kBnWeight},
          {"bn1.bias", {3}, Role::kBnBias},                 {"layer1.conv.weight", {5, 3, 1, 1}, Role::kDeepConv},
          {"fc.weight", {2, 5}, Role::kFcWeight},           {"fc.bias", {2}, Role::kFcBias}};
}

// The reference hyperparameters of the kind table, shared with the tests and conformance.
OptimizerConfig fixture_config(OptimizerKind kind) { return reference_config(kind); }

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<Fixture>& fixtures() {
  static std::vector<Fixture> all;
  return all;
}

renaissance_fuzz::MemFile& memfile() {
  static renaissance_fuzz::MemFile f;
  return f;
}

void build_fixtures() {
  char dir_template[] = "/tmp/renaissance-fuzz-ckpt-XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) std::abort();
  for (int k = 0; k < kNumOptimizerKinds; ++k) {
    Fixture f;
    f.kind = static_cast<OptimizerKind>(k);
    TaskOptions options;
    options.backend = BackendKind::kCpu;
    options.backend_options.threads = 1;  // the fuzzer runs one input at a time; no pool needed
    f.task = std::make_unique<Task>(fixture_params(), options);
    f.task->optimizer(fixture_config(f.kind));
    f.task->compile();
    // A few steps so that every family and scalar holds something other than zeros.
    for (uint64_t s = 0; s < 3; ++s) {
      f.task->synthesize_gradients(7, s, 1.0f);
      f.task->step();
    }
    const std::string path = std::string(dir) + "/" + optimizer_kind_name(f.kind) + ".ckpt";
    f.task->save(path);
    f.baseline = read_file(path);
    ::unlink(path.c_str());
    f.baseline_fingerprint = f.task->fingerprint();
    fixtures().push_back(std::move(f));
  }
  ::rmdir(dir);
}

// The task whose kind the META section names (u32 length + name at byte 36); AdamW otherwise.
Fixture& pick(const uint8_t* data, size_t size) {
  size_t chosen = static_cast<size_t>(OptimizerKind::kAdamW);
  if (size >= 40) {
    uint32_t len;
    std::memcpy(&len, data + 36, sizeof(len));
    if (len <= 32 && size >= 40 + len) {
      const std::string name(reinterpret_cast<const char*>(data + 40), len);
      OptimizerKind kind;
      if (parse_optimizer_kind(name, &kind)) chosen = static_cast<size_t>(kind);
    }
  }
  return fixtures()[chosen];
}

// Everything a refused load must leave unchanged.
struct Snapshot {
  std::string fingerprint;
  double lr, loss_scale;
  int64_t skipped;
  OptimizerConfig config;
  bool operator==(const Snapshot& o) const {
    const OptimizerConfig& a = config;
    const OptimizerConfig& b = o.config;
    for (const HyperparameterInfo& row : kHyperparameterTable) {
      if (hyper_value(a, row) != hyper_value(b, row)) return false;
    }
    return fingerprint == o.fingerprint && std::memcmp(&lr, &o.lr, sizeof(lr)) == 0 &&
           std::memcmp(&loss_scale, &o.loss_scale, sizeof(loss_scale)) == 0 && skipped == o.skipped &&
           a.kind == b.kind && a.weight_decay_mode == b.weight_decay_mode;
  }
};

Snapshot snapshot(Task& t) { return {t.fingerprint(), t.lr(), t.loss_scale(), t.skipped_steps(), t.config()}; }

void load_one(Fixture& f, const uint8_t* data, size_t size) {
  memfile().set(data, size);
  const Snapshot before = snapshot(*f.task);
  bool loaded = false;
  try {
    f.task->load(memfile().path());
    loaded = true;
  } catch (const Error&) {
    if (!(snapshot(*f.task) == before)) renaissance_fuzz::property_failed("a refused load changed the task");
  }
  if (!loaded) return;
  // Accepted: the state must be usable. Then put the baseline back for the next input.
  f.task->synthesize_gradients(11, 0, 1.0f);
  f.task->step();
  memfile().set(f.baseline.data(), f.baseline.size());
  f.task->load(memfile().path());
  if (f.task->fingerprint() != f.baseline_fingerprint) renaissance_fuzz::property_failed("baseline did not restore");
}

// Recomputes the header checksum and every section checksum that the framing lets it find.
std::vector<uint8_t> fix_checksums(const uint8_t* data, size_t size) {
  std::vector<uint8_t> out(data, data + size);
  if (size < 24) return out;
  const uint64_t header_sum = XXH3_64bits(out.data(), 16);
  std::memcpy(out.data() + 16, &header_sum, sizeof(header_sum));
  size_t pos = 24;
  while (size - pos >= 12 + 8) {
    uint64_t length;
    std::memcpy(&length, out.data() + pos + 4, sizeof(length));
    if (length > size - pos - 12 - 8) break;
    const uint64_t sum = XXH3_64bits(out.data() + pos, 12 + length);
    std::memcpy(out.data() + pos + 12 + length, &sum, sizeof(sum));
    pos += 12 + length + 8;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  build_fixtures();
  if (const char* seeds = std::getenv("RENAISSANCE_FUZZ_WRITE_SEEDS")) {
    for (const Fixture& f : fixtures()) {
      const std::string path = std::string(seeds) + "/" + optimizer_kind_name(f.kind) + ".ckpt";
      std::ofstream out(path, std::ios::binary);
      out.write(reinterpret_cast<const char*>(f.baseline.data()), static_cast<std::streamsize>(f.baseline.size()));
      if (!out) std::abort();
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& f = pick(data, size);
  load_one(f, data, size);
  const std::vector<uint8_t> fixed = fix_checksums(data, size);
  if (size > 0 && std::memcmp(fixed.data(), data, size) != 0) load_one(f, fixed.data(), fixed.size());
  return 0;
}
