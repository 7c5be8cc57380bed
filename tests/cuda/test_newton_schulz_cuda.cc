// Muon's exact-mode Newton–Schulz on the CUDA device against the host reference
// (renaissance/math/newton_schulz.h), bit for bit: square, wide, tall (the transposed path), 1xN
// and Nx1, several norm tiles with a short last one, a zero matrix and a tiny one (the eps
// path), huge values, other coefficients and step counts; a skipped launch leaves its output
// alone; a captured CUDA graph reads the coefficients when it runs. The batched classes
// (NewtonSchulzBatch) in exact mode equal the per-matrix reference bit for bit, through cuBLASLt's
// int8 products and through the per-matrix fallback; in fast mode (bf16 storage) they stay within
// a stated distance of the float64 iteration and come out as bf16 values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "renaissance/backend.h"
#include "renaissance/math/newton_schulz.h"
#include "support/test_util.h"
#if RENAISSANCE_WITH_CUDA
#include <cuda_runtime.h>

#include "backend_cuda/newton_schulz.h"
#endif

namespace renaissance {
namespace {

#if RENAISSANCE_WITH_CUDA
std::vector<float> random_matrix(size_t rows, size_t cols, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> m(rows * cols);
  for (float& x : m) x = nd(rng) * scale;
  return m;
}

// The number of elements whose bit patterns differ (the first few reported).
size_t differing_bits(const std::vector<float>& host, const std::vector<float>& device, const char* what) {
  size_t differ = 0;
  for (size_t e = 0; e < host.size(); ++e) {
    uint32_t x, y;
    std::memcpy(&x, &host[e], 4);
    std::memcpy(&y, &device[e], 4);
    if (x != y && differ++ < 5) ADD_FAILURE() << what << " element " << e << ": host " << host[e] << " device " << device[e];
  }
  return differ;
}

void expect_device_equals_reference(const std::vector<float>& u, size_t rows, size_t cols,
                                    const math::NewtonSchulzCoefficients& coeff = {},
                                    int steps = math::kDefaultNewtonSchulzSteps,
                                    float eps = math::kDefaultNewtonSchulzEps) {
  std::vector<float> host(rows * cols, -1.0f), device(rows * cols, -2.0f);
  ASSERT_TRUE(math::newton_schulz_reference(u.data(), rows, cols, host.data(), coeff, steps, eps));
  ASSERT_TRUE(cuda::newton_schulz_on_device(u.data(), rows, cols, device.data(), coeff, steps, eps));
  EXPECT_EQ(differing_bits(host, device, "newton-schulz"), 0u) << rows << "x" << cols << " steps " << steps;
}
#endif

TEST(NewtonSchulzCuda, DeviceEqualsTheHostReferenceBitForBit) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  struct Shape {
    size_t rows, cols;
  };
  // Square, wide, tall (transposed), a row, a column, 16384 elements (4 whole norm tiles) and
  // 9100 (a short third tile), 130 x 70 tall with odd sides.
  uint32_t seed = 1;
  for (const Shape s : {Shape{16, 16}, Shape{8, 40}, Shape{40, 8}, Shape{1, 300}, Shape{300, 1}, Shape{64, 256},
                        Shape{70, 130}, Shape{130, 70}, Shape{96, 96}}) {
    expect_device_equals_reference(random_matrix(s.rows, s.cols, seed++, 0.02f), s.rows, s.cols);
  }
#endif
}

TEST(NewtonSchulzCuda, EpsPathAndExtremeMagnitudes) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  expect_device_equals_reference(std::vector<float>(12 * 20, 0.0f), 12, 20);  // zero: X = 0 / eps
  // ‖u‖_F ~ 1e-25 < eps: X = u / eps, tiny but not zero.
  expect_device_equals_reference(random_matrix(12, 20, 7, 1e-27f), 12, 20);
  // Subnormal elements beside normal ones in one row.
  std::vector<float> mixed = random_matrix(10, 30, 8, 1.0f);
  for (size_t e = 0; e < mixed.size(); e += 3) mixed[e] = std::ldexp(mixed[e], -135);
  expect_device_equals_reference(mixed, 10, 30);
  expect_device_equals_reference(random_matrix(20, 12, 9, 1e30f), 20, 12);  // huge, tall
  // ‖u‖_F above FLT_MAX (finite elements up to 3e38 of both signs): the norm rounds to inf,
  // X = u / inf = ±0.
  std::vector<float> huge(6 * 9);
  for (size_t e = 0; e < huge.size(); ++e) huge[e] = (e % 2 ? -3e38f : 3e38f) / static_cast<float>(1 + e % 5);
  expect_device_equals_reference(huge, 6, 9);
#endif
}

TEST(NewtonSchulzCuda, OtherCoefficientsAndStepCounts) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  const std::vector<float> u = random_matrix(24, 40, 11, 0.5f);
  for (int steps : {0, 1, 2, 7}) expect_device_equals_reference(u, 24, 40, {}, steps);
  // Coefficients with different roles than the defaults (a swap of a, b, c changes the result).
  expect_device_equals_reference(u, 24, 40, {2.0f, -1.5f, 0.5f}, 3, 1e-3f);
  expect_device_equals_reference(random_matrix(40, 24, 12, 0.5f), 40, 24, {1.875f, -1.25f, 0.375f}, 4);
#endif
}

#if RENAISSANCE_WITH_CUDA
// Device buffers of one case: u, out, the four scalars (a, b, c, eps), the skip flag, scratch.
struct DeviceCase {
  float* u = nullptr;
  float* out = nullptr;
  float* scalars = nullptr;
  int32_t* skip = nullptr;
  void* scratch = nullptr;
  DeviceCase(const std::vector<float>& host_u, size_t rows, size_t cols) {
    EXPECT_EQ(cudaMalloc(&u, host_u.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&out, host_u.size() * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&scalars, 4 * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&skip, sizeof(int32_t)), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&scratch, cuda::newton_schulz_scratch_bytes(rows, cols)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(u, host_u.data(), host_u.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceCase() {
    cudaFree(u);
    cudaFree(out);
    cudaFree(scalars);
    cudaFree(skip);
    cudaFree(scratch);
  }
  void set(const math::NewtonSchulzCoefficients& c, float eps, int32_t skip_value, cudaStream_t stream) {
    const float host[4] = {c.a, c.b, c.c, eps};
    EXPECT_EQ(cudaMemcpyAsync(scalars, host, sizeof(host), cudaMemcpyHostToDevice, stream), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(skip, &skip_value, sizeof(skip_value), cudaMemcpyHostToDevice, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  cuda::NewtonSchulzScalars view() const { return {scalars, scalars + 1, scalars + 2, scalars + 3}; }
  std::vector<float> read_out(size_t count) const {
    std::vector<float> host(count);
    EXPECT_EQ(cudaMemcpy(host.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};
#endif

TEST(NewtonSchulzCuda, SkipFlagLeavesTheOutputAlone) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  const size_t rows = 16, cols = 48;
  const std::vector<float> u = random_matrix(rows, cols, 13, 0.1f);
  DeviceCase dc(u, rows, cols);
  const std::vector<float> sentinel(rows * cols, 42.0f);
  ASSERT_EQ(cudaMemcpy(dc.out, sentinel.data(), sentinel.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  dc.set({}, 1e-7f, 1, nullptr);
  cuda::newton_schulz_device(dc.u, rows, cols, dc.out, dc.view(), 5, dc.scratch, nullptr, {dc.skip});
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(differing_bits(sentinel, dc.read_out(rows * cols), "skipped"), 0u);
  dc.set({}, 1e-7f, 0, nullptr);
  cuda::newton_schulz_device(dc.u, rows, cols, dc.out, dc.view(), 5, dc.scratch, nullptr, {dc.skip});
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> host(rows * cols);
  ASSERT_TRUE(math::newton_schulz_reference(u.data(), rows, cols, host.data()));
  EXPECT_EQ(differing_bits(host, dc.read_out(rows * cols), "not skipped"), 0u);
#endif
}

TEST(NewtonSchulzCuda, CapturedGraphReadsTheScalarsWhenItRuns) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  const size_t rows = 72, cols = 20;  // tall: the transposed path
  const std::vector<float> u = random_matrix(rows, cols, 14, 0.3f);
  DeviceCase dc(u, rows, cols);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  dc.set({}, 1e-7f, 0, stream);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cuda::newton_schulz_device(dc.u, rows, cols, dc.out, dc.view(), 3, dc.scratch, stream, {dc.skip});
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (const math::NewtonSchulzCoefficients coeff :
       {math::NewtonSchulzCoefficients{}, math::NewtonSchulzCoefficients{2.0f, -1.5f, 0.5f}}) {
    dc.set(coeff, 1e-7f, 0, stream);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> host(rows * cols);
    ASSERT_TRUE(math::newton_schulz_reference(u.data(), rows, cols, host.data(), coeff, 3));
    EXPECT_EQ(differing_bits(host, dc.read_out(rows * cols), "graph replay"), 0u) << "a = " << coeff.a;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
#endif
}

#if RENAISSANCE_WITH_CUDA
// The matrices of a class one after another in one array, and each one's reference result.
struct ClassCase {
  std::vector<size_t> rows, cols;
  std::vector<float> u, reference;
  ClassCase(const std::vector<std::pair<size_t, size_t>>& shapes, uint32_t seed, float scale,
            const math::NewtonSchulzCoefficients& coeff = {}, int steps = math::kDefaultNewtonSchulzSteps) {
    for (const auto& [r, c] : shapes) {
      rows.push_back(r);
      cols.push_back(c);
      const std::vector<float> m = random_matrix(r, c, seed++, scale);
      std::vector<float> out(m.size());
      EXPECT_TRUE(math::newton_schulz_reference(m.data(), r, c, out.data(), coeff, steps));
      u.insert(u.end(), m.begin(), m.end());
      reference.insert(reference.end(), out.begin(), out.end());
    }
  }
};

// The float64 iteration on one matrix (the semantics without any rounding of ours): for fast mode.
std::vector<double> newton_schulz_float64(const float* u, size_t rows, size_t cols, int steps = 5) {
  const bool t = rows > cols;
  const size_t r = t ? cols : rows, c = t ? rows : cols;
  std::vector<double> x(r * c), a(r * r), b(r * r), q(r * c);
  double norm = 0.0;
  for (size_t e = 0; e < rows * cols; ++e) norm += static_cast<double>(u[e]) * u[e];
  norm = std::max(std::sqrt(norm), 1e-7);
  for (size_t i = 0; i < r; ++i) {
    for (size_t j = 0; j < c; ++j) x[i * c + j] = (t ? u[j * cols + i] : u[i * cols + j]) / norm;
  }
  const double ca = 3.4445, cb = -4.7750, cc = 2.0315;
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < r; ++i) {
      for (size_t j = 0; j < r; ++j) {
        double acc = 0.0;
        for (size_t p = 0; p < c; ++p) acc += x[i * c + p] * x[j * c + p];
        a[i * r + j] = acc;
      }
    }
    for (size_t i = 0; i < r; ++i) {
      for (size_t j = 0; j < r; ++j) {
        double acc = 0.0;
        for (size_t p = 0; p < r; ++p) acc += a[i * r + p] * a[p * r + j];
        b[i * r + j] = cb * a[i * r + j] + cc * acc;
      }
    }
    for (size_t i = 0; i < r; ++i) {
      for (size_t j = 0; j < c; ++j) {
        double acc = 0.0;
        for (size_t p = 0; p < r; ++p) acc += b[i * r + p] * x[p * c + j];
        q[i * c + j] = acc;
      }
    }
    for (size_t e = 0; e < r * c; ++e) x[e] = ca * x[e] + q[e];
  }
  std::vector<double> out(rows * cols);
  for (size_t i = 0; i < r; ++i) {
    for (size_t j = 0; j < c; ++j) out[t ? j * cols + i : i * cols + j] = x[i * c + j];
  }
  return out;
}
#endif

TEST(NewtonSchulzCuda, BatchedClassesEqualTheReferenceBitForBit) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  // Sides that are multiples of 4 take cuBLASLt's int8 products (the GPU machine has the library:
  // its absence would be a failure here, not a fallback); both orientations in one class.
  auto expect_batched_bits = [](const ClassCase& k, const char* what) {
    std::vector<float> out(k.u.size(), -3.0f);
    EXPECT_TRUE(cuda::newton_schulz_batch_on_device(k.u.data(), k.rows, k.cols, out.data(),
                                                    cuda::NewtonSchulzMode::kExact))
        << what;
    EXPECT_EQ(differing_bits(k.reference, out, what), 0u);
  };
  expect_batched_bits(ClassCase({{64, 256}, {256, 64}, {64, 256}}, 21, 0.02f), "batched 64x256");
  // Sides past one tile of the products and of the digit kernels: 200 rows of X (a warp each in
  // the row kernel), 700 columns (22 tiles of 32 vectors in the column kernel, the last partial),
  // k of 704 and 224 digits.
  expect_batched_bits(ClassCase({{200, 700}, {700, 200}}, 23, 0.02f), "batched 200x700");
  {
    // Square, several entries, huge and tiny scales side by side (each matrix its own norm).
    ClassCase k({{96, 96}, {96, 96}}, 31, 1e30f);
    const ClassCase tiny({{96, 96}}, 33, 1e-27f);
    k.rows.push_back(96);
    k.cols.push_back(96);
    k.u.insert(k.u.end(), tiny.u.begin(), tiny.u.end());
    k.reference.insert(k.reference.end(), tiny.reference.begin(), tiny.reference.end());
    expect_batched_bits(k, "batched 96x96");
  }
  {
    // Other coefficients and steps.
    const math::NewtonSchulzCoefficients coeff{2.0f, -1.5f, 0.5f};
    const ClassCase k({{32, 160}, {160, 32}}, 41, 0.5f, coeff, 3);
    std::vector<float> out(k.u.size(), -3.0f);
    cuda::newton_schulz_batch_on_device(k.u.data(), k.rows, k.cols, out.data(), cuda::NewtonSchulzMode::kExact, coeff,
                                        3);
    EXPECT_EQ(differing_bits(k.reference, out, "batched coefficients"), 0u);
  }
  {
    // Odd sides: whichever path runs (cuBLASLt or one matrix after another), the same bits.
    const ClassCase k1({{70, 130}, {130, 70}}, 51, 0.02f);
    std::vector<float> out1(k1.u.size(), -3.0f);
    cuda::newton_schulz_batch_on_device(k1.u.data(), k1.rows, k1.cols, out1.data(), cuda::NewtonSchulzMode::kExact);
    EXPECT_EQ(differing_bits(k1.reference, out1, "batched odd"), 0u);
    const ClassCase k2({{1, 300}, {300, 1}}, 61, 0.02f);
    std::vector<float> out2(k2.u.size(), -3.0f);
    cuda::newton_schulz_batch_on_device(k2.u.data(), k2.rows, k2.cols, out2.data(), cuda::NewtonSchulzMode::kExact);
    EXPECT_EQ(differing_bits(k2.reference, out2, "batched 1x300"), 0u);
  }
#endif
}

// A batched class whose short side (36) is padded to 64 in the digit arrays, X's columns (100 per
// matrix, a partial tile of 32) taken from three matrices at once, and an inf in the middle one:
// X = u / inf has NaN columns in that matrix alone. Its neighbours in the batch equal their own
// references bit for bit (a vector's scale or flag taken from another matrix would change them)
// and the middle one comes out NaN where its reference does (NaN payloads are not compared).
TEST(NewtonSchulzCuda, BatchedClassWithPaddedSidesAndANonFiniteMatrix) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  ClassCase k({{36, 100}, {100, 36}, {36, 100}}, 91, 0.3f);
  const size_t at = 36 * 100, size = 36 * 100;
  k.u[at + 5 * 36 + 7] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(math::newton_schulz_reference(k.u.data() + at, 100, 36, k.reference.data() + at));
  std::vector<float> out(k.u.size(), -3.0f);
  EXPECT_TRUE(cuda::newton_schulz_batch_on_device(k.u.data(), k.rows, k.cols, out.data(),
                                                  cuda::NewtonSchulzMode::kExact));
  for (const size_t m : {size_t{0}, size_t{2}}) {
    const std::vector<float> want(k.reference.begin() + m * size, k.reference.begin() + (m + 1) * size);
    const std::vector<float> got(out.begin() + m * size, out.begin() + (m + 1) * size);
    EXPECT_EQ(differing_bits(want, got, "finite neighbour"), 0u) << "matrix " << m;
  }
  size_t nan_expected = 0, differ = 0;
  for (size_t e = at; e < at + size; ++e) {
    const bool want_nan = std::isnan(k.reference[e]);
    nan_expected += want_nan;
    uint32_t x, y;
    std::memcpy(&x, &k.reference[e], 4);
    std::memcpy(&y, &out[e], 4);
    if (want_nan ? !std::isnan(out[e]) : x != y) {
      if (differ++ < 5) ADD_FAILURE() << "non-finite matrix element " << e - at << ": host " << k.reference[e]
                                      << " device " << out[e];
    }
  }
  EXPECT_GT(nan_expected, 0u);  // the reference does flag the inf
  EXPECT_EQ(differ, 0u);
#endif
}

TEST(NewtonSchulzCuda, BatchedFastModeStaysNearTheFloat64Iteration) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  // torch's bf16 Newton–Schulz: X, A and B stored in bf16 (8 significant bits), bf16 products with
  // fp32 accumulation. The bound is docs/math.md's ("Muon: fast mode"): emulated on the CPU
  // (bench/ns_fast_error.cc) over 30 matrices of these shapes and scale (these two among them) the
  // largest element error against the float64 iteration is 4.1e-3 to 6.0e-3, torch's own order of
  // operations 3.7e-3 to 6.7e-3; fp32 storage of X, A and B with bf16 operands 7.5e-3 to 1.2e-2.
  const ClassCase k({{64, 256}, {256, 64}}, 71, 0.02f);
  const std::vector<size_t>& rows = k.rows;
  const std::vector<size_t>& cols = k.cols;
  const std::vector<float>& u2 = k.u;
  std::vector<float> out2(u2.size());
  ASSERT_TRUE(cuda::newton_schulz_batch_on_device(u2.data(), rows, cols, out2.data(), cuda::NewtonSchulzMode::kFast));
  double worst = 0.0, worst_exact = 0.0;
  size_t at = 0;
  for (size_t m = 0; m < 2; ++m) {
    const std::vector<double> f64 = newton_schulz_float64(u2.data() + at, rows[m], cols[m]);
    for (size_t e = 0; e < f64.size(); ++e) {
      worst = std::max(worst, std::fabs(static_cast<double>(out2[at + e]) - f64[e]));
      worst_exact = std::max(worst_exact, std::fabs(static_cast<double>(k.reference[at + e]) - f64[e]));
    }
    at += f64.size();
  }
  std::printf("fast mode: max |fast - float64| = %.3g, max |exact - float64| = %.3g\n", worst, worst_exact);
  EXPECT_LT(worst, 1e-2);
  EXPECT_GT(worst, worst_exact);  // bf16 products really ran (exact mode is far closer)
  // The result is X widened from bf16: no element has a bit below bf16's last.
  size_t not_bf16 = 0;
  for (float v : out2) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    not_bf16 += (bits & 0xffffu) != 0;
  }
  EXPECT_EQ(not_bf16, 0u) << "of " << out2.size() << " elements";
#endif
}

TEST(NewtonSchulzCuda, CapturedBatchReadsTheScalarsAndTheSkipWhenItRuns) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  const std::vector<std::pair<size_t, size_t>> shapes{{32, 96}, {96, 32}};
  const std::vector<cuda::NewtonSchulzEntry> entries{{0, 0}, {32 * 96, 1}};
  const cuda::NewtonSchulzBatch batch(32, 96, entries, cuda::NewtonSchulzMode::kExact);
  EXPECT_TRUE(batch.batched());
  const ClassCase defaults(shapes, 81, 0.3f);
  const math::NewtonSchulzCoefficients other{2.0f, -1.5f, 0.5f};
  const ClassCase changed(shapes, 81, 0.3f, other);
  const size_t count = defaults.u.size();
  float *u = nullptr, *scalars = nullptr;
  int32_t* skip = nullptr;
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&u, count * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scalars, 4 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&skip, sizeof(int32_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&scratch, batch.scratch_bytes()), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  batch.enqueue(u, {scalars, scalars + 1, scalars + 2, scalars + 3}, 5, scratch, stream, {skip});
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  struct Run {
    math::NewtonSchulzCoefficients coeff;
    int32_t skip;
    const std::vector<float>* expect;
  };
  for (const Run& run : {Run{{}, 0, &defaults.reference}, Run{other, 0, &changed.reference}, Run{{}, 1, &defaults.u}}) {
    const float host[4] = {run.coeff.a, run.coeff.b, run.coeff.c, 1e-7f};
    ASSERT_EQ(cudaMemcpy(u, defaults.u.data(), count * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(scalars, host, sizeof(host), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(skip, &run.skip, sizeof(run.skip), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> out(count);
    ASSERT_EQ(cudaMemcpy(out.data(), u, count * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(differing_bits(*run.expect, out, "captured batch"), 0u) << "a = " << run.coeff.a << " skip " << run.skip;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(u);
  cudaFree(scalars);
  cudaFree(skip);
  cudaFree(scratch);
#endif
}

}  // namespace
}  // namespace renaissance
