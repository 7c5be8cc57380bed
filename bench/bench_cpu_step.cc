// CPU benchmarks (Google Benchmark): every optimizer kind on the resnet50, bert_base and
// gpt2_small layouts at 1, 2 and all threads, with bytes moved and GB/s at the ideal traffic of
// docs/design.md; the AdamW step with the non-finite check; the backend's same-traffic reference
// over the very same arena spans (cpu::run_same_traffic_pass, the one implementation behind
// Backend::same_traffic_gbps: reads w, g, m, v and writes w, m, v with trivial arithmetic, the
// memory-system limit of the Adam access pattern); the AdamW kernel alone on data in L1
// (ComputeOnly: the arithmetic's share of a step); and a large memcpy. A memcpy is a poor
// floor for an in-place update, since it pays for write-allocate: it is here for reference.
// bench/compare_torch.py runs the resnet50 AdamW and same-traffic rows.
//
//   bench_cpu_step --benchmark_filter='Step/adamw/resnet50'   (see --benchmark_list_tests)
//   bench_cpu_step serve LAYOUT THREADS CHECK   (one AdamW task driven over stdin: bench/cpu_ab.py)
//
// The backend's switches (RENAISSANCE_CPU_*, tools/program_env.h) apply to every row.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <hwy/highway.h>

#include "backend_cpu/cpu_ops.h"
#include "backend_cpu/ops_adam.h"
#include "renaissance/backend.h"
#include "renaissance/layout.h"
#include "renaissance/task.h"
#include "tools/program_env.h"

namespace renaissance {
namespace bench {

namespace {

const char* const kLayouts[] = {"resnet50", "bert_base", "gpt2_small"};

// The CPU backend's switches as the environment sets them (RENAISSANCE_CPU_*), read once.
const CpuTuning& env_tuning() {
  static const CpuTuning tuning = program_env::cpu_tuning_from_env();
  return tuning;
}
constexpr double kAdamBytesPerParam = 28.0;  // reads w, g, m, v; writes w, m, v

// Building a Task for gpt2_small takes a second and 2 GB; Google Benchmark calls a benchmark
// function several times, so the last task is kept and reused while the key does not change.
Task& cached_task(const std::string& layout, OptimizerKind kind, int threads, bool check) {
  static std::unique_ptr<Task> task;
  static std::string key;
  const std::string want = layout + "/" + optimizer_kind_name(kind) + "/" + std::to_string(threads) + "/" +
                           std::to_string(check);
  if (!task || key != want) {
    task.reset();
    TaskOptions options;
    options.backend = BackendKind::kCpu;
    options.backend_options.threads = threads;
    options.backend_options.cpu = env_tuning();
    options.check_finite = check;
    task = std::make_unique<Task>(builtin_layout(layout).params, options);
    task->optimizer(bench_config(kind));
    task->compile();
    task->synthesize_gradients(1, 0, 1e-3f);
    key = want;
  }
  return *task;
}

uint64_t param_count(const Task& task) {
  uint64_t n = 0;
  for (size_t i = 0; i < task.num_params(); ++i) n += static_cast<uint64_t>(task.param(i).numel());
  return n;
}

void finish(benchmark::State& state, uint64_t params, double bytes_per_param, int threads) {
  state.SetBytesProcessed(static_cast<int64_t>(static_cast<double>(state.iterations()) * params * bytes_per_param));
  state.counters["params"] = static_cast<double>(params);
  state.counters["bytes_per_param"] = bytes_per_param;
  state.counters["threads"] = threads;
}

void step(benchmark::State& state, std::string layout, OptimizerKind kind, int threads, bool check) {
  Task& task = cached_task(layout, kind, threads, check);
  for (auto _ : state) task.step();
  finish(state, param_count(task), bytes_per_param(kind, check), threads);
}

void same_traffic(benchmark::State& state, std::string layout, int threads) {
  Task& task = cached_task(layout, OptimizerKind::kAdamW, threads, false);
  cpu::CpuContext ctx;
  ctx.arena = static_cast<char*>(task.backend().arena());
  ctx.threads = threads;
  ctx.tuning = env_tuning();  // the step's chunking and schedule
  const std::vector<TrafficPass> passes = same_traffic_passes(task.plan(), OptimizerKind::kAdamW, false);
  uint32_t fold = 0;
  for (auto _ : state) {
    for (const TrafficPass& p : passes) fold ^= cpu::run_same_traffic_pass(ctx, p, 0);
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(fold);
  finish(state, param_count(task), kAdamBytesPerParam, threads);
}

// The compute side of the AdamW step alone: the step's own chunk kernel (ops_adam.h) run `params` elements' worth over one 1024-element buffer per
// thread (4 arrays x 4 KiB, inside every L1d), so memory costs nothing. If this is close to the
// step's time, the step is bound by its arithmetic (the IEEE division and square root), not by
// memory. Coefficients of a typical step 10 (bias corrections 1/(1 - beta^10)); returns ms.
double compute_only_ms(uint64_t params, int threads) {
  constexpr size_t kL1Elements = 1024;
  float s[kNumScalarF32] = {};
  s[kLr] = 1e-3f;
  s[kWeightDecay] = 1e-2f;
  s[kDecayFactor] = 1.0f - 1e-5f;
  s[kBeta1] = 0.9f;
  s[kBeta2] = 0.999f;
  s[kOneMinusBeta1] = 0.1f;
  s[kOneMinusBeta2] = 0.001f;
  s[kEps] = 1e-8f;
  s[kInvLossScale] = 1.0f;
  s[kBiasCorrection1] = 1.5353f;
  s[kBiasCorrection2] = 100.5f;
  s[kClipCoefficient] = 1.0f;
  const cpu::ElementwiseFn fn = cpu::adam_kernel(true);
  const int64_t reps = static_cast<int64_t>((params + kL1Elements - 1) / kL1Elements);
  std::vector<float> arrays(static_cast<size_t>(threads) * 4 * kL1Elements + 16);
  float* base = arrays.data() + (16 - reinterpret_cast<uintptr_t>(arrays.data()) / 4 % 16) % 16;  // 64-B aligned
  for (size_t i = 0; i < static_cast<size_t>(threads) * 4 * kL1Elements; ++i) {
    const float x = static_cast<float>(i % 97) * 1e-3f;
    // g stays in [0.01, 0.11], so m and v settle near g and g^2 and never become subnormal
    // (Intel takes a slow microcode assist on subnormal operands, which a real step never sees).
    base[i] = (i / kL1Elements) % 4 == 3 ? x * x + 1e-4f : x + 0.01f;
  }
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  {
    float* w = base + static_cast<size_t>(omp_get_thread_num()) * 4 * kL1Elements;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < reps; ++r) fn(w, w + kL1Elements, w + 2 * kL1Elements, w + 3 * kL1Elements, kL1Elements, s, CoeffSet::kWeight, false);
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  benchmark::DoNotOptimize(base[0]);
  return ms;
}

void compute_only(benchmark::State& state, uint64_t params, int threads) {
  for (auto _ : state) state.SetIterationTime(compute_only_ms(params, threads) / 1e3);
  finish(state, params, kAdamBytesPerParam, threads);
}

void large_memcpy(benchmark::State& state, uint64_t bytes, int threads) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const int64_t chunk = 1 << 20;
  const int64_t chunks = static_cast<int64_t>((bytes + chunk - 1) / chunk);
  for (auto _ : state) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t c = 0; c < chunks; ++c) {
      const uint64_t b = static_cast<uint64_t>(c * chunk);
      std::memcpy(dst.data() + b, src.data() + b, std::min<uint64_t>(bytes, b + chunk) - b);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * bytes));  // read + write
  state.counters["threads"] = threads;
}

void register_all() {
  std::vector<int> thread_counts = {1, 2};
  if (omp_get_num_procs() > 2) thread_counts.push_back(omp_get_num_procs());
  for (const char* layout : kLayouts) {
    for (int threads : thread_counts) {
      for (int k = 0; k < kNumOptimizerKinds; ++k) {
        const auto kind = static_cast<OptimizerKind>(k);
        const std::string name = std::string("Step/") + optimizer_kind_name(kind) + "/" + layout + "/" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), step, std::string(layout), kind, threads, false)
            ->Unit(benchmark::kMillisecond)->UseRealTime();
      }
      const std::string checked = std::string("StepChecked/adamw/") + layout + "/" + std::to_string(threads);
      benchmark::RegisterBenchmark(checked.c_str(), step, std::string(layout), OptimizerKind::kAdamW, threads, true)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
      const std::string same = std::string("SameTraffic/") + layout + "/" + std::to_string(threads);
      benchmark::RegisterBenchmark(same.c_str(), same_traffic, std::string(layout), threads)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
    }
  }
  for (int threads : thread_counts) {
    const std::string name = "ComputeOnly/adamw/1M/" + std::to_string(threads);
    benchmark::RegisterBenchmark(name.c_str(), compute_only, uint64_t{1} << 20, threads)
        ->Unit(benchmark::kMillisecond)->UseManualTime();
  }
  for (int threads : thread_counts) {
    const std::string name = "Memcpy/1GiB/" + std::to_string(threads);
    benchmark::RegisterBenchmark(name.c_str(), large_memcpy, uint64_t{1} << 30, threads)
        ->Unit(benchmark::kMillisecond)->UseRealTime();
  }
}

// Kilobytes of this process's anonymous memory on transparent huge pages (0 where the kernel
// does not say), to show whether RENAISSANCE_CPU_HUGEPAGES took effect.
long anon_huge_kb() {
  std::ifstream in("/proc/self/smaps_rollup");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("AnonHugePages:", 0) == 0) return std::strtol(line.c_str() + 14, nullptr, 10);
  }
  return 0;
}

// One AdamW task (the check on or off) kept alive while bench/cpu_ab.py interleaves it with
// torch and the other variants. Commands on stdin, one JSON line back for each:
//   step N         N steps, each timed (Backend::timed_steps)       -> {"ms": [...]}
//   same N         N runs of the task's same-traffic passes          -> {"ms": [...]}
//   compute N      N runs of the AdamW kernel over as many elements, in L1 -> {"ms": [...]}
//   fingerprint    the task's fingerprint (variants must all agree)  -> {"fingerprint": "..."}
//   quit
int serve(const std::string& layout, int threads, bool check) {
  Task& task = cached_task(layout, OptimizerKind::kAdamW, threads, check);
  const std::vector<TrafficPass> passes = same_traffic_passes(task.plan(), OptimizerKind::kAdamW, check);
  const double pass_bytes = traffic_bytes(passes);
  task.timed_steps(1);  // every page of the step faulted in before the huge-page count
  std::printf("{\"ready\": true, \"backend\": \"%s\", \"params\": %llu, \"bytes_per_step\": %.0f, "
              "\"same_traffic_bytes\": %.0f, \"anon_huge_kb\": %ld}\n",
              task.backend().describe().c_str(), static_cast<unsigned long long>(param_count(task)),
              static_cast<double>(param_count(task)) * bytes_per_param(OptimizerKind::kAdamW, check), pass_bytes,
              anon_huge_kb());
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream words(line);
    std::string command;
    int count = 1;
    words >> command >> count;
    std::vector<double> ms;
    if (command == "step") {
      ms = task.timed_steps(std::max(count, 1));
    } else if (command == "same") {
      for (int i = 0; i < std::max(count, 1); ++i) ms.push_back(pass_bytes / task.backend().same_traffic_gbps(passes, 1) / 1e6);
    } else if (command == "compute") {
      for (int i = 0; i < std::max(count, 1); ++i) ms.push_back(compute_only_ms(param_count(task), threads));
    } else if (command == "fingerprint") {
      std::printf("{\"fingerprint\": \"%s\"}\n", task.fingerprint().c_str());
      std::fflush(stdout);
      continue;
    } else if (command == "quit") {
      return 0;
    } else {
      std::fprintf(stderr, "bench_cpu_step serve: unknown command '%s'\n", line.c_str());
      return 2;
    }
    std::string out = "{\"ms\": [";
    for (size_t i = 0; i < ms.size(); ++i) out += (i ? ", " : "") + std::to_string(ms[i]);
    std::printf("%s]}\n", out.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace renaissance

int main(int argc, char** argv) {
  // RENAISSANCE_BENCH_NO_AVX512=1 keeps Highway off its AVX-512 targets, to tell the cost of
  // the arithmetic at 512 bits from the memory traffic on machines that have it.
  const char* no_avx512 = std::getenv("RENAISSANCE_BENCH_NO_AVX512");
  if (no_avx512 != nullptr && std::strcmp(no_avx512, "1") == 0) hwy::DisableTargets(HWY_AVX3 | HWY_AVX3_DL);
  if (argc >= 2 && std::strcmp(argv[1], "serve") == 0) {
    if (argc != 5) {
      std::fprintf(stderr, "usage: bench_cpu_step serve LAYOUT THREADS CHECK(0|1)\n");
      return 2;
    }
    return renaissance::bench::serve(argv[2], std::atoi(argv[3]), std::strcmp(argv[4], "1") == 0);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  renaissance::bench::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
