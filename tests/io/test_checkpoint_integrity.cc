// Checkpoints (runtime/src/checkpoint.cc), their file-level guarantees: a write error
// leaves the old checkpoint and no temporary file behind, truncated or corrupt files are refused
// naming the section (the task untouched), and checkpoints of another layout or optimizer kind
// are refused saying which.
#include <sys/resource.h>

#include <csignal>

#include "support/checkpoint_test_util.h"

namespace renaissance {
namespace {

using namespace checkpoint_test;

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

// A real write error from the kernel on any machine, no privilege needed: the process's file-size
// limit (RLIMIT_FSIZE) below the checkpoint's size makes the save's write fail with EFBIG
// (SIGXFSZ ignored), as a full disk would with ENOSPC. The limit goes back up before the checks.
TEST(CheckpointWriteError, FileSizeLimitLeavesTheOldCheckpoint) {
  TempDir dir;
  const std::string path = dir.file("model.ckpt");
  auto task = start_task(small_params(), OptimizerKind::kAdam, BackendKind::kCpu);
  run_steps(*task, 0, 2, {});
  task->save(path);
  const std::vector<uint8_t> old_bytes = read_file(path);
  ASSERT_GT(old_bytes.size(), 4096u);
  run_steps(*task, 2, 1, {});

  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct Restore {
    rlimit limit;
    void (*handler)(int);
    ~Restore() {
      ::setrlimit(RLIMIT_FSIZE, &limit);
      std::signal(SIGXFSZ, handler);
    }
  } restore{saved, std::signal(SIGXFSZ, SIG_IGN)};
  rlimit small = saved;
  small.rlim_cur = old_bytes.size() / 2;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string message = expect_error([&] { task->save(path); }, path, ErrorKind::kIo);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
  EXPECT_TRUE(read_file(path) == old_bytes) << "the old checkpoint changed";
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"model.ckpt"}) << "a temporary file was left";

  task->save(path);  // the limit lifted: the save goes through
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
  const KindInfo& kind = kind_info(GetParam().kind);
  if (kind.has_m) want.insert("M");
  if (kind.has_v) want.insert("V");
  if (kind.norm != NormPass::kNone) want.insert("N");
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
