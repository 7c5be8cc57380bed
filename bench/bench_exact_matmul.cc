// The CPU's exact product (backend_cpu/exact_matmul_cpu.h) against the scalar reference
// (math::exact_matmul_reference) and the exact Newton–Schulz on Muon's matrix shapes (Google
// Benchmark). GOPS counts a multiply and an add as two operations: 2 m k n per product.
//
//   bench_exact_matmul --benchmark_filter='Fast/768/3072/768'
//
// Rows: Fast/m/k/n/threads/unit and Reference/m/k/n (one iteration: it is slow),
// NewtonSchulz/rows/cols/threads/unit (5 steps, torch's coefficients). unit 0: the best product unit
// of this CPU (the AMX tiles where it has them), 1: the SIMD lanes; the label names the one that
// ran. Threads 1, 2 and 16 (the GPU machine's host); the CPU column times the calling thread only,
// so compare rows by their real time.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <string>
#include <vector>

#include "backend_cpu/exact_matmul_cpu.h"
#include "renaissance/math/exact_matmul.h"

namespace {

std::vector<float> normal(size_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(count);
  for (float& v : x) v = nd(rng);
  return x;
}

renaissance::cpu::ExactProductUnit unit_of(const benchmark::State& state, int arg) {
  return state.range(arg) == 0 ? renaissance::cpu::ExactProductUnit::kBest : renaissance::cpu::ExactProductUnit::kSimdLanes;
}

void set_label(benchmark::State& state, renaissance::cpu::ExactProductUnit unit) {
  state.SetLabel(renaissance::cpu::exact_products_on_tiles(unit) ? "amx tiles" : std::string("simd lanes, ") + renaissance::cpu::exact_matmul_target());
}

void set_gops(benchmark::State& state, double ops_per_iteration) {
  state.counters["GOPS"] = benchmark::Counter(ops_per_iteration * 1e-9 * static_cast<double>(state.iterations()),
                                              benchmark::Counter::kIsRate);
}

void Fast(benchmark::State& state) {
  const size_t m = state.range(0), k = state.range(1), n = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  const std::vector<float> a = normal(m * k, 1), b = normal(k * n, 2);
  std::vector<float> c(m * n);
  renaissance::cpu::ExactMatmulScratch scratch;
  scratch.unit = unit_of(state, 4);
  set_label(state, scratch.unit);
  for (auto _ : state) {
    renaissance::cpu::exact_matmul_cpu(a.data(), b.data(), c.data(), m, k, n, &scratch, threads);
    benchmark::DoNotOptimize(c.data());
  }
  set_gops(state, 2.0 * m * k * n);
}

void Reference(benchmark::State& state) {
  const size_t m = state.range(0), k = state.range(1), n = state.range(2);
  const std::vector<float> a = normal(m * k, 1), b = normal(k * n, 2);
  std::vector<float> c(m * n);
  for (auto _ : state) {
    renaissance::math::exact_matmul_reference(a.data(), b.data(), c.data(), m, k, n);
    benchmark::DoNotOptimize(c.data());
  }
  set_gops(state, 2.0 * m * k * n);
}

// Five steps of X X^T (r x c x r), A A (r^3) and B X (r x r x c), r = min(rows, cols), c = max: the
// GOPS count all three products in full, though the two symmetric ones compute half.
void NewtonSchulz(benchmark::State& state) {
  const size_t rows = state.range(0), cols = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  const std::vector<float> u = normal(rows * cols, 3);
  std::vector<float> out(rows * cols);
  renaissance::cpu::NewtonSchulzScratch scratch;
  scratch.unit = unit_of(state, 3);
  set_label(state, scratch.unit);
  for (auto _ : state) {
    renaissance::cpu::newton_schulz_exact_cpu(u.data(), rows, cols, out.data(), {}, 5, 1e-7f, &scratch, threads);
    benchmark::DoNotOptimize(out.data());
  }
  const double r = static_cast<double>(std::min(rows, cols)), c = static_cast<double>(std::max(rows, cols));
  set_gops(state, 5.0 * 2.0 * (r * c * r + r * r * r + r * r * c));
}

BENCHMARK(Fast)->ArgsProduct({{768}, {768, 3072}, {768}, {1, 2, 16}, {0, 1}})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Reference)->Args({768, 768, 768})->Args({768, 3072, 768})->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(NewtonSchulz)->ArgsProduct({{768}, {3072}, {1, 2, 16}, {0, 1}})->Args({768, 768, 2, 0})->Args({768, 768, 2, 1})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
