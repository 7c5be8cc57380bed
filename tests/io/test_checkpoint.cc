// Checkpoints (runtime/src/checkpoint.cc), the guarantees that span processes and
// backends: resuming in a new process continues bit for bit (NaN steps on either side of the
// save included), checkpoints move between backends, and SIGKILL during a save never leaves a
// partial file under the final name. test_checkpoint_integrity.cc has the file-level guarantees.
//
// "New process" is a fork + exec of this test binary: the child starts from nothing but the
// checkpoint file, so any state the file fails to carry shows up as a bit difference.
#include "support/checkpoint_test_util.h"

extern char** environ;

namespace renaissance {
namespace {

using namespace checkpoint_test;

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

INSTANTIATE_TEST_SUITE_P(AllKinds, CheckpointResume, ::testing::ValuesIn(resume_params()),
                         testing_util::streamed_param_name<ResumeParam>);

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

INSTANTIATE_TEST_SUITE_P(Pairs, CheckpointAcrossBackends, ::testing::ValuesIn(cross_params()),
                         testing_util::streamed_param_name<CrossParam>);

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

}  // namespace
}  // namespace renaissance
