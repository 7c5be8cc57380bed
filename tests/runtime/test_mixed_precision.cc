// The bf16/fp16 model copy for every kind × {bf16, fp16} × {nearest, stochastic}:
// the masters, M and V are bit for bit those of the fp32 task (the copy does not touch the
// update), and after every applied step each copy element is the oracle's rounding of its new
// master (tests/support/precision_oracle.h, in double; the stochastic word recomputed from Philox with
// the documented key: seed, applied step t, parameter id, index in the tensor). A skipped step
// writes no copy; thread count does not change a bit. Steps with lr = 0 leave masters put on
// exact ties (so ties-to-even is exercised inside the update pass); a weight tensor spans
// CPU chunk and norm-tile boundaries at indices that are not multiples of 4.
#include <gtest/gtest.h>

#include <cstdio>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/math/precision.h"
#include "renaissance/task.h"
#include "support/optimizer_cases.h"
#include "support/precision_cells.h"
#include "support/precision_oracle.h"
#include "support/simd_targets.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using precision_oracle::Fmt;

using precision_cells::Cell;
using precision_cells::all_cells;
using precision_cells::cell_name;

// Both groups, several tensors per role, and a 20003-element weight tensor starting 5 elements
// into its region: it crosses the 16384-element CPU chunk and the 4096-element norm tiles at
// tensor indices that are not multiples of 4.
std::vector<ParamSpec> layout() {
  return {{"b0", {3}, Role::kBnBias},      {"w0", {5}, Role::kFcWeight},   {"w1", {20003}, Role::kFcWeight},
          {"bw", {2, 33}, Role::kBnWeight}, {"fb", {70}, Role::kFcBias},   {"conv", {3, 3, 7}, Role::kDeepConv},
          {"first", {129}, Role::kFirstConv}};
}

constexpr uint64_t kSeed = 0x5eed0000cafef00dULL;

// A master value for element i of tensor p: mostly ordinary magnitudes, with every 7th element
// an exact tie of the model format (halfway between two neighbours) and every 11th one beyond
// the fp16 range, so both the ties and the overflow to inf happen inside the update.
float initial_weight(Fmt fmt, size_t p, size_t i) {
  const double base = 0.05 * std::sin(1.3 * static_cast<double>(i) + 0.7 * static_cast<double>(p)) + 0.003;
  if (i % 7 == 3) {
    const double ulp = std::ldexp(1.0, (fmt == Fmt::kBf16 ? -7 : -10) - 5);  // in [2^-5, 2^-4)
    const double lo = std::ldexp(1.0, -5) + ulp * static_cast<double>(i % 13);
    return static_cast<float>((i % 2 ? -1.0 : 1.0) * (lo + ulp / 2));
  }
  if (i % 11 == 5) return static_cast<float>(65510.0 + static_cast<double>(i % 5) * 4.0);
  return static_cast<float>(base);
}

float gradient(size_t p, size_t i, int step) {
  return static_cast<float>(0.02 * std::cos(0.9 * static_cast<double>(i) + 1.1 * step + static_cast<double>(p)));
}

// threads: CPU threads; on CUDA the same number picks a launch shape (block 64 or the default),
// which must not change a bit either.
std::unique_ptr<Task> make_task(const Cell& cell, bool with_copy, int threads, BackendKind backend) {
  TaskOptions options;
  options.backend = backend;
  options.backend_options.threads = threads;
  if (backend == BackendKind::kCuda && threads == 1) options.backend_options.cuda_block = 64;
  if (with_copy) options.precision = {cell.precision, cell.rounding, kSeed};
  auto made = std::make_unique<Task>(layout(), options);
  Task& task = *made;
  task.optimizer(cell.kind.config);
  task.compile();
  const Fmt fmt = cell.precision == Precision::kBf16 ? Fmt::kBf16 : Fmt::kF16;
  for (size_t p = 0; p < task.num_params(); ++p) {
    std::vector<float> w(static_cast<size_t>(task.param(p).numel()));
    for (size_t i = 0; i < w.size(); ++i) w[i] = initial_weight(fmt, p, i);
    task.set_weight(p, w.data());
  }
  return made;
}

void set_gradients(Task& task, int step, bool poison) {
  for (size_t p = 0; p < task.num_params(); ++p) {
    std::vector<float> g(static_cast<size_t>(task.param(p).numel()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = gradient(p, i, step);
    if (poison && p == 2) g[17] = NAN;
    task.set_grad(p, g.data());
  }
}

// The copy the oracle expects for parameter p's masters after applied step t.
std::vector<uint16_t> expected_copy(const Cell& cell, const std::vector<float>& w, uint32_t p, int64_t t) {
  const Fmt fmt = cell.precision == Precision::kBf16 ? Fmt::kBf16 : Fmt::kF16;
  std::vector<uint16_t> out(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    if (cell.rounding == Rounding::kNearest) {
      out[i] = precision_oracle::oracle_rne(fmt, w[i]);
    } else {
      // docs/math.md: counter (i/8 low, i/8 high, p, t), key (seed low, seed high); r16 is the
      // 16-bit half i%8 of the output (low half of word (i%8)/2 for even i%8, high for odd),
      // handed to the rounding as the 32-bit word r16 << 16.
      const uint64_t q = i / 8;
      const math::Philox4x32 block = math::philox4x32_10(
          static_cast<uint32_t>(q), static_cast<uint32_t>(q >> 32), p, static_cast<uint32_t>(t),
          static_cast<uint32_t>(kSeed & 0xffffffffu), static_cast<uint32_t>(kSeed >> 32));
      const uint32_t word = block.v[(i % 8) / 2];
      const uint32_t r16 = i % 2 == 0 ? word & 0xffffu : word >> 16;
      out[i] = precision_oracle::oracle_sr(fmt, w[i], r16 << 16);
    }
  }
  return out;
}

TaskOptions options_cpu() {
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  return options;
}

class MixedPrecision : public ::testing::TestWithParam<Cell> {};

TEST_P(MixedPrecision, CopyIsTheOracleRoundingOfTheMastersAfterEveryStep) {
  const Cell& cell = GetParam();
  RN_SKIP_IF_UNAVAILABLE(cell.backend);
  auto plain_task = make_task(cell, false, 2, cell.backend), mixed_task = make_task(cell, true, 2, cell.backend);
  Task& plain = *plain_task;
  Task& mixed = *mixed_task;
  // lr schedule: 0 first (masters stay on their ties), then the kind's lr; step 3 is skipped.
  const double lr = cell.kind.config.lr;
  const double lrs[] = {0.0, lr, lr * 0.5, lr, 0.0, lr};
  int64_t checked_stochastic_changes = 0;
  for (int s = 0; s < 6; ++s) {
    const bool poison = s == 3;
    for (Task* task : {&plain, &mixed}) {
      set_gradients(*task, s, poison);
      task->set_lr(lrs[s]);
    }
    std::vector<std::vector<uint16_t>> before(mixed.num_params());
    for (size_t p = 0; p < mixed.num_params(); ++p) {
      before[p].resize(static_cast<size_t>(mixed.param(p).numel()));
      mixed.read_model_copy(p, before[p].data());
    }
    plain.step();
    mixed.step();
    ASSERT_EQ(mixed.last_step_skipped(), poison);
    const int64_t t = mixed.step_count();
    for (size_t p = 0; p < mixed.num_params(); ++p) {
      const size_t n = static_cast<size_t>(mixed.param(p).numel());
      for (Family f : {Family::kW, Family::kM, Family::kV}) {
        if (!mixed.plan().has_family(f)) continue;
        std::vector<float> a(n), b(n);
        plain.read(f, p, a.data());
        mixed.read(f, p, b.data());
        ASSERT_TRUE(testing_util::same_bits(a, b)) << family_name(f) << " of " << mixed.param(p).name << " step " << s;
      }
      std::vector<float> w(n);
      std::vector<uint16_t> copy(n);
      mixed.read(Family::kW, p, w.data());
      mixed.read_model_copy(p, copy.data());
      if (poison) {
        ASSERT_EQ(copy, before[p]) << "a skipped step wrote the copy of " << mixed.param(p).name;
        continue;
      }
      const std::vector<uint16_t> want = expected_copy(cell, w, static_cast<uint32_t>(p), t);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(copy[i], want[i]) << mixed.param(p).name << "[" << i << "] step " << s << " t " << t
                                    << " master " << std::hexfloat << w[i];
      }
      if (cell.rounding == Rounding::kStochastic) {
        for (size_t i = 0; i < n; ++i) checked_stochastic_changes += copy[i] != precision_oracle::oracle_rne(
            cell.precision == Precision::kBf16 ? Fmt::kBf16 : Fmt::kF16, w[i]);
      }
    }
  }
  // Stochastic rounding must actually differ from nearest somewhere (else the key went unseen).
  if (cell.rounding == Rounding::kStochastic) {
    EXPECT_GT(checked_stochastic_changes, 1000);
  }
}

// Threads (CPU) or launch shape (CUDA) change no bit. (CUDA's fingerprint against the CPU's, every
// kind, precision and rounding: the conformance suite's precision cells.)
TEST_P(MixedPrecision, FingerprintCoversTheCopyAndIgnoresThreads) {
  const Cell& cell = GetParam();
  RN_SKIP_IF_UNAVAILABLE(cell.backend);
  std::vector<std::string> prints;
  for (int threads : {1, 2}) {
    auto task = make_task(cell, true, threads, cell.backend);
    for (int s = 0; s < 3; ++s) {
      set_gradients(*task, s, false);
      task->step();
    }
    prints.push_back(task->fingerprint());
  }
  EXPECT_EQ(prints[0], prints[1]);
  auto plain = make_task(cell, false, 1, cell.backend);
  for (int s = 0; s < 3; ++s) {
    set_gradients(*plain, s, false);
    plain->step();
  }
  EXPECT_NE(plain->fingerprint(), prints[0]);
}

// Every Highway target the library was built for gives the default target's fingerprint
// (masters, M, V, copy, t). Instantiated over the CPU cells only: Highway targets are a CPU matter.
class MixedPrecisionCpu : public ::testing::TestWithParam<Cell> {};

TEST_P(MixedPrecisionCpu, HighwayTargetsGiveTheSameFingerprint) {
  const Cell& cell = GetParam();
  auto print = [&] {
    auto task = make_task(cell, true, 2, BackendKind::kCpu);
    for (int s = 0; s < 3; ++s) {
      set_gradients(*task, s, s == 1);
      task->step();
    }
    return task->fingerprint();
  };
  const std::string reference = print();
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    const testing_util::OnlySimdTarget only(target);
    EXPECT_EQ(print(), reference) << hwy::TargetName(target);
  }
}

INSTANTIATE_TEST_SUITE_P(Cells, MixedPrecision, ::testing::ValuesIn(all_cells()), cell_name);
INSTANTIATE_TEST_SUITE_P(Cells, MixedPrecisionCpu, ::testing::ValuesIn(all_cells({BackendKind::kCpu})), cell_name);

TEST(MixedPrecisionApi, RefusalsAreExplicit) {
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  options.precision = {Precision::kFp32, Rounding::kStochastic, 1};
  Task bad(layout(), options);
  bad.optimizer(AdamW());
  EXPECT_THROW(bad.compile(), Error);
  Task plain(layout(), options_cpu());
  plain.optimizer(AdamW());
  plain.compile();
  std::vector<uint16_t> c(3);
  EXPECT_THROW(plain.read_model_copy(0, c.data()), Error);
  options.precision = {Precision::kBf16, Rounding::kNearest, 0};
  Task mixed(layout(), options);
  mixed.optimizer(AdamW());
  mixed.compile();
  const std::string path = testing_util::unique_temp_path("mixed.ckpt");
  mixed.save(path);                           // a bf16 checkpoint (version 3) ...
  EXPECT_THROW(plain.load(path), Error);      // ... is not an fp32 task's
  std::remove(path.c_str());
}

}  // namespace
}  // namespace renaissance
