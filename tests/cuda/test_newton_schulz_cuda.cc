// Muon's exact-mode Newton–Schulz on the CUDA device against the host reference
// (renaissance/math/newton_schulz.h), bit for bit: square, wide, tall (the transposed path), 1xN
// and Nx1, several norm tiles with a short last one, a zero matrix and a tiny one (the eps
// path), huge values, other coefficients and step counts; a skipped launch leaves its output
// alone; a captured CUDA graph reads the coefficients when it runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
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

}  // namespace
}  // namespace renaissance
