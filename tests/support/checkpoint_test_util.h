// Shared fixtures of the checkpoint tests (test_checkpoint.cc: resume, backends, SIGKILL;
// test_checkpoint_integrity.cc: write errors, corruption, mismatches): small layouts, configs
// per kind, step runners with NaN injection, file helpers, a temporary folder, state
// comparison, and an independent reading of the file's sections.
#pragma once

#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/src/io/checkpoint_testing.h"
#include "renaissance/error.h"
#include "renaissance/scalars.h"
#include "renaissance/task.h"
#include "support/test_util.h"
#include "support/kind_columns.h"

namespace renaissance {
namespace checkpoint_test {

using testing_util::same_bits;



inline constexpr uint64_t kSeed = 0x5eed;
inline constexpr double kLossScale = 64.0;

inline constexpr OptimizerKind kAllKinds[] = {OptimizerKind::kSgd,  OptimizerKind::kSgdMomentum, OptimizerKind::kSgdNesterov,
                                   OptimizerKind::kAdam, OptimizerKind::kAdamW,       OptimizerKind::kLars,
                                   OptimizerKind::kLarsNesterov};

// A small model with every role, an odd size per role (so padding exists) and an empty tensor.
inline std::vector<ParamSpec> small_params() {
  return {{"conv1.weight", {8, 3, 3, 3}, Role::kFirstConv}, {"bn1.weight", {8}, Role::kBnWeight},
          {"bn1.bias", {8}, Role::kBnBias},                  {"layer1.conv.weight", {16, 8, 3, 3}, Role::kDeepConv},
          {"fc.weight", {10, 16}, Role::kFcWeight},          {"fc.bias", {10}, Role::kFcBias},
          {"unused", {0}, Role::kDeepConv}};
}

// The same roles, tiny: the corruption tests load one variant of its file per byte.
inline std::vector<ParamSpec> tiny_params() {
  return {{"conv1.weight", {2, 3, 3}, Role::kFirstConv}, {"bn1.weight", {4}, Role::kBnWeight},
          {"bn1.bias", {4}, Role::kBnBias},              {"layer1.conv.weight", {4, 5}, Role::kDeepConv},
          {"fc.weight", {3, 4}, Role::kFcWeight},        {"fc.bias", {3}, Role::kFcBias},
          {"unused", {0}, Role::kDeepConv}};
}

// Large enough that a save takes a few milliseconds, so SIGKILL lands inside it.
inline std::vector<ParamSpec> big_params() {
  return {{"w", {640, 512}, Role::kDeepConv}, {"b", {512}, Role::kBnBias}, {"fc", {100, 512}, Role::kFcWeight}};
}

inline OptimizerConfig config_for(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  const bool adam = kind == OptimizerKind::kAdam || kind == OptimizerKind::kAdamW;
  c.lr = adam ? 1e-3 : 0.05;
  c.weight_decay = 0.01;
  c.momentum = kind == OptimizerKind::kSgd ? 0.0 : 0.9;
  c.beta1 = 0.9;
  c.beta2 = 0.999;
  c.eps = 1e-8;
  c.trust_coefficient = 0.02;
  return testing_util::unread_columns_at_defaults(c);
}

// The same kind with different (valid) hyperparameters: what a resuming process might have
// configured. load() must replace all of them with the checkpoint's.
inline OptimizerConfig other_config_for(OptimizerKind kind) {
  OptimizerConfig c = config_for(kind);
  c.lr *= 3.0;
  c.weight_decay = 0.2;
  if (c.momentum > 0) c.momentum = 0.5;
  c.beta1 = 0.8;
  c.beta2 = 0.99;
  c.eps = 1e-6;
  c.trust_coefficient = 0.005;
  return testing_util::unread_columns_at_defaults(c);
}

inline double lr_at(const OptimizerConfig& c, int64_t step) { return c.lr * (1.0 + 0.5 * std::sin(0.37 * double(step))); }

inline std::unique_ptr<Task> make_task(const std::vector<ParamSpec>& params, const OptimizerConfig& config,
                                BackendKind backend, int threads = 0) {
  TaskOptions options;
  options.backend = backend;
  options.backend_options.threads = threads;
  auto task = std::make_unique<Task>(params, options);
  task->optimizer(config);
  task->compile();
  return task;
}

// Non-zero starting weights and a loss scale: the state a training run starts from.
inline std::unique_ptr<Task> start_task(const std::vector<ParamSpec>& params, OptimizerKind kind, BackendKind backend,
                                 int threads = 0) {
  auto task = make_task(params, config_for(kind), backend, threads);
  for (size_t id = 0; id < params.size(); ++id) {
    std::vector<float> w(static_cast<size_t>(params[id].numel()));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * std::cos(float(i) * 0.7f + float(id));
    task->set_weight(id, w.data());
  }
  task->set_loss_scale(kLossScale);
  return task;
}

// One training step s of the schedule every test follows: lr changes on every third step (so
// the step right after a resume sometimes runs on the restored lr alone), gradients are a pure
// function of (seed, s), and the steps in `nan_steps` carry one NaN.
inline void run_steps(Task& task, int64_t first, int64_t count, const std::set<int64_t>& nan_steps) {
  for (int64_t s = first; s < first + count; ++s) {
    if (s % 3 == 0) task.set_lr(lr_at(config_for(task.config().kind), s));
    task.synthesize_gradients(kSeed, static_cast<uint64_t>(s), static_cast<float>(0.1 * kLossScale));
    if (nan_steps.count(s)) {
      std::vector<float> g(static_cast<size_t>(task.param(0).numel()));
      task.read(Family::kG, 0, g.data());
      g[static_cast<size_t>(s) % g.size()] = std::nanf("");
      task.set_grad(0, g.data());
    }
    task.step();
  }
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A fresh folder per test, removed with its contents at the end.
// `in_memory` puts it on /dev/shm where there is one: the corruption tests rewrite a file
// thousands of times, and ext4 flushes a truncated-and-rewritten file on every close.
class TempDir {
 public:
  explicit TempDir(bool in_memory = false) {
    const char* base = std::getenv("TMPDIR");
    std::string root = base && *base ? base : "/tmp";
    if (in_memory && ::access("/dev/shm", W_OK) == 0) root = "/dev/shm";
    std::string pattern = root + "/rn-ckpt-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() { remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  static void remove_all(const std::string& dir) {
    for (const std::string& n : list_dir(dir)) {
      const std::string p = dir + "/" + n;
      struct stat st;
      if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        remove_all(p);
      } else {
        ::unlink(p.c_str());
      }
    }
    ::rmdir(dir.c_str());
  }

 private:
  std::string path_;
};

// Every byte of the backend's arena: "unchanged" below means all of these, G and scratch included.
inline std::vector<uint8_t> arena_bytes(Task& task) {
  std::vector<uint8_t> bytes(task.plan().arena_bytes());
  task.backend().download(0, bytes.data(), bytes.size());
  return bytes;
}

inline std::vector<float> family_data(Task& task, Family f, size_t id) {
  std::vector<float> v(f == Family::kN ? 1 : static_cast<size_t>(task.param(id).numel()));
  if (!v.empty()) task.read(f, id, v.data());
  return v;
}

inline std::vector<uint8_t> scalar_bytes(Task& task) {
  std::vector<uint8_t> out;
  for (Region r : {S_SCALAR_FP32, S_SCALAR_INT32, S_SCALAR_FP64}) {
    const RegionInfo& info = task.plan().region(r);
    std::vector<uint8_t> b(info.count * info.elem_size);
    task.backend().download(info.offset, b.data(), b.size());
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

// W, M, V, N bit patterns, every scalar slot, the host-side lr and loss scale, the fingerprint.
inline void expect_same_state(Task& a, Task& b) {
  ASSERT_EQ(a.num_params(), b.num_params());
  for (Family f : {Family::kW, Family::kM, Family::kV, Family::kN}) {
    ASSERT_EQ(a.plan().has_family(f), b.plan().has_family(f));
    if (!a.plan().has_family(f)) continue;
    for (size_t id = 0; id < a.num_params(); ++id) {
      EXPECT_TRUE(same_bits(family_data(a, f, id), family_data(b, f, id)))
          << "family " << family_name(f) << " tensor " << a.param(id).name;
    }
  }
  EXPECT_EQ(scalar_bytes(a), scalar_bytes(b)) << "scalar slots differ";
  EXPECT_EQ(a.step_count(), b.step_count());
  EXPECT_EQ(a.skipped_steps(), b.skipped_steps());
  EXPECT_EQ(a.last_step_skipped(), b.last_step_skipped());
  EXPECT_EQ(testing_util::float_bits(float(a.lr())), testing_util::float_bits(float(b.lr())));
  EXPECT_EQ(a.lr(), b.lr());
  EXPECT_EQ(a.loss_scale(), b.loss_scale());
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
}

// ---- the file's sections as the format describes them (an independent reading) ----
struct SectionRange {
  std::string name;
  size_t begin, end;  // [begin, end) in the file
};

inline std::vector<SectionRange> section_ranges(const std::vector<uint8_t>& file) {
  const std::map<std::string, std::string> names = {{"META", "META"}, {"LAYT", "LAYOUT"}, {"FAMW", "W"},
                                                    {"FAMM", "M"},    {"FAMV", "V"},      {"FAMN", "N"},
                                                    {"SCAL", "SCALARS"}};
  std::vector<SectionRange> out = {{"header", 0, 24}};
  size_t pos = 24;
  while (pos < file.size()) {
    const std::string tag(reinterpret_cast<const char*>(&file[pos]), 4);
    uint64_t length;
    std::memcpy(&length, &file[pos + 4], 8);
    out.push_back({names.at(tag), pos, pos + 12 + length + 8});
    pos += 12 + length + 8;
  }
  EXPECT_EQ(pos, file.size());
  return out;
}

inline std::string section_at(const std::vector<SectionRange>& ranges, size_t offset) {
  for (const SectionRange& r : ranges) {
    if (offset >= r.begin && offset < r.end) return r.name;
  }
  return "?";
}

// Expects `fn` to throw Error whose message contains `needle`; returns the message.
template <typename Fn>
std::string expect_error(Fn fn, const std::string& needle, ErrorKind kind) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what() << "\" lacks \"" << needle << "\"";
    EXPECT_EQ(static_cast<int>(e.kind()), static_cast<int>(kind)) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown; expected one saying \"" << needle << "\"";
  return "";
}

}  // namespace checkpoint_test
}  // namespace renaissance
