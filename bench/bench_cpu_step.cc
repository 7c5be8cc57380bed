// CPU step benchmark: the AdamW step on the resnet50 layout at 1 and 2 threads, side by side
// with a same-traffic streaming kernel over the very same arena spans (reads w, g, m, v and
// writes w, m, v with trivial arithmetic). That kernel is the memory-system limit for this
// access pattern; a memcpy is not, since it pays for write-allocate and an in-place update
// does not. bench/report_cpu.py turns the JSON output into the RESULTS.md table.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/bench_cpu_step.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// w += g; m += g; v += g over [0, n): the same loads and stores as an Adam update.
void SameTraffic(float* HWY_RESTRICT w, const float* HWY_RESTRICT g, float* HWY_RESTRICT m,
                 float* HWY_RESTRICT v, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  for (size_t i = 0; i + lanes <= n; i += lanes) {
    const auto vg = hn::LoadU(d, g + i);
    hn::StoreU(hn::Add(hn::LoadU(d, w + i), vg), d, w + i);
    hn::StoreU(hn::Add(hn::LoadU(d, m + i), vg), d, m + i);
    hn::StoreU(hn::Add(hn::LoadU(d, v + i), vg), d, v + i);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace bench
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <benchmark/benchmark.h>

#include <memory>
#include <string>
#include <vector>

#include "backend_cpu/cpu_backend.h"
#include "renaissance/layout.h"
#include "renaissance/task.h"

namespace renaissance {
namespace bench {

HWY_EXPORT(SameTraffic);

namespace {

constexpr double kAdamBytesPerParam = 28.0;  // reads w, g, m, v; writes w, m, v (DESIGN.md §5)

std::unique_ptr<Task> make_task(const std::string& layout, OptimizerConfig config, int threads, bool check) {
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  options.backend_options.threads = threads;
  options.check_finite = check;
  auto task = std::make_unique<Task>(builtin_layout(layout).params, options);
  task->optimizer(config);
  task->compile();
  task->synthesize_gradients(1, 0, 1e-3f);
  return task;
}

uint64_t param_count(const Task& task) {
  uint64_t n = 0;
  for (size_t i = 0; i < task.num_params(); ++i) n += static_cast<uint64_t>(task.param(i).numel());
  return n;
}

void set_counters(benchmark::State& state, uint64_t params, double bytes_per_param) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * params * bytes_per_param));
  state.counters["params"] = static_cast<double>(params);
  state.counters["threads"] = static_cast<double>(state.range(0));
}

void BM_AdamWStep(benchmark::State& state, bool check) {
  auto task = make_task("resnet50", AdamW().lr(1e-3).weight_decay(0.01).config(), static_cast<int>(state.range(0)), check);
  for (auto _ : state) task->step();
  set_counters(state, param_count(*task), kAdamBytesPerParam);
}

void BM_SameTraffic(benchmark::State& state) {
  auto task = make_task("resnet50", AdamW().config(), static_cast<int>(state.range(0)), false);
  const MemoryPlan& plan = task->plan();
  char* arena = static_cast<char*>(task->backend().arena());
  cpu::CpuContext ctx;
  ctx.arena = arena;
  ctx.threads = static_cast<int>(state.range(0));
  auto* fn = &HWY_DYNAMIC_DISPATCH(SameTraffic);
  for (auto _ : state) {
    for (Group group : {Group::kWeight, Group::kBiasLike}) {
      float* w = ctx.at<float>(plan.group_span(Family::kW, group));
      float* g = ctx.at<float>(plan.group_span(Family::kG, group));
      float* m = ctx.at<float>(plan.group_span(Family::kM, group));
      float* v = ctx.at<float>(plan.group_span(Family::kV, group));
      cpu::parallel_chunks(ctx, plan.group_span(Family::kW, group).count, [&](uint64_t b, uint64_t e) {
        fn(w + b, g + b, m + b, v + b, e - b);
      });
    }
    benchmark::ClobberMemory();
  }
  set_counters(state, param_count(*task), kAdamBytesPerParam);
}

BENCHMARK_CAPTURE(BM_AdamWStep, resnet50, false)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_AdamWStep, resnet50_checked, true)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SameTraffic)->Name("BM_SameTraffic/resnet50")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace bench
}  // namespace renaissance

BENCHMARK_MAIN();
#endif  // HWY_ONCE
