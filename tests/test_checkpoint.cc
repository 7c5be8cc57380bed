// Checkpoints (core/src/checkpoint.cc), one test per guarantee of issue 7: resuming in a new
// process continues bit for bit (NaN steps on either side of the save included), SIGKILL during
// a save never leaves a partial file under the final name, write errors leave the old file and
// no temporary behind, corrupt or truncated files are refused naming the section, mismatched
// layouts and kinds are refused saying which, and checkpoints move between backends.
//
// "New process" is a fork + exec of this test binary: the child starts from nothing but the
// checkpoint file, so any state the file fails to carry shows up as a bit difference.
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

#include "core/src/checkpoint_testing.h"
#include "renaissance/error.h"
#include "renaissance/scalars.h"
#include "renaissance/task.h"
#include "tests/test_util.h"

extern char** environ;

namespace renaissance {
namespace {

using testing_util::same_bits;

constexpr uint64_t kSeed = 0x5eed;
constexpr double kLossScale = 64.0;

const OptimizerKind kAllKinds[] = {OptimizerKind::kSgd,  OptimizerKind::kSgdMomentum, OptimizerKind::kSgdNesterov,
                                   OptimizerKind::kAdam, OptimizerKind::kAdamW,       OptimizerKind::kLars,
                                   OptimizerKind::kLarsNesterov};

// A small model with every role, an odd size per role (so padding exists) and an empty tensor.
std::vector<ParamSpec> small_params() {
  return {{"conv1.weight", {8, 3, 3, 3}, Role::kFirstConv}, {"bn1.weight", {8}, Role::kBnWeight},
          {"bn1.bias", {8}, Role::kBnBias},                  {"layer1.conv.weight", {16, 8, 3, 3}, Role::kDeepConv},
          {"fc.weight", {10, 16}, Role::kFcWeight},          {"fc.bias", {10}, Role::kFcBias},
          {"unused", {0}, Role::kDeepConv}};
}

// The same roles, tiny: the corruption tests load one variant of its file per byte.
std::vector<ParamSpec> tiny_params() {
  return {{"conv1.weight", {2, 3, 3}, Role::kFirstConv}, {"bn1.weight", {4}, Role::kBnWeight},
          {"bn1.bias", {4}, Role::kBnBias},              {"layer1.conv.weight", {4, 5}, Role::kDeepConv},
          {"fc.weight", {3, 4}, Role::kFcWeight},        {"fc.bias", {3}, Role::kFcBias},
          {"unused", {0}, Role::kDeepConv}};
}

// Large enough that a save takes a few milliseconds, so SIGKILL lands inside it.
std::vector<ParamSpec> big_params() {
  return {{"w", {640, 512}, Role::kDeepConv}, {"b", {512}, Role::kBnBias}, {"fc", {100, 512}, Role::kFcWeight}};
}

OptimizerConfig config_for(OptimizerKind kind) {
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
  return c;
}

// The same kind with different (valid) hyperparameters: what a resuming process might have
// configured. load() must replace all of them with the checkpoint's.
OptimizerConfig other_config_for(OptimizerKind kind) {
  OptimizerConfig c = config_for(kind);
  c.lr *= 3.0;
  c.weight_decay = 0.2;
  if (c.momentum > 0) c.momentum = 0.5;
  c.beta1 = 0.8;
  c.beta2 = 0.99;
  c.eps = 1e-6;
  c.trust_coefficient = 0.005;
  return c;
}

double lr_at(const OptimizerConfig& c, int64_t step) { return c.lr * (1.0 + 0.5 * std::sin(0.37 * double(step))); }

std::unique_ptr<Task> make_task(const std::vector<ParamSpec>& params, const OptimizerConfig& config,
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
std::unique_ptr<Task> start_task(const std::vector<ParamSpec>& params, OptimizerKind kind, BackendKind backend,
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
void run_steps(Task& task, int64_t first, int64_t count, const std::set<int64_t>& nan_steps) {
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

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> list_dir(const std::string& dir) {
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
std::vector<uint8_t> arena_bytes(Task& task) {
  std::vector<uint8_t> bytes(task.plan().arena_bytes());
  task.backend().download(0, bytes.data(), bytes.size());
  return bytes;
}

std::vector<float> family_data(Task& task, Family f, size_t id) {
  std::vector<float> v(f == Family::kN ? 1 : static_cast<size_t>(task.param(id).numel()));
  if (!v.empty()) task.read(f, id, v.data());
  return v;
}

std::vector<uint8_t> scalar_bytes(Task& task) {
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
void expect_same_state(Task& a, Task& b) {
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

// ---- child processes: this binary, re-executed with RN_CKPT_CHILD set ----

std::set<int64_t> parse_steps(const char* text) {
  std::set<int64_t> steps;
  std::stringstream ss(text ? text : "");
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) steps.insert(std::stoll(item));
  }
  return steps;
}

std::string join_steps(const std::set<int64_t>& steps) {
  std::string s;
  for (int64_t x : steps) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v) throw std::runtime_error(std::string("child: ") + name + " is not set");
  return std::atoi(v);
}

// "continue": a fresh task (different hyperparameters, zero weights) loads RN_CKPT_IN, runs
// RN_CKPT_COUNT steps from RN_CKPT_FIRST and saves RN_CKPT_OUT, with its fingerprint beside it.
int child_continue() {
  const auto kind = static_cast<OptimizerKind>(env_int("RN_CKPT_KIND"));
  const auto backend = static_cast<BackendKind>(env_int("RN_CKPT_BACKEND"));
  auto task = make_task(small_params(), other_config_for(kind), backend);
  task->load(std::getenv("RN_CKPT_IN"));
  run_steps(*task, env_int("RN_CKPT_FIRST"), env_int("RN_CKPT_COUNT"), parse_steps(std::getenv("RN_CKPT_NAN")));
  const std::string out = std::getenv("RN_CKPT_OUT");
  task->save(out);
  std::ofstream(out + ".fingerprint") << task->fingerprint();
  return 0;
}

// "saver": steps and saves RN_CKPT_OUT in a loop until killed; one byte on fd RN_CKPT_READY_FD
// after the first save completes, so the parent's kill always lands inside the loop.
int child_saver() {
  const auto kind = static_cast<OptimizerKind>(env_int("RN_CKPT_KIND"));
  const int ready_fd = env_int("RN_CKPT_READY_FD");
  auto task = start_task(big_params(), kind, BackendKind::kCpu, 1);
  const std::string out = std::getenv("RN_CKPT_OUT");
  for (int64_t s = 0; s < 100000; ++s) {
    run_steps(*task, s, 1, {});
    task->save(out);
    if (s == 0) {
      const char byte = 1;
      if (::write(ready_fd, &byte, 1) != 1) return 3;
      ::close(ready_fd);
    }
  }
  return 0;
}

// Runs the child mode before any test when RN_CKPT_CHILD is set (after static initialisation,
// unlike a static constructor would), then leaves without running tests.
class ChildMode : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* mode = std::getenv("RN_CKPT_CHILD");
    if (!mode) return;
    int rc = 2;
    try {
      if (std::strcmp(mode, "continue") == 0) rc = child_continue();
      if (std::strcmp(mode, "saver") == 0) rc = child_saver();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "checkpoint child (%s): %s\n", mode, e.what());
      rc = 1;
    }
    std::fflush(nullptr);
    ::_exit(rc);
  }
};
::testing::Environment* const g_child_mode = ::testing::AddGlobalTestEnvironment(new ChildMode);

std::string self_exe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw std::runtime_error("readlink /proc/self/exe failed");
  return std::string(buf, static_cast<size_t>(n));
}

// fork + exec of this binary in child mode. The filter selects this file's format tests: gtest
// only sets up environments when some test is selected, and the child exits before running any.
// `keep_fd` (if >= 0) is passed on as fd 100.
pid_t spawn_child(const std::map<std::string, std::string>& env, int keep_fd = -1) {
  std::vector<std::string> strings;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "RN_CKPT_", 8) != 0 && std::strncmp(*e, "GTEST_", 6) != 0) strings.push_back(*e);
  }
  for (const auto& kv : env) strings.push_back(kv.first + "=" + kv.second);
  std::vector<char*> envp;
  for (std::string& s : strings) envp.push_back(&s[0]);
  envp.push_back(nullptr);
  std::string exe = self_exe();
  std::string filter = "--gtest_filter=CheckpointFormat.*";
  std::vector<char*> argv = {&exe[0], &filter[0], nullptr};
  // The child's gtest banner would only clutter the log; its stderr (errors) stays.
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    if (keep_fd >= 0 && ::dup2(keep_fd, 100) < 0) ::_exit(126);
    if (devnull >= 0 && ::dup2(devnull, 1) < 0) ::_exit(126);
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  if (devnull >= 0) ::close(devnull);
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

// ---- the file's sections as the format describes them (an independent reading) ----
struct SectionRange {
  std::string name;
  size_t begin, end;  // [begin, end) in the file
};

std::vector<SectionRange> section_ranges(const std::vector<uint8_t>& file) {
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

std::string section_at(const std::vector<SectionRange>& ranges, size_t offset) {
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

// ===================================================================================
// 1. N steps, save, load in a new process, M more steps == N+M steps, bit for bit.

enum class NanAt { kNowhere, kBeforeSave, kAfterSave };
const char* nan_at_name(NanAt at) {
  const char* names[] = {"clean", "nan_before_save", "nan_after_save"};
  return names[static_cast<int>(at)];
}

// Parameters are structs with operator<<, so ctest lists them by name rather than as bytes.
struct ResumeParam {
  BackendKind backend;
  OptimizerKind kind;
  NanAt nan_at;
};
std::ostream& operator<<(std::ostream& os, const ResumeParam& p) {
  return os << backend_kind_name(p.backend) << "_" << optimizer_kind_name(p.kind) << "_" << nan_at_name(p.nan_at);
}

class CheckpointResume : public ::testing::TestWithParam<ResumeParam> {};

TEST_P(CheckpointResume, NewProcessContinuesBitForBit) {
  const auto [backend, kind, nan_at] = GetParam();
  RN_SKIP_IF_UNAVAILABLE(backend);
  const int64_t n = 10, m = 8;  // step 10 does not set lr: it runs on the restored one
  std::set<int64_t> nan_steps = {4};
  if (nan_at == NanAt::kBeforeSave) nan_steps.insert(n - 1);  // the saved state has has_nan = 1
  if (nan_at == NanAt::kAfterSave) nan_steps.insert(n);       // the first resumed step is skipped
  TempDir dir;

  auto first = start_task(small_params(), kind, backend);
  run_steps(*first, 0, n, nan_steps);
  first->save(dir.file("at10.ckpt"));

  const pid_t pid = spawn_child({{"RN_CKPT_CHILD", "continue"},
                                 {"RN_CKPT_KIND", std::to_string(static_cast<int>(kind))},
                                 {"RN_CKPT_BACKEND", std::to_string(static_cast<int>(backend))},
                                 {"RN_CKPT_IN", dir.file("at10.ckpt")},
                                 {"RN_CKPT_OUT", dir.file("resumed.ckpt")},
                                 {"RN_CKPT_FIRST", std::to_string(n)},
                                 {"RN_CKPT_COUNT", std::to_string(m)},
                                 {"RN_CKPT_NAN", join_steps(nan_steps)}});
  ASSERT_EQ(wait_child(pid), 0) << "the resuming child failed (its stderr is above)";

  auto straight = start_task(small_params(), kind, backend);
  run_steps(*straight, 0, n + m, nan_steps);
  EXPECT_EQ(straight->step_count(), n + m - static_cast<int64_t>(nan_steps.size()));

  std::string child_fp;
  std::ifstream(dir.file("resumed.ckpt.fingerprint")) >> child_fp;
  EXPECT_EQ(child_fp, straight->fingerprint());

  auto resumed = make_task(small_params(), config_for(kind), backend);
  resumed->load(dir.file("resumed.ckpt"));
  expect_same_state(*straight, *resumed);

  // The format is deterministic: the same state gives the same file, byte for byte.
  straight->save(dir.file("straight.ckpt"));
  EXPECT_TRUE(read_file(dir.file("straight.ckpt")) == read_file(dir.file("resumed.ckpt")));
}

std::vector<ResumeParam> resume_params() {
  std::vector<ResumeParam> out;
  for (BackendKind b : testing_util::backends_under_test()) {
    for (OptimizerKind k : kAllKinds) {
      for (NanAt at : {NanAt::kNowhere, NanAt::kBeforeSave, NanAt::kAfterSave}) out.push_back({b, k, at});
    }
  }
  return out;
}

std::string resume_name(const ::testing::TestParamInfo<ResumeParam>& info) {
  std::ostringstream os;
  os << info.param;
  return os.str();
}

INSTANTIATE_TEST_SUITE_P(AllKinds, CheckpointResume, ::testing::ValuesIn(resume_params()), resume_name);

// load() restores the host-side lr and loss scale and the configured hyperparameters too.
TEST(CheckpointFormat, LoadRestoresHyperparametersAndHostScalars) {
  TempDir dir;
  auto a = start_task(small_params(), OptimizerKind::kAdamW, BackendKind::kCpu);
  run_steps(*a, 0, 5, {});
  a->set_lr(0.00123);
  a->set_loss_scale(512.0);
  a->save(dir.file("a.ckpt"));
  auto b = make_task(small_params(), other_config_for(OptimizerKind::kAdamW), BackendKind::kCpu);
  b->load(dir.file("a.ckpt"));
  EXPECT_EQ(b->lr(), 0.00123);
  EXPECT_EQ(b->loss_scale(), 512.0);
  EXPECT_EQ(b->config().beta1, a->config().beta1);
  EXPECT_EQ(b->config().beta2, a->config().beta2);
  EXPECT_EQ(b->config().eps, a->config().eps);
  EXPECT_EQ(b->config().weight_decay, a->config().weight_decay);
  expect_same_state(*a, *b);
}

// ===================================================================================
// 2. A checkpoint written by one backend loads on another and continues bit for bit.

struct CrossParam {
  BackendKind from, to;
};
std::ostream& operator<<(std::ostream& os, const CrossParam& p) {
  return os << backend_kind_name(p.from) << "_to_" << backend_kind_name(p.to);
}
class CheckpointAcrossBackends : public ::testing::TestWithParam<CrossParam> {};

TEST_P(CheckpointAcrossBackends, ContinuesBitForBit) {
  const auto [from, to] = GetParam();
  RN_SKIP_IF_UNAVAILABLE(from);
  RN_SKIP_IF_UNAVAILABLE(to);
  for (OptimizerKind kind : kAllKinds) {
    SCOPED_TRACE(optimizer_kind_name(kind));
    TempDir dir;
    const std::set<int64_t> nan_steps = {3, 9};
    // Different thread counts on each side: the CPU-to-CPU case still moves between executors.
    auto writer = start_task(small_params(), kind, from, 1);
    run_steps(*writer, 0, 7, nan_steps);
    writer->save(dir.file("x.ckpt"));
    auto reader = make_task(small_params(), other_config_for(kind), to, 2);
    reader->load(dir.file("x.ckpt"));
    run_steps(*reader, 7, 6, nan_steps);
    run_steps(*writer, 7, 6, nan_steps);
    expect_same_state(*writer, *reader);
  }
}

std::vector<CrossParam> cross_params() {
  // CUDA pairs are always listed: they skip, with the reason, where there is no CUDA device.
  return {{BackendKind::kCpu, BackendKind::kCpu},
          {BackendKind::kCpu, BackendKind::kCuda},
          {BackendKind::kCuda, BackendKind::kCpu},
          {BackendKind::kCuda, BackendKind::kCuda}};
}

std::string cross_name(const ::testing::TestParamInfo<CrossParam>& info) {
  std::ostringstream os;
  os << info.param;
  return os.str();
}

INSTANTIATE_TEST_SUITE_P(Pairs, CheckpointAcrossBackends, ::testing::ValuesIn(cross_params()), cross_name);

// ===================================================================================
// 3. SIGKILL at random points during save: the final name always holds a whole checkpoint.

TEST(CheckpointCrash, SigkillDuringSaveNeverLeavesAPartialFile) {
  TempDir dir;
  const std::string path = dir.file("run.ckpt");
  const OptimizerKind kind = OptimizerKind::kAdam;
  // The previous checkpoint: the state after 0 steps.
  start_task(big_params(), kind, BackendKind::kCpu, 1)->save(path);

  // Reference fingerprints by applied step count, grown on demand.
  auto reference = start_task(big_params(), kind, BackendKind::kCpu, 1);
  std::vector<std::string> fingerprints = {reference->fingerprint()};
  auto fingerprint_at = [&](int64_t steps) {
    while (static_cast<int64_t>(fingerprints.size()) <= steps) {
      run_steps(*reference, static_cast<int64_t>(fingerprints.size()) - 1, 1, {});
      fingerprints.push_back(reference->fingerprint());
    }
    return fingerprints[static_cast<size_t>(steps)];
  };

  auto verifier = make_task(big_params(), config_for(kind), BackendKind::kCpu, 1);
  std::mt19937 rng(12345);
  const int kKills = 50;
  int mid_save = 0;  // kills that left a temporary file: proof that they landed inside a save
  int64_t max_steps = 0;
  for (int k = 0; k < kKills; ++k) {
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    const pid_t pid = spawn_child({{"RN_CKPT_CHILD", "saver"},
                                   {"RN_CKPT_KIND", std::to_string(static_cast<int>(kind))},
                                   {"RN_CKPT_OUT", path},
                                   {"RN_CKPT_READY_FD", "100"}},
                                  fds[1]);
    ::close(fds[1]);
    char byte = 0;
    const ssize_t got = ::read(fds[0], &byte, 1);
    ::close(fds[0]);
    if (got == 1) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
    ::kill(pid, SIGKILL);
    const int rc = wait_child(pid);
    ASSERT_EQ(got, 1) << "the saving child died before its first save (exit " << rc << ")";
    ASSERT_EQ(rc, 128 + SIGKILL);

    std::vector<std::string> names = list_dir(dir.path());
    for (const std::string& n : names) {
      if (n != "run.ckpt") {
        EXPECT_EQ(n.rfind(".run.ckpt.tmp.", 0), 0u) << "unexpected file " << n;
        ++mid_save;
        ::unlink(dir.file(n).c_str());
      }
    }
    try {
      verifier->load(path);
    } catch (const Error& e) {
      FAIL() << "after kill " << k << " the checkpoint does not load: " << e.what();
    }
    const int64_t steps = verifier->step_count();
    max_steps = std::max(max_steps, steps);
    EXPECT_EQ(verifier->fingerprint(), fingerprint_at(steps)) << "after kill " << k << " at step " << steps;
  }
  std::printf("[          ] %d kills, %d landed while a temporary file existed, up to %lld saves per child\n",
              kKills, mid_save, static_cast<long long>(max_steps));
  EXPECT_GT(mid_save, 0) << "no kill landed inside a save: the test did not exercise the window";
}

// ===================================================================================
// 4. Write errors: an error naming the path, the old checkpoint intact, no temporary left.

class FaultOff {
 public:
  ~FaultOff() { checkpoint_testing::inject_fault(0, 0); }
};

TEST(CheckpointWriteError, EveryFailingOperationLeavesTheOldCheckpoint) {
  FaultOff off;
  TempDir dir;
  const std::string path = dir.file("model.ckpt");
  auto task = start_task(small_params(), OptimizerKind::kLars, BackendKind::kCpu);
  run_steps(*task, 0, 3, {});
  task->save(path);
  const int operations = checkpoint_testing::last_save_operations();
  const int rename_op = checkpoint_testing::last_save_rename_operation();
  ASSERT_GE(operations, 7);  // create, >= 1 write, fsync, close, rename, open folder, fsync folder
  ASSERT_EQ(rename_op, operations - 2);
  const std::vector<uint8_t> old_bytes = read_file(path);
  run_steps(*task, 3, 1, {});

  for (int op = 1; op <= operations; ++op) {
    SCOPED_TRACE("failing operation " + std::to_string(op) + " of " + std::to_string(operations));
    checkpoint_testing::inject_fault(op, ENOSPC);
    const std::string message = expect_error([&] { task->save(path); }, path, ErrorKind::kIo);
    EXPECT_NE(message.find(std::strerror(ENOSPC)), std::string::npos) << message;
    EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"model.ckpt"}) << "a temporary file was left";
    if (op <= rename_op) {
      EXPECT_TRUE(read_file(path) == old_bytes) << "the old checkpoint changed";
    } else {
      // Failing after the rename: the new checkpoint is complete under the final name.
      auto check = make_task(small_params(), config_for(OptimizerKind::kLars), BackendKind::kCpu);
      check->load(path);
      EXPECT_EQ(check->fingerprint(), task->fingerprint());
      write_file(path, old_bytes);
    }
  }
  checkpoint_testing::inject_fault(0, 0);
  task->save(path);  // and the next save works
  EXPECT_EQ(checkpoint_testing::last_save_operations(), operations);
}

TEST(CheckpointWriteError, FullTmpfsLeavesTheOldCheckpoint) {
  TempDir dir;
  const std::string mnt = dir.file("small-fs");
  ASSERT_EQ(::mkdir(mnt.c_str(), 0700), 0);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno)
                 << "); the injected-fault test covers write errors";
  }
  struct Unmount {
    std::string dir;
    ~Unmount() {
      for (const std::string& n : list_dir(dir)) ::unlink((dir + "/" + n).c_str());
      ::umount2(dir.c_str(), MNT_DETACH);
    }
  } unmount{mnt};

  const std::string path = mnt + "/model.ckpt";
  auto task = start_task(small_params(), OptimizerKind::kAdam, BackendKind::kCpu);
  run_steps(*task, 0, 2, {});
  task->save(path);
  const std::vector<uint8_t> old_bytes = read_file(path);

  // Fill the file system to the last byte.
  {
    const int fd = ::open((mnt + "/filler").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    std::vector<char> chunk(4096, 'x');
    while (::write(fd, chunk.data(), chunk.size()) > 0) {
    }
    while (::write(fd, chunk.data(), 1) > 0) {
    }
    EXPECT_EQ(errno, ENOSPC);
    ::close(fd);
  }
  run_steps(*task, 2, 1, {});
  const std::string message = expect_error([&] { task->save(path); }, path, ErrorKind::kIo);
  EXPECT_NE(message.find(std::strerror(ENOSPC)), std::string::npos) << message;
  EXPECT_TRUE(read_file(path) == old_bytes);
  EXPECT_EQ(list_dir(mnt), (std::vector<std::string>{"filler", "model.ckpt"}));

  ::unlink((mnt + "/filler").c_str());
  task->save(path);  // room again: the save goes through
  auto check = make_task(small_params(), config_for(OptimizerKind::kAdam), BackendKind::kCpu);
  check->load(path);
  EXPECT_EQ(check->fingerprint(), task->fingerprint());
}

// ===================================================================================
// 5. Truncated and corrupt files are refused naming the section, leaving the task as it was.

struct KindParam {
  OptimizerKind kind;
};
std::ostream& operator<<(std::ostream& os, const KindParam& p) { return os << optimizer_kind_name(p.kind); }

class CheckpointCorruption : public ::testing::TestWithParam<KindParam> {};

// Loads `bytes` (written to `path`) into `task`: it must fail naming `section`, and leave every
// byte of the arena and the host-side scalars unchanged.
void expect_refused(Task& task, const std::string& path, const std::vector<uint8_t>& bytes, const std::string& section,
                    const std::vector<uint8_t>& arena_before, const std::string& what) {
  write_file(path, bytes);
  const double lr = task.lr(), scale = task.loss_scale();
  try {
    task.load(path);
    ADD_FAILURE() << what << ": accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find("section " + section + ":") == std::string::npos) {
      ADD_FAILURE() << what << ": the error does not name section " << section << ": " << msg;
    }
  }
  if (arena_bytes(task) != arena_before || task.lr() != lr || task.loss_scale() != scale) {
    ADD_FAILURE() << what << ": the failed load changed the task";
  }
}

TEST_P(CheckpointCorruption, TruncatedAtEveryLengthIsRefused) {
  TempDir dir(/*in_memory=*/true);
  auto source = start_task(tiny_params(), GetParam().kind, BackendKind::kCpu);
  run_steps(*source, 0, 4, {});
  source->save(dir.file("good.ckpt"));
  const std::vector<uint8_t> good = read_file(dir.file("good.ckpt"));
  const std::vector<SectionRange> ranges = section_ranges(good);

  // The victim has its own, different state, which must survive every failed load.
  auto victim = start_task(tiny_params(), GetParam().kind, BackendKind::kCpu);
  run_steps(*victim, 100, 2, {});
  const std::vector<uint8_t> before = arena_bytes(*victim);
  for (size_t len = 0; len < good.size(); ++len) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    // The first missing byte's section is the one that is cut (or missing).
    expect_refused(*victim, dir.file("cut.ckpt"), cut, section_at(ranges, len), before,
                   "truncated to " + std::to_string(len) + " bytes");
  }
  // One byte too many is refused as well.
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  write_file(dir.file("long.ckpt"), longer);
  expect_error([&] { victim->load(dir.file("long.ckpt")); }, "after section SCALARS", ErrorKind::kFormat);
  victim->load(dir.file("good.ckpt"));
  expect_same_state(*source, *victim);
}

TEST_P(CheckpointCorruption, EverySingleBitFlipIsRefusedNamingTheSection) {
  TempDir dir(/*in_memory=*/true);
  auto source = start_task(tiny_params(), GetParam().kind, BackendKind::kCpu);
  run_steps(*source, 0, 4, {2});
  source->save(dir.file("good.ckpt"));
  const std::vector<uint8_t> good = read_file(dir.file("good.ckpt"));
  const std::vector<SectionRange> ranges = section_ranges(good);
  std::set<std::string> covered;

  auto victim = start_task(tiny_params(), GetParam().kind, BackendKind::kCpu);
  const std::vector<uint8_t> before = arena_bytes(*victim);
  for (size_t offset = 0; offset < good.size(); ++offset) {
    // Every byte; all eight bits in the small header and frames, one (rotating) bit elsewhere.
    const std::string section = section_at(ranges, offset);
    bool frame = section == "header";
    for (const SectionRange& r : ranges) frame |= offset >= r.begin && offset < r.begin + 12;
    for (int bit = 0; bit < 8; ++bit) {
      if (!frame && bit != static_cast<int>(offset % 8)) continue;
      std::vector<uint8_t> bad = good;
      bad[offset] ^= static_cast<uint8_t>(1u << bit);
      expect_refused(*victim, dir.file("bad.ckpt"), bad, section, before,
                     "bit " + std::to_string(bit) + " of byte " + std::to_string(offset) + " flipped");
    }
    covered.insert(section);
  }
  std::set<std::string> want = {"header", "META", "LAYOUT", "W", "SCALARS"};
  const PlanConfig need = plan_config_from_optimizer(GetParam().kind);
  if (need.has_m) want.insert("M");
  if (need.has_v) want.insert("V");
  if (need.has_n) want.insert("N");
  EXPECT_EQ(covered, want);
}

INSTANTIATE_TEST_SUITE_P(Kinds, CheckpointCorruption,
                         ::testing::Values(KindParam{OptimizerKind::kSgd}, KindParam{OptimizerKind::kAdam},
                                           KindParam{OptimizerKind::kLars}),
                         [](const ::testing::TestParamInfo<KindParam>& i) {
                           return std::string(optimizer_kind_name(i.param.kind));
                         });

// ===================================================================================
// 6. Checkpoints of another layout or kind are refused with a message saying which.

TEST(CheckpointMismatch, OtherOptimizerKindIsRefused) {
  TempDir dir;
  start_task(small_params(), OptimizerKind::kAdam, BackendKind::kCpu)->save(dir.file("adam.ckpt"));
  auto task = start_task(small_params(), OptimizerKind::kAdamW, BackendKind::kCpu);
  run_steps(*task, 0, 2, {});
  const std::vector<uint8_t> before = arena_bytes(*task);
  expect_error([&] { task->load(dir.file("adam.ckpt")); }, "checkpoint is for optimizer adam, task uses adamw",
               ErrorKind::kInvalidArgument);
  EXPECT_TRUE(arena_bytes(*task) == before);

  // SGD with decoupled decay vs L2: the same kind, another compiled step.
  OptimizerConfig l2 = config_for(OptimizerKind::kSgdMomentum);
  l2.weight_decay_mode = WeightDecayMode::kL2;
  make_task(small_params(), l2, BackendKind::kCpu)->save(dir.file("l2.ckpt"));
  auto decoupled = make_task(small_params(), config_for(OptimizerKind::kSgdMomentum), BackendKind::kCpu);
  expect_error([&] { decoupled->load(dir.file("l2.ckpt")); },
               "checkpoint uses weight decay mode l2, task uses decoupled", ErrorKind::kInvalidArgument);
}

TEST(CheckpointMismatch, OtherLayoutIsRefusedSayingWhere) {
  TempDir dir;
  const OptimizerKind kind = OptimizerKind::kSgdMomentum;
  std::vector<ParamSpec> wide = small_params();
  wide[4].shape = {10, 32};
  start_task(wide, kind, BackendKind::kCpu)->save(dir.file("wide.ckpt"));
  auto task = start_task(small_params(), kind, BackendKind::kCpu);
  const std::vector<uint8_t> before = arena_bytes(*task);
  expect_error([&] { task->load(dir.file("wide.ckpt")); },
               "checkpoint layout differs from the task's at parameter 4 'fc.weight': shape [10,32] (checkpoint) vs "
               "[10,16] (task)",
               ErrorKind::kInvalidArgument);

  std::vector<ParamSpec> renamed = small_params();
  renamed[1].name = "bn0.weight";
  start_task(renamed, kind, BackendKind::kCpu)->save(dir.file("renamed.ckpt"));
  expect_error([&] { task->load(dir.file("renamed.ckpt")); },
               "at parameter 1: name 'bn0.weight' (checkpoint) vs 'bn1.weight' (task)", ErrorKind::kInvalidArgument);

  std::vector<ParamSpec> recast = small_params();
  recast[3].role = Role::kFirstConv;
  start_task(recast, kind, BackendKind::kCpu)->save(dir.file("recast.ckpt"));
  expect_error([&] { task->load(dir.file("recast.ckpt")); },
               "at parameter 3 'layer1.conv.weight': role first_conv (checkpoint) vs deep_conv (task)",
               ErrorKind::kInvalidArgument);

  std::vector<ParamSpec> shorter = small_params();
  shorter.pop_back();
  start_task(shorter, kind, BackendKind::kCpu)->save(dir.file("shorter.ckpt"));
  expect_error([&] { task->load(dir.file("shorter.ckpt")); }, "6 parameters (checkpoint) vs 7 (task)",
               ErrorKind::kInvalidArgument);
  EXPECT_TRUE(arena_bytes(*task) == before);
}

TEST(CheckpointFormat, MissingFileIsAnIoError) {
  TempDir dir;
  auto task = start_task(small_params(), OptimizerKind::kSgd, BackendKind::kCpu);
  expect_error([&] { task->load(dir.file("nope.ckpt")); }, dir.file("nope.ckpt"), ErrorKind::kIo);
  expect_error([&] { task->load(dir.path()); }, "not a regular file", ErrorKind::kIo);
  // Saving onto a folder fails at the rename and leaves no temporary behind.
  ASSERT_EQ(::mkdir(dir.file("sub").c_str(), 0700), 0);
  expect_error([&] { task->save(dir.file("sub")); }, dir.file("sub"), ErrorKind::kIo);
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"sub"});
  // An uncompiled task has nothing to load into.
  Task bare(small_params());
  bare.optimizer(config_for(OptimizerKind::kSgd));
  expect_error([&] { bare.load(dir.file("nope.ckpt")); }, "compile()", ErrorKind::kInvalidArgument);
}

}  // namespace
}  // namespace renaissance
