// Issue 12 at the library level (the CLI side is tests/cli/hostile_input.cmake): numbers that are
// valid doubles but not float32 are refused with every derived scalar; layout limits are the same
// where a layout is read and on both sides of a checkpoint; inputs are regular files only and a
// FIFO never blocks; a save never replaces anything but a regular file and removes the temp files
// of dead savers; checkpoints carry the run's configuration (format version 2) and refuse version 1
// naming both versions.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "core/src/io/file_checks.h"
#include "renaissance/layout.h"
#include "renaissance/optimizer.h"
#include "renaissance/task.h"
#include "support/checkpoint_test_util.h"

namespace renaissance {
namespace {

using checkpoint_test::expect_error;
using checkpoint_test::TempDir;

OptimizerConfig adamw(double lr, double wd) {
  OptimizerConfig c = default_config(OptimizerKind::kAdamW);
  c.lr = lr;
  c.weight_decay = wd;
  return c;
}

// ---- item 3: the float32 domain ----

TEST(HostileInput, HyperparametersMustBeFiniteAsFloat32) {
  expect_error([] { adamw(1e39, 0.0).validate(); }, "invalid lr = ", ErrorKind::kInvalidArgument);
  expect_error([] { adamw(1e308, 0.0).validate(); }, "is not finite as a float32", ErrorKind::kInvalidArgument);
  expect_error([] { adamw(1e-3, 1e300).validate(); }, "invalid weight_decay", ErrorKind::kInvalidArgument);
  // Each finite as float32, the product is not: 1 - lr * wd overflows.
  expect_error([] { adamw(1e30, 1e30).validate(); }, "1 - lr * weight_decay", ErrorKind::kInvalidArgument);
  OptimizerConfig tiny_eps = adamw(1e-3, 0.0);
  tiny_eps.eps = 1e-50;
  expect_error([&] { tiny_eps.validate(); }, "rounds to 0 as a float32", ErrorKind::kInvalidArgument);
  expect_error([] { check_loss_scale(1e-39); }, "1 / loss scale", ErrorKind::kInvalidArgument);
  expect_error([] { check_loss_scale(1e39); }, "loss scale", ErrorKind::kInvalidArgument);
  expect_error([] { check_lr(3.5e38); }, "is not finite as a float32", ErrorKind::kInvalidArgument);
  // The edges stay open: FLT_MAX itself and an ordinary config.
  EXPECT_NO_THROW(check_lr(3.4028234663852886e38));
  EXPECT_NO_THROW(adamw(1e-3, 0.01).validate());
}

// ---- item 5: one set of layout limits ----

std::vector<ParamSpec> rank_params(size_t rank) { return {{"w", std::vector<int64_t>(rank, 1), Role::kDeepConv}}; }

std::string rank_layout_json(size_t rank) {
  std::string shape;
  for (size_t i = 0; i < rank; ++i) shape += i ? ",1" : "1";
  return R"({"name":"r","params":[{"name":"w","shape":[)" + shape + R"(],"role":"deep_conv"}]})";
}

TEST(HostileInput, LayoutLimitsAreCheckedWhereTheLayoutIsRead) {
  expect_error([] { parse_layout(rank_layout_json(kMaxParamRank + 1), "r.json"); }, "rank 65, more than the 64",
               ErrorKind::kFormat);
  EXPECT_NO_THROW(parse_layout(rank_layout_json(kMaxParamRank), "r.json"));
  const std::string long_name(kMaxParamNameBytes + 1, 'n');
  expect_error([&] { parse_layout(R"({"params":[{"name":")" + long_name + R"(","shape":[1],"role":"deep_conv"}]})", "n.json"); },
               "more than the 4096 allowed", ErrorKind::kFormat);
}

TEST(HostileInput, SaveRefusesWhatLoadWouldRefuse) {
  TempDir dir;
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  Task too_deep(rank_params(kMaxParamRank + 1), options);
  too_deep.optimizer(adamw(1e-3, 0.01));
  too_deep.compile();
  expect_error([&] { too_deep.save(dir.file("deep.ckpt")); }, "rank 65", ErrorKind::kInvalidArgument);
  EXPECT_NE(::access(dir.file("deep.ckpt").c_str(), F_OK), 0) << "a checkpoint no load accepts was written";
  Task deepest(rank_params(kMaxParamRank), options);
  deepest.optimizer(adamw(1e-3, 0.01));
  deepest.compile();
  deepest.save(dir.file("ok.ckpt"));
  EXPECT_NO_THROW(deepest.load(dir.file("ok.ckpt")));
}

// ---- items 2 and 6: inputs are regular files, a FIFO never blocks ----

TEST(HostileInput, InputsAreRegularFilesOnly) {
  TempDir dir;
  const std::string fifo = dir.file("f.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Before the fix, open() of a FIFO without a writer blocked forever: ctest's timeout catches it.
  expect_error([&] { load_layout_file(fifo); }, "is a FIFO, not a regular file", ErrorKind::kIo);
  expect_error([&] { read_checkpoint_info(fifo); }, "is a FIFO, not a regular file", ErrorKind::kIo);
  expect_error([] { load_layout_file("/dev/zero"); }, "is a character device", ErrorKind::kIo);
  expect_error([&] { load_layout_file(dir.path()); }, "is a folder", ErrorKind::kIo);
  auto task = checkpoint_test::make_task(checkpoint_test::tiny_params(), adamw(1e-3, 0.01), BackendKind::kCpu);
  expect_error([&] { task->load(fifo); }, "is a FIFO", ErrorKind::kIo);
  // A JSON file above the bound is refused from its size, before a byte is read.
  const std::string big = dir.file("big.json");
  checkpoint_test::write_file(big, {});
  ASSERT_EQ(::truncate(big.c_str(), static_cast<off_t>(io::kMaxJsonBytes + 1)), 0);
  expect_error([&] { load_layout_file(big); }, "bytes, more than the", ErrorKind::kIo);
}

// ---- item 10: a save never replaces anything but a regular file ----

TEST(HostileInput, SaveNeverReplacesANonRegularFile) {
  TempDir dir;
  auto task = checkpoint_test::make_task(checkpoint_test::tiny_params(), adamw(1e-3, 0.01), BackendKind::kCpu);
  const std::string fifo = dir.file("c.fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_error([&] { task->save(fifo); }, "only a regular file is ever replaced", ErrorKind::kIo);
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  // Through a symlink, the target is written and the link stays a link.
  task->save(dir.file("real.ckpt"));
  ASSERT_EQ(::symlink("real.ckpt", dir.file("link.ckpt").c_str()), 0);
  task->save(dir.file("link.ckpt"));
  ASSERT_EQ(::lstat(dir.file("link.ckpt").c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the symlink was replaced by a file";
  ASSERT_EQ(::symlink("nowhere.ckpt", dir.file("dangling.ckpt").c_str()), 0);
  expect_error([&] { task->save(dir.file("dangling.ckpt")); }, "leads nowhere", ErrorKind::kIo);
}

// ---- item 14: stale temporary files of dead savers ----

TEST(HostileInput, SaveRemovesStaleTempFilesOfDeadProcessesOnly) {
  TempDir dir;
  auto task = checkpoint_test::make_task(checkpoint_test::tiny_params(), adamw(1e-3, 0.01), BackendKind::kCpu);
  // A pid above the kernel's maximum (4194304) is never alive; pid 1 always is.
  const std::vector<std::string> stale = {".c.ckpt.tmp.4194305.0", ".c.ckpt.tmp.4194305.17"};
  const std::vector<std::string> kept = {".c.ckpt.tmp.1.0", ".d.ckpt.tmp.4194305.0", ".c.ckpt.tmp.4194305",
                                         "c.ckpt.tmp.4194305.0", ".c.ckpt.tmp.x.0"};
  for (const auto& n : stale) checkpoint_test::write_file(dir.file(n), {1, 2, 3});
  for (const auto& n : kept) checkpoint_test::write_file(dir.file(n), {1, 2, 3});
  task->save(dir.file("c.ckpt"));
  for (const auto& n : stale) EXPECT_NE(::access(dir.file(n).c_str(), F_OK), 0) << n << " was not removed";
  for (const auto& n : kept) EXPECT_EQ(::access(dir.file(n).c_str(), F_OK), 0) << n << " was removed";
}

// ---- item 8: the checkpoint carries the run's configuration ----

TEST(HostileInput, CheckpointCarriesTheRunConfiguration) {
  TempDir dir;
  auto task = checkpoint_test::make_task(checkpoint_test::tiny_params(), adamw(2e-3, 0.03), BackendKind::kCpu);
  RunSettings run;
  run.schedule = "cosine";
  run.schedule_steps = 20;
  run.warmup = 3;
  run.seed = 0xfedcba9876543210ULL;
  task->set_run_settings(run);
  task->set_loss_scale(128.0);
  task->synthesize_gradients(1, 0, 0.01f);
  task->step();
  task->save(dir.file("c.ckpt"));
  const CheckpointInfo info = read_checkpoint_info(dir.file("c.ckpt"));
  EXPECT_EQ(info.version, 2u);
  EXPECT_EQ(info.config.kind, OptimizerKind::kAdamW);
  EXPECT_EQ(info.config.lr, 2e-3);
  EXPECT_EQ(info.config.weight_decay, 0.03);
  EXPECT_EQ(info.loss_scale, 128.0);
  EXPECT_TRUE(info.check_finite);
  EXPECT_EQ(info.step, 1);
  EXPECT_EQ(info.run.schedule, "cosine");
  EXPECT_EQ(info.run.schedule_steps, 20);
  EXPECT_EQ(info.run.warmup, 3);
  EXPECT_EQ(info.run.seed, 0xfedcba9876543210ULL);
  auto other = checkpoint_test::make_task(checkpoint_test::tiny_params(), adamw(1e-3, 0.01), BackendKind::kCpu);
  other->load(dir.file("c.ckpt"));
  EXPECT_EQ(other->run_settings().seed, run.seed);
  EXPECT_EQ(other->run_settings().schedule, "cosine");
  // The non-finite check changes the compiled step: a checkpoint made with it does not load
  // into a task without it.
  TaskOptions no_check;
  no_check.backend = BackendKind::kCpu;
  no_check.check_finite = false;
  Task unchecked(checkpoint_test::tiny_params(), no_check);
  unchecked.optimizer(adamw(2e-3, 0.03));
  unchecked.compile();
  expect_error([&] { unchecked.load(dir.file("c.ckpt")); }, "non-finite check", ErrorKind::kInvalidArgument);
}

TEST(HostileInput, VersionOneCheckpointIsRefusedNamingBothVersions) {
  TempDir dir;
  auto task = checkpoint_test::make_task(checkpoint_test::tiny_params(), adamw(1e-3, 0.01), BackendKind::kCpu);
  task->save(dir.file("c.ckpt"));
  std::vector<uint8_t> bytes = checkpoint_test::read_file(dir.file("c.ckpt"));
  const uint32_t one = 1;
  std::memcpy(bytes.data() + 8, &one, sizeof(one));
  const uint64_t sum = XXH3_64bits(bytes.data(), 16);  // a well-formed header of version 1
  std::memcpy(bytes.data() + 16, &sum, sizeof(sum));
  checkpoint_test::write_file(dir.file("v1.ckpt"), bytes);
  expect_error([&] { task->load(dir.file("v1.ckpt")); }, "unsupported format version 1 (this build reads version 2)",
               ErrorKind::kFormat);
  expect_error([&] { read_checkpoint_info(dir.file("v1.ckpt")); }, "version 1 (this build reads version 2)",
               ErrorKind::kFormat);
}

// ---- item 13: control characters ----

TEST(HostileInput, PrintableEscapesControlCharacters) {
  EXPECT_EQ(io::printable(std::string("a\x1b[31m\x07\x7f\n") + "z"), "a\\x1b[31m\\x07\\x7f\\x0az");
  EXPECT_EQ(io::printable("plain/name.ckpt é"), "plain/name.ckpt é");
  const std::string json = R"({"params":[{"name":"a\u001b[2J","shape":[1],"role":"deep_conv"},)"
                           R"({"name":"a\u001b[2J","shape":[1],"role":"deep_conv"}]})";
  const std::string message = expect_error([&] { parse_layout(json, "x.json"); }, "'a\\x1b[2J'", ErrorKind::kFormat);
  EXPECT_EQ(message.find('\x1b'), std::string::npos);
}

}  // namespace
}  // namespace renaissance
