// Regression tests for what the fuzz targets (fuzz/, scripts/fuzz.sh) found: each stored input
// under fuzz/regressions/TARGET/ goes through the same library entry point as its target and
// must now be refused with an Error (and, for checkpoints, leave the task untouched). The
// per-bug tests also check the message, so they fail without the fix even in a build without
// sanitizers.
#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/layout.h"
#include "renaissance/optimizer.h"
#include "renaissance/replay_case.h"
#include "renaissance/safetensors.h"
#include "renaissance/task.h"

namespace renaissance {
namespace {

std::string regression_dir(const std::string& target) {
  return std::string(RENAISSANCE_SOURCE_DIR) + "/fuzz/regressions/" + target;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> regression_files(const std::string& target) {
  std::vector<std::string> files;
  DIR* d = ::opendir(regression_dir(target).c_str());
  if (d == nullptr) return files;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') files.push_back(regression_dir(target) + "/" + e->d_name);
  }
  ::closedir(d);
  return files;
}

// A scratch file holding `bytes`, removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::string& bytes) {
    char name[] = "/tmp/renaissance-fuzz-regression-XXXXXX";
    const int fd = ::mkstemp(name);
    EXPECT_GE(fd, 0);
    path_ = name;
    EXPECT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  ~TempFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs `f` and returns the Error's message; a test failure when nothing or something else is thrown.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-Error exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "accepted an input it must refuse";
  return "";
}

// The fuzz_checkpoint fixture: every role once, AdamW.
std::unique_ptr<Task> checkpoint_task() {
  std::vector<ParamSpec> params = {{"conv1.weight", {3, 2, 3, 3}, Role::kFirstConv},
                                   {"bn1.weight", {3}, Role::kBnWeight},
                                   {"bn1.bias", {3}, Role::kBnBias},
                                   {"layer1.conv.weight", {5, 3, 1, 1}, Role::kDeepConv},
                                   {"fc.weight", {2, 5}, Role::kFcWeight},
                                   {"fc.bias", {2}, Role::kFcBias}};
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  auto task = std::make_unique<Task>(params, options);
  task->optimizer(AdamW().lr(1e-3).weight_decay(0.01));
  task->compile();
  for (uint64_t s = 0; s < 3; ++s) {
    task->synthesize_gradients(7, s, 1.0f);
    task->step();
  }
  return task;
}

// ---- one test per bug: the stored input, its entry point, the message of the fixed code ----

// checkpoint.cc Parser::section: the printable copy of a bad tag lost its NUL terminator, so the
// error message read past a 5-byte stack array (ASan stack-buffer-overflow).
TEST(FuzzRegression, CheckpointBadTagMessageStaysInBounds) {
  const auto task = checkpoint_task();
  const std::string before = task->fingerprint();
  const TempFile file(read_text(regression_dir("fuzz_checkpoint") + "/bad_tag_unterminated.ckpt"));
  const std::string message = error_of([&] { task->load(file.path()); });
  // Exactly the 4 tag bytes, made printable, then the closing quote: no bytes from beyond.
  EXPECT_NE(message.find("section META: bad tag 'l?:?' where 'META' belongs"), std::string::npos) << message;
  EXPECT_EQ(task->fingerprint(), before);
}

// replay.cc parse_replay_case_json: "steps": 2^30 passed the old cap and sized two per-step
// lists of doubles (16 GB) from a 100-byte case.json before any gradient file was opened.
TEST(FuzzRegression, ReplayHugeStepsRefusedBeforeAllocating) {
  const std::string text = read_text(regression_dir("fuzz_replay_case") + "/huge_steps.json");
  const std::string message = error_of([&] { parse_replay_case_json(text, "huge"); });
  EXPECT_NE(message.find("steps must be a non-negative integer of at most"), std::string::npos) << message;
  // The largest accepted count still parses (and allocates only tens of MB).
  const std::string at_limit = "{\"format\":\"renaissance-replay/1\",\"optimizer\":{\"kind\":\"sgd\"},\"steps\":" +
                               std::to_string(kMaxSafetensorsHeaderBytes / 32) +
                               ",\"params\":[{\"name\":\"a\",\"shape\":[1],\"role\":\"bn_bias\"}]}";
  EXPECT_EQ(parse_replay_case_json(at_limit, "limit").groups.front().lr_per_step.size(), kMaxSafetensorsHeaderBytes / 32);
}

// layout.cc parse_layout: five tensors of 2^61-1 elements each passed the per-tensor bound, and
// Layout::total_numel() (used by `renaissance run`) overflowed int64 (UBSan).
TEST(FuzzRegression, LayoutTotalSizeBounded) {
  const std::string text = read_text(regression_dir("fuzz_layout") + "/total_numel_overflow.json");
  const std::string message = error_of([&] { parse_layout(text, "overflow.json"); });
  EXPECT_NE(message.find("params[1] 'p1'"), std::string::npos) << message;
  EXPECT_NE(message.find("total size"), std::string::npos) << message;
}

// safetensors.cc SafetensorsReader: an extent above 2^63-1 next to a zero extent made the size
// 0, so [0, 2^64-1] was accepted and stored as the int64 shape [0, -1].
TEST(FuzzRegression, SafetensorsExtentBeyondInt64Refused) {
  const std::string path = regression_dir("fuzz_safetensors") + "/extent_beyond_int64.safetensors";
  const std::string message = error_of([&] { SafetensorsReader reader(path); });
  EXPECT_NE(message.find("'a'"), std::string::npos) << message;
  EXPECT_NE(message.find("beyond 2^63-1"), std::string::npos) << message;
}

// ---- every stored input, whatever it was for: refused with an Error, nothing else ----

TEST(FuzzRegression, EveryStoredInputIsRefusedWithAnError) {
  size_t count = 0;
  for (const std::string& path : regression_files("fuzz_safetensors")) {
    SCOPED_TRACE(path);
    error_of([&] {
      SafetensorsReader reader(path);
      for (const auto& kv : reader.tensors()) reader.read_f32(kv.first);
    });
    ++count;
  }
  for (const std::string& path : regression_files("fuzz_replay_case")) {
    SCOPED_TRACE(path);
    error_of([&] { parse_replay_case_json(read_text(path), "case"); });
    ++count;
  }
  for (const std::string& path : regression_files("fuzz_layout")) {
    SCOPED_TRACE(path);
    error_of([&] { parse_layout(read_text(path), path); });
    ++count;
  }
  const auto task = checkpoint_task();
  const std::string before = task->fingerprint();
  for (const std::string& path : regression_files("fuzz_checkpoint")) {
    SCOPED_TRACE(path);
    error_of([&] { task->load(path); });
    EXPECT_EQ(task->fingerprint(), before);
    ++count;
  }
  EXPECT_GE(count, 4u) << "the regression inputs under fuzz/regressions/ were not found";
}

}  // namespace
}  // namespace renaissance
