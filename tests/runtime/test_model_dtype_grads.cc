// Gradients in the model dtype (PrecisionOptions::model_dtype_gradients): for every
// kind x {bf16, fp16} x {nearest, stochastic}, a task fed bf16/fp16 gradient encodings gives the
// bits (masters, M, V, model copy, t, last gradient norm) of the same task with fp32 gradients fed
// the exactly widened values: plain, with clipping and a loss scale (GRAD_NORM_PARTIALS, the
// fused check), and with two hyperparameter groups (the H > 1 walk). On CUDA the fingerprint is
// also the CPU's (the lockstep check `scripts/gpu.sh test` runs on the GPU machine). Besides: fp16
// overflow to inf in a gradient skips the step and writes nothing; synthesize_gradients and
// poison_gradient round to nearest even; the API refuses what does not fit; checkpoints carry no G.
#include <gtest/gtest.h>

#include <cstdio>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <fstream>
#include <iterator>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/math/precision.h"
#include "renaissance/math/synthetic_gradient.h"
#include "renaissance/task.h"
#include "support/optimizer_cases.h"
#include "support/precision_cells.h"
#include "support/precision_oracle.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using precision_oracle::Fmt;

enum class Variant { kPlain, kClipAndScale, kTwoGroups };
const char* variant_name(Variant v) {
  return v == Variant::kPlain ? "plain" : v == Variant::kClipAndScale ? "clip" : "groups";
}

using precision_cells::Cell;
using precision_cells::all_cells;
using precision_cells::cell_name;

// Both groups, several tensors per role; w1 crosses the CPU chunk and the norm tiles at indices
// that are not multiples of 4 (the 2-byte G's 128-byte role starts are exercised too). In
// kTwoGroups the odd tensors are hyperparameter group 1.
std::vector<ParamSpec> layout(Variant v) {
  std::vector<ParamSpec> params = {{"b0", {3}, Role::kBnBias},     {"w0", {5}, Role::kFcWeight},
                                   {"w1", {20003}, Role::kFcWeight}, {"bw", {2, 33}, Role::kBnWeight},
                                   {"fb", {70}, Role::kFcBias},       {"conv", {3, 3, 7}, Role::kDeepConv},
                                   {"first", {129}, Role::kFirstConv}};
  if (v == Variant::kTwoGroups) {
    for (size_t i = 0; i < params.size(); ++i) params[i].hyper_group = static_cast<int>(i % 2);
  }
  return params;
}

constexpr uint64_t kSeed = 0x0ddba11c0ffee123ULL;

std::unique_ptr<Task> make_task(const Cell& cell, Variant v, bool model_dtype_grads, BackendKind backend,
                                int threads = 1) {
  TaskOptions options;
  options.backend = backend;
  options.backend_options.threads = threads;
  if (backend == BackendKind::kCuda && threads == 1) options.backend_options.cuda_block = 64;
  options.precision = {cell.precision, cell.rounding, kSeed};
  options.precision.model_dtype_gradients = model_dtype_grads;
  auto task = std::make_unique<Task>(layout(v), options);
  OptimizerConfig config = cell.kind.config;
  if (v == Variant::kClipAndScale) config.max_grad_norm = 0.05;
  if (v == Variant::kTwoGroups) {
    OptimizerConfig other = config;
    other.lr = config.lr * 0.25;
    other.weight_decay = config.weight_decay * 2.0;
    task->optimizer_groups({config, other});
  } else {
    task->optimizer(config);
  }
  task->compile();
  if (v == Variant::kClipAndScale) task->set_loss_scale(256.0);
  for (size_t p = 0; p < task->num_params(); ++p) {
    std::vector<float> w(static_cast<size_t>(task->param(p).numel()));
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = static_cast<float>(0.05 * std::sin(1.3 * static_cast<double>(i) + 0.7 * static_cast<double>(p)) + 0.003);
    }
    task->set_weight(p, w.data());
  }
  return task;
}

// The model-dtype encodings of step s's gradient of parameter p: ordinary magnitudes, every 9th
// element tiny (fp16 subnormals), every 13th an exact zero, every 17th large (scaled by the loss
// scale in kClipAndScale); element 17 of w1 a NaN encoding when `poison`.
std::vector<uint16_t> gradient_encodings(Fmt fmt, size_t p, size_t n, int s, double scale, bool poison) {
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) {
    double g = 0.02 * std::cos(0.9 * static_cast<double>(i) + 1.1 * s + static_cast<double>(p));
    if (i % 9 == 4) g *= 1e-4;
    if (i % 13 == 6) g = 0.0;
    if (i % 17 == 8) g *= 40.0;
    h[i] = precision_oracle::oracle_rne(fmt, static_cast<float>(g * scale));
    if (poison && p == 2 && i == 17) h[i] = fmt == Fmt::kBf16 ? 0x7fc0 : 0x7e00;  // a quiet NaN
  }
  return h;
}

std::vector<float> widen(Fmt fmt, const std::vector<uint16_t>& h) {
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) out[i] = fmt == Fmt::kBf16 ? math::bf16_to_f32(h[i]) : math::f16_to_f32(h[i]);
  return out;
}

Fmt fmt_of(const Cell& cell) { return cell.precision == Precision::kBf16 ? Fmt::kBf16 : Fmt::kF16; }

// Runs 5 steps (step 2 poisoned, lr changes) on both tasks, feeding `narrow` the encodings and
// `wide` their widened floats; returns the narrow task's fingerprint after checking every step.
std::string run_pair(const Cell& cell, Variant v, Task& narrow, Task& wide) {
  const Fmt fmt = fmt_of(cell);
  const double scale = v == Variant::kClipAndScale ? 256.0 : 1.0;
  for (int s = 0; s < 5; ++s) {
    const bool poison = s == 2;
    for (size_t p = 0; p < narrow.num_params(); ++p) {
      const auto h = gradient_encodings(fmt, p, static_cast<size_t>(narrow.param(p).numel()), s, scale, poison);
      narrow.write_grad_encoded(p, h.data());
      const auto f = widen(fmt, h);
      wide.set_grad(p, f.data());
    }
    if (s == 3) {
      narrow.set_lr(cell.kind.config.lr * 0.5);
      wide.set_lr(cell.kind.config.lr * 0.5);
    }
    narrow.step();
    wide.step();
    EXPECT_EQ(narrow.last_step_skipped(), poison) << "step " << s;
    EXPECT_EQ(wide.last_step_skipped(), poison) << "step " << s;
    EXPECT_EQ(narrow.fingerprint(), wide.fingerprint()) << variant_name(v) << " step " << s;
    if (v == Variant::kClipAndScale) {
      const double a = narrow.last_grad_norm(), b = wide.last_grad_norm();
      EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "grad norm " << a << " vs " << b << " step " << s;
      EXPECT_GT(a, 0.0);
    }
  }
  return narrow.fingerprint();
}

class MixedPrecisionModelDtypeGrads : public ::testing::TestWithParam<Cell> {};

// The model-dtype gradients are exactly the widened fp32 gradients to every op.
TEST_P(MixedPrecisionModelDtypeGrads, SameBitsAsFp32GradientsOfTheWidenedValues) {
  const Cell& cell = GetParam();
  RN_SKIP_IF_UNAVAILABLE(cell.backend);
  for (Variant v : {Variant::kPlain, Variant::kClipAndScale, Variant::kTwoGroups}) {
    auto narrow = make_task(cell, v, true, cell.backend), wide = make_task(cell, v, false, cell.backend);
    ASSERT_EQ(narrow->grad_dtype(), cell.precision);
    const std::string print = run_pair(cell, v, *narrow, *wide);
    if (cell.backend != BackendKind::kCpu) {
      // CPU == CUDA (and the launch shape, block 64 here, changes no bit): the CPU pair.
      auto cpu_narrow = make_task(cell, v, true, BackendKind::kCpu, 2);
      auto cpu_wide = make_task(cell, v, false, BackendKind::kCpu, 2);
      EXPECT_EQ(run_pair(cell, v, *cpu_narrow, *cpu_wide), print) << "CPU and CUDA differ, " << variant_name(v);
    } else if (v == Variant::kClipAndScale) {
      // Threads change no bit (one variant: the one that runs the most ops).
      auto two_narrow = make_task(cell, v, true, BackendKind::kCpu, 2);
      auto two_wide = make_task(cell, v, false, BackendKind::kCpu, 2);
      EXPECT_EQ(run_pair(cell, v, *two_narrow, *two_wide), print) << "1 and 2 threads differ, " << variant_name(v);
    }
  }
}

// Overflow in the model dtype: a finite float gradient beyond the largest finite value (fp16: 1e5
// written as floats, 1e6 through poison_gradient; bf16: FLT_MAX, which rounds to bf16 inf) is inf
// in G and the step is skipped: no master, M, V or copy bit changes, with or without clipping's
// fused check.
TEST_P(MixedPrecisionModelDtypeGrads, OverflowToInfSkipsTheStep) {
  const Cell& cell = GetParam();
  RN_SKIP_IF_UNAVAILABLE(cell.backend);
  const bool fp16 = cell.precision == Precision::kFp16;
  const float big = fp16 ? 1e5f : std::numeric_limits<float>::max();
  for (Variant v : {Variant::kPlain, Variant::kClipAndScale}) {
    for (int how = 0; how < 2; ++how) {
      auto task = make_task(cell, v, true, cell.backend);
      for (size_t p = 0; p < task->num_params(); ++p) {
        std::vector<float> g(static_cast<size_t>(task->param(p).numel()), 0.01f);
        if (how == 0 && p == 5) g[7] = big;
        task->set_grad(p, g.data());
      }
      if (how == 1) task->poison_gradient(2, 19999, fp16 ? 1e6f : big);
      std::vector<float> widened(20003);
      task->read(Family::kG, 2, widened.data());
      EXPECT_EQ(std::isinf(widened[19999]), how == 1);
      const std::string before = task->fingerprint();
      task->step();
      EXPECT_TRUE(task->last_step_skipped()) << variant_name(v) << " how " << how;
      EXPECT_EQ(task->fingerprint(), before) << "a skipped step wrote something";
      EXPECT_EQ(task->step_count(), 0);
      // The same gradients without the overflow step normally.
      for (size_t p = 0; p < task->num_params(); ++p) {
        std::vector<float> g(static_cast<size_t>(task->param(p).numel()), 0.01f);
        task->set_grad(p, g.data());
      }
      task->step();
      EXPECT_FALSE(task->last_step_skipped());
      EXPECT_NE(task->fingerprint(), before);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cells, MixedPrecisionModelDtypeGrads, ::testing::ValuesIn(all_cells()), cell_name);

TaskOptions grad_options(Precision p, BackendKind backend = BackendKind::kCpu) {
  TaskOptions options;
  options.backend = backend;
  options.precision = {p, Rounding::kNearest, 0};
  options.precision.model_dtype_gradients = true;
  return options;
}

// synthesize_gradients writes math::synthetic_gradient rounded to nearest even in the model
// dtype (checked against the oracle's rounding), on every backend; read(kG) widens exactly.
TEST(MixedPrecisionModelDtypeGradsApi, SynthesizedGradientsAreRoundedToNearestEven) {
  for (BackendKind backend : testing_util::backends_under_test()) {
    RN_SKIP_IF_UNAVAILABLE(backend);
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      const Fmt fmt = p == Precision::kBf16 ? Fmt::kBf16 : Fmt::kF16;
      Task task(layout(Variant::kPlain), grad_options(p, backend));
      task.optimizer(AdamW());
      task.compile();
      task.synthesize_gradients(7, 3, 2.0f);
      size_t inexact = 0;
      for (size_t id = 0; id < task.num_params(); ++id) {
        const size_t n = static_cast<size_t>(task.param(id).numel());
        std::vector<uint16_t> h(n);
        std::vector<float> f(n);
        task.read_grad_encoded(id, h.data());
        task.read(Family::kG, id, f.data());
        for (size_t i = 0; i < n; ++i) {
          const float x = math::synthetic_gradient(7, 3, id, i, 2.0f);
          ASSERT_EQ(h[i], precision_oracle::oracle_rne(fmt, x)) << task.param(id).name << "[" << i << "]";
          ASSERT_EQ(static_cast<double>(f[i]), precision_oracle::decode(fmt, h[i]));
          inexact += f[i] != x;
        }
      }
      EXPECT_GT(inexact, 1000u) << "the synthetic values were already representable: nothing was rounded";
    }
  }
}

TEST(MixedPrecisionModelDtypeGradsApi, RefusalsAreExplicit) {
  TaskOptions fp32 = grad_options(Precision::kFp32);
  Task bad(layout(Variant::kPlain), fp32);
  bad.optimizer(AdamW());
  EXPECT_THROW(bad.compile(), Error);  // model-dtype gradients of an fp32 model
  Task task(layout(Variant::kPlain), grad_options(Precision::kBf16));
  task.optimizer(AdamW());
  task.compile();
  EXPECT_THROW(task.grad(0), Error);  // not floats
  EXPECT_NE(task.grad_data(0), nullptr);
  TaskOptions cpu;
  cpu.backend = BackendKind::kCpu;
  Task plain(layout(Variant::kPlain), cpu);
  plain.optimizer(AdamW());
  plain.compile();
  std::vector<uint16_t> h(3);
  EXPECT_THROW(plain.write_grad_encoded(0, h.data()), Error);
  EXPECT_THROW(plain.read_grad_encoded(0, h.data()), Error);
  EXPECT_EQ(plain.grad_dtype(), Precision::kFp32);
  EXPECT_THROW(task.poison_gradient(0, 3, NAN), Error);  // outside b0's 3 elements
}

// G is not part of a checkpoint: two tasks that differ only in G save the same bytes, and a load
// leaves G as it was.
TEST(MixedPrecisionModelDtypeGradsApi, CheckpointsDoNotStoreGradients) {
  const std::string a_path = testing_util::unique_temp_path("g_a.ckpt"), b_path = testing_util::unique_temp_path("g_b.ckpt");
  Task a(layout(Variant::kPlain), grad_options(Precision::kFp16));
  Task b(layout(Variant::kPlain), grad_options(Precision::kFp16));
  for (Task* t : {&a, &b}) {
    t->optimizer(AdamW());
    t->compile();
  }
  a.synthesize_gradients(1, 1, 1.0f);
  b.synthesize_gradients(2, 1, 1.0f);
  a.save(a_path);
  b.save(b_path);
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(a_path), bytes(b_path));
  std::vector<uint16_t> before(20003), after(20003);
  b.read_grad_encoded(2, before.data());
  b.load(a_path);
  b.read_grad_encoded(2, after.data());
  EXPECT_EQ(before, after);
  std::remove(a_path.c_str());
  std::remove(b_path.c_str());
}

}  // namespace
}  // namespace renaissance
