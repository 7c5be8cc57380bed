// Checkpoints of a task with a bf16/fp16 model copy (docs/checkpoint-format.md, version
// 3): save at step k, load into a fresh task and continue gives the bits of the uninterrupted run
// (fingerprint, which covers the copy, and the copy itself) for several kinds × {bf16, fp16} ×
// {nearest, stochastic}; load refuses another dtype, rounding or stochastic seed and leaves the task
// as it was; the file holds what the format page says (read here independently of the writer);
// fp32 checkpoints stay byte-identical to the committed version-2 fuzz seeds.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "support/checkpoint_test_util.h"

namespace renaissance {
namespace {

using checkpoint_test::expect_error;
using checkpoint_test::read_file;
using checkpoint_test::TempDir;
using checkpoint_test::write_file;

struct Cell {
  OptimizerKind kind;
  Precision precision;
  Rounding rounding;
};

std::string cell_name(const ::testing::TestParamInfo<Cell>& info) {
  return std::string(optimizer_kind_name(info.param.kind)) + "_" + precision_name(info.param.precision) + "_" +
         rounding_name(info.param.rounding);
}

std::vector<Cell> cells() {
  std::vector<Cell> out;
  for (OptimizerKind k : {OptimizerKind::kAdamW, OptimizerKind::kSgdNesterov, OptimizerKind::kLars, OptimizerKind::kLamb,
                          OptimizerKind::kLion}) {
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) out.push_back({k, p, r});
    }
  }
  return out;
}

constexpr uint64_t kRoundingSeed = 0x51ed5eedULL;

// A task of the checkpoint tests' small layout (every role, odd sizes, an empty tensor) with
// non-zero starting weights; the copy starts as their nearest rounding.
std::unique_ptr<Task> start(const Cell& c, uint64_t seed = kRoundingSeed, BackendKind backend = BackendKind::kCpu) {
  TaskOptions options;
  options.backend = backend;
  options.precision = {c.precision, c.rounding, seed};
  const std::vector<ParamSpec> params = checkpoint_test::small_params();
  auto task = std::make_unique<Task>(params, options);
  task->optimizer(reference_config(c.kind));
  task->compile();
  for (size_t id = 0; id < params.size(); ++id) {
    std::vector<float> w(static_cast<size_t>(params[id].numel()));
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * std::cos(float(i) * 0.7f + float(id));
    task->set_weight(id, w.data());
  }
  task->set_loss_scale(checkpoint_test::kLossScale);
  return task;
}

std::vector<uint16_t> model_copy(Task& task) {
  std::vector<uint16_t> all, one;
  for (size_t id = 0; id < task.num_params(); ++id) {
    one.resize(static_cast<size_t>(task.param(id).numel()));
    if (!one.empty()) task.read_model_copy(id, one.data());
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

class CheckpointPrecision : public ::testing::TestWithParam<Cell> {};

// Steps 0..7, a NaN at step 2 and at step 4 (the first step after the resume, so the copy the
// resumed task carries is the loaded one, not one rewritten by an applied step).
TEST_P(CheckpointPrecision, ResumeGivesTheUninterruptedBits) {
  const Cell c = GetParam();
  const std::set<int64_t> nan_steps = {2, 4};
  auto whole = start(c);
  checkpoint_test::run_steps(*whole, 0, 8, nan_steps);

  TempDir dir;
  auto first = start(c);
  checkpoint_test::run_steps(*first, 0, 4, nan_steps);
  first->save(dir.file("k4.ckpt"));
  const std::string saved = first->fingerprint();
  const std::vector<uint16_t> saved_copy = model_copy(*first);

  auto resumed = start(c);
  ASSERT_NE(model_copy(*resumed), saved_copy) << "the test needs a copy that the load must replace";
  resumed->load(dir.file("k4.ckpt"));
  EXPECT_EQ(model_copy(*resumed), saved_copy);
  EXPECT_EQ(resumed->fingerprint(), saved);
  checkpoint_test::expect_same_state(*first, *resumed);

  checkpoint_test::run_steps(*first, 4, 4, nan_steps);
  checkpoint_test::run_steps(*resumed, 4, 4, nan_steps);
  EXPECT_EQ(resumed->skipped_steps(), 2);
  EXPECT_EQ(model_copy(*resumed), model_copy(*whole));
  EXPECT_EQ(resumed->fingerprint(), whole->fingerprint());
  EXPECT_EQ(first->fingerprint(), whole->fingerprint()) << "saving changed the run";
}

INSTANTIATE_TEST_SUITE_P(Cells, CheckpointPrecision, ::testing::ValuesIn(cells()), cell_name);

// The copy travels through Backend download/upload like the fp32 state: a checkpoint saved on one
// backend continues on the other with the CPU's uninterrupted bits (skips without a CUDA device;
// `scripts/gpu.sh test` runs it on the GPU machine).
struct BackendPair {
  BackendKind from, to;
  Cell cell;
};

class CheckpointPrecisionAcrossBackends : public ::testing::TestWithParam<BackendPair> {};

TEST_P(CheckpointPrecisionAcrossBackends, ContinuesBitForBit) {
  const BackendPair p = GetParam();
  RN_SKIP_IF_UNAVAILABLE(p.from);
  RN_SKIP_IF_UNAVAILABLE(p.to);
  const std::set<int64_t> nan_steps = {2, 4};
  auto whole = start(p.cell);
  checkpoint_test::run_steps(*whole, 0, 8, nan_steps);
  TempDir dir;
  auto first = start(p.cell, kRoundingSeed, p.from);
  checkpoint_test::run_steps(*first, 0, 4, nan_steps);
  first->save(dir.file("k4.ckpt"));
  auto resumed = start(p.cell, kRoundingSeed, p.to);
  resumed->load(dir.file("k4.ckpt"));
  EXPECT_EQ(resumed->fingerprint(), first->fingerprint());
  checkpoint_test::run_steps(*resumed, 4, 4, nan_steps);
  EXPECT_EQ(model_copy(*resumed), model_copy(*whole));
  EXPECT_EQ(resumed->fingerprint(), whole->fingerprint());
}

std::vector<BackendPair> backend_pairs() {
  std::vector<BackendPair> out;
  for (const Cell& c : {Cell{OptimizerKind::kAdamW, Precision::kBf16, Rounding::kStochastic},
                        Cell{OptimizerKind::kLamb, Precision::kFp16, Rounding::kNearest}}) {
    out.push_back({BackendKind::kCpu, BackendKind::kCuda, c});
    out.push_back({BackendKind::kCuda, BackendKind::kCpu, c});
    out.push_back({BackendKind::kCuda, BackendKind::kCuda, c});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Pairs, CheckpointPrecisionAcrossBackends, ::testing::ValuesIn(backend_pairs()),
                         [](const ::testing::TestParamInfo<BackendPair>& info) {
                           const BackendPair& p = info.param;
                           return std::string(optimizer_kind_name(p.cell.kind)) + "_" +
                                  precision_name(p.cell.precision) + "_" + rounding_name(p.cell.rounding) + "_" +
                                  backend_kind_name(p.from) + "_to_" + backend_kind_name(p.to);
                         });

// ---- the file, read as docs/checkpoint-format.md describes it ----
struct Section {
  std::string tag;
  std::vector<uint8_t> payload;
};

uint32_t header_version(const std::vector<uint8_t>& file) {
  uint32_t v = 0;
  std::memcpy(&v, file.data() + 8, sizeof(v));
  return v;
}

std::vector<Section> sections(const std::vector<uint8_t>& file) {
  std::vector<Section> out;
  size_t pos = 24;
  while (pos + 12 <= file.size()) {
    Section s;
    s.tag.assign(reinterpret_cast<const char*>(&file[pos]), 4);
    uint64_t length;
    std::memcpy(&length, &file[pos + 4], 8);
    s.payload.assign(file.begin() + static_cast<long>(pos + 12), file.begin() + static_cast<long>(pos + 12 + length));
    out.push_back(s);
    pos += 12 + length + 8;
  }
  EXPECT_EQ(pos, file.size());
  return out;
}

std::vector<std::string> tags(const std::vector<Section>& s) {
  std::vector<std::string> t;
  for (const Section& x : s) t.push_back(x.tag);
  return t;
}

// Rewrites section `tag`'s payload bytes [at, at + n) and recomputes its checksum, so that the
// value checks behind the checksum are reached.
void patch_section(std::vector<uint8_t>* file, const std::string& tag, size_t at, const void* bytes, size_t n) {
  size_t pos = 24;
  while (pos + 12 <= file->size()) {
    uint64_t length;
    std::memcpy(&length, &(*file)[pos + 4], 8);
    if (std::memcmp(&(*file)[pos], tag.data(), 4) == 0) {
      std::memcpy(&(*file)[pos + 12 + at], bytes, n);
      const uint64_t sum = XXH3_64bits(&(*file)[pos], 12 + length);
      std::memcpy(&(*file)[pos + 12 + length], &sum, sizeof(sum));
      return;
    }
    pos += 12 + length + 8;
  }
  FAIL() << "no section " << tag;
}

TEST(CheckpointPrecisionFormat, Version3AddsPrecisionAndTheCopyInParameterOrder) {
  TempDir dir;
  auto task = start({OptimizerKind::kAdamW, Precision::kFp16, Rounding::kStochastic});
  checkpoint_test::run_steps(*task, 0, 3, {});
  task->save(dir.file("c.ckpt"));
  const std::vector<uint8_t> file = read_file(dir.file("c.ckpt"));
  EXPECT_EQ(header_version(file), 3u);
  const std::vector<Section> s = sections(file);
  EXPECT_EQ(tags(s), (std::vector<std::string>{"META", "PREC", "LAYT", "FAMW", "FAMM", "FAMV", "FAMC", "SCAL"}));
  ASSERT_EQ(s.size(), 8u);
  // PREC: u32 precision (2 = fp16), u32 rounding (1 = stochastic), u64 seed.
  ASSERT_EQ(s[1].payload.size(), 16u);
  uint32_t precision, rounding;
  uint64_t seed;
  std::memcpy(&precision, &s[1].payload[0], 4);
  std::memcpy(&rounding, &s[1].payload[4], 4);
  std::memcpy(&seed, &s[1].payload[8], 8);
  EXPECT_EQ(precision, 2u);
  EXPECT_EQ(rounding, 1u);
  EXPECT_EQ(seed, kRoundingSeed);
  // FAMC: u64 element count, then the 2-byte copy of every tensor in parameter order.
  const std::vector<uint16_t> copy = model_copy(*task);
  uint64_t count;
  std::memcpy(&count, s[6].payload.data(), 8);
  EXPECT_EQ(count, copy.size());
  ASSERT_EQ(s[6].payload.size(), 8 + copy.size() * 2);
  EXPECT_EQ(std::memcmp(&s[6].payload[8], copy.data(), copy.size() * 2), 0);
}

// The fuzz seeds of fuzz/corpus/fuzz_checkpoint were written in format version 2 before the model
// copy existed: the same fp32 task (fuzz/fuzz_checkpoint.cc's fixture) must still save exactly
// those bytes.
TEST(CheckpointPrecisionFormat, Fp32CheckpointsAreTheVersion2Bytes) {
  TempDir dir;
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kLars, OptimizerKind::kLion}) {
    TaskOptions options;
    options.backend = BackendKind::kCpu;
    options.backend_options.threads = 1;
    Task task({{"conv1.weight", {3, 2, 3, 3}, Role::kFirstConv},
               {"bn1.weight", {3}, Role::kBnWeight},
               {"bn1.bias", {3}, Role::kBnBias},
               {"layer1.conv.weight", {5, 3, 1, 1}, Role::kDeepConv},
               {"fc.weight", {2, 5}, Role::kFcWeight},
               {"fc.bias", {2}, Role::kFcBias}},
              options);
    task.optimizer(reference_config(kind));
    task.compile();
    for (uint64_t s = 0; s < 3; ++s) {
      task.synthesize_gradients(7, s, 1.0f);
      task.step();
    }
    task.save(dir.file("fp32.ckpt"));
    const std::vector<uint8_t> seed = read_file(std::string(RENAISSANCE_SOURCE_DIR) + "/fuzz/corpus/fuzz_checkpoint/" +
                                                optimizer_kind_name(kind) + ".ckpt");
    ASSERT_FALSE(seed.empty());
    EXPECT_EQ(header_version(seed), 2u);
    EXPECT_TRUE(read_file(dir.file("fp32.ckpt")) == seed) << optimizer_kind_name(kind);
  }
}

// read_checkpoint_info (what `renaissance run --resume` builds its task from) carries the copy's
// dtype, rounding and seed from PREC; a version-2 file says fp32; a bad PREC is refused there too.
TEST(CheckpointPrecisionFormat, InfoCarriesThePrecisionRoundingAndSeed) {
  TempDir dir;
  for (const Cell& c : {Cell{OptimizerKind::kAdamW, Precision::kFp16, Rounding::kStochastic},
                        Cell{OptimizerKind::kLamb, Precision::kBf16, Rounding::kNearest}}) {
    auto task = start(c);
    checkpoint_test::run_steps(*task, 0, 2, {});
    task->save(dir.file("c.ckpt"));
    const CheckpointInfo info = read_checkpoint_info(dir.file("c.ckpt"));
    EXPECT_EQ(info.version, 3u);
    EXPECT_EQ(info.precision.precision, c.precision);
    EXPECT_EQ(info.precision.rounding, c.rounding);
    EXPECT_EQ(info.precision.seed, kRoundingSeed);
    EXPECT_EQ(info.step, 2);
  }
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  Task plain(checkpoint_test::small_params(), options);
  plain.optimizer(reference_config(OptimizerKind::kAdamW));
  plain.compile();
  plain.save(dir.file("fp32.ckpt"));
  const CheckpointInfo fp32 = read_checkpoint_info(dir.file("fp32.ckpt"));
  EXPECT_EQ(fp32.version, 2u);
  EXPECT_EQ(fp32.precision.precision, Precision::kFp32);

  std::vector<uint8_t> f = read_file(dir.file("c.ckpt"));
  const uint32_t past = kNumPrecisions;  // the first code past the precision table
  patch_section(&f, "PREC", 0, &past, 4);
  write_file(dir.file("bad.ckpt"), f);
  expect_error([&] { read_checkpoint_info(dir.file("bad.ckpt")); }, "model copy precision " + std::to_string(past),
               ErrorKind::kFormat);
}

// ---- refusals: a clear error, and the task exactly as it was ----
void expect_refused(Task& task, const std::string& path, const std::string& needle, ErrorKind kind) {
  const std::vector<uint8_t> before = checkpoint_test::arena_bytes(task);
  const std::string fp = task.fingerprint();
  expect_error([&] { task.load(path); }, needle, kind);
  EXPECT_TRUE(checkpoint_test::arena_bytes(task) == before) << "a refused load changed the arena";
  EXPECT_EQ(task.fingerprint(), fp);
}

TEST(CheckpointPrecisionRefusals, AnotherDtypeRoundingOrSeedIsRefused) {
  TempDir dir;
  const Cell bf16_sr{OptimizerKind::kAdamW, Precision::kBf16, Rounding::kStochastic};
  auto saver = start(bf16_sr);
  checkpoint_test::run_steps(*saver, 0, 2, {});
  saver->save(dir.file("bf16_sr.ckpt"));
  const std::string path = dir.file("bf16_sr.ckpt");

  auto other_seed = start(bf16_sr, kRoundingSeed + 1);
  expect_refused(*other_seed, path,
                 "checkpoint has a bf16 model copy rounded stochastically with seed " + std::to_string(kRoundingSeed) +
                     ", task has a bf16 model copy rounded stochastically with seed " + std::to_string(kRoundingSeed + 1),
                 ErrorKind::kInvalidArgument);
  auto nearest = start({OptimizerKind::kAdamW, Precision::kBf16, Rounding::kNearest});
  expect_refused(*nearest, path, "task has a bf16 model copy rounded to nearest even", ErrorKind::kInvalidArgument);
  auto fp16 = start({OptimizerKind::kAdamW, Precision::kFp16, Rounding::kStochastic});
  expect_refused(*fp16, path, "task has an fp16 model copy", ErrorKind::kInvalidArgument);

  TaskOptions plain_options;
  plain_options.backend = BackendKind::kCpu;
  Task plain(checkpoint_test::small_params(), plain_options);
  plain.optimizer(reference_config(OptimizerKind::kAdamW));
  plain.compile();
  checkpoint_test::run_steps(plain, 0, 2, {});
  expect_refused(plain, path, "checkpoint has a bf16 model copy rounded stochastically", ErrorKind::kInvalidArgument);
  plain.save(dir.file("fp32.ckpt"));
  expect_refused(*nearest, dir.file("fp32.ckpt"), "checkpoint has no model copy (fp32), task has a bf16",
                 ErrorKind::kInvalidArgument);

  // Nearest rounding draws no random bits: its seed does not matter and is not compared.
  auto nearest_saver = start({OptimizerKind::kAdamW, Precision::kBf16, Rounding::kNearest}, 1);
  checkpoint_test::run_steps(*nearest_saver, 0, 2, {});
  nearest_saver->save(dir.file("bf16_rn.ckpt"));
  auto nearest_other = start({OptimizerKind::kAdamW, Precision::kBf16, Rounding::kNearest}, 2);
  nearest_other->load(dir.file("bf16_rn.ckpt"));
  EXPECT_EQ(nearest_other->fingerprint(), nearest_saver->fingerprint());
}

TEST(CheckpointPrecisionRefusals, InvalidPrecisionFieldsAndDamagedCopyAreRefused) {
  TempDir dir(/*in_memory=*/true);
  const Cell cell{OptimizerKind::kSgdNesterov, Precision::kBf16, Rounding::kNearest};
  auto saver = start(cell);
  checkpoint_test::run_steps(*saver, 0, 2, {});
  saver->save(dir.file("good.ckpt"));
  const std::vector<uint8_t> good = read_file(dir.file("good.ckpt"));
  auto task = start(cell);
  const std::string bad = dir.file("bad.ckpt");

  const uint32_t fp32 = 0, past = kNumPrecisions, two = 2;  // past: the first code past the precision table
  std::vector<uint8_t> f = good;
  patch_section(&f, "PREC", 0, &fp32, 4);
  write_file(bad, f);
  expect_refused(*task, bad, "section PRECISION: model copy precision 0 is neither 1 (bf16) nor 2 (fp16)",
                 ErrorKind::kFormat);
  f = good;
  patch_section(&f, "PREC", 0, &past, 4);
  write_file(bad, f);
  expect_refused(*task, bad, "model copy precision " + std::to_string(past), ErrorKind::kFormat);
  f = good;
  patch_section(&f, "PREC", 4, &two, 4);
  write_file(bad, f);
  expect_refused(*task, bad, "section PRECISION: rounding 2 is neither", ErrorKind::kFormat);
  // A copy count that does not match the layout.
  f = good;
  uint64_t count;
  const std::vector<Section> s = sections(good);
  ASSERT_EQ(s[s.size() - 2].tag, "FAMC");
  std::memcpy(&count, s[s.size() - 2].payload.data(), 8);
  ++count;
  patch_section(&f, "FAMC", 0, &count, 8);
  write_file(bad, f);
  expect_refused(*task, bad, "section C: holds", ErrorKind::kFormat);
  // Every single-byte change of the file is refused (checksums, framing) without a change.
  const std::vector<uint8_t> before = checkpoint_test::arena_bytes(*task);
  for (size_t i = 0; i < good.size(); i += 7) {
    f = good;
    f[i] ^= 0x20;
    write_file(bad, f);
    EXPECT_THROW(task->load(bad), Error) << "byte " << i;
  }
  EXPECT_TRUE(checkpoint_test::arena_bytes(*task) == before);
  task->load(dir.file("good.ckpt"));
  EXPECT_EQ(task->fingerprint(), saver->fingerprint());
}

}  // namespace
}  // namespace renaissance
