// Muon's exact matrix product on the CUDA device against the host reference
// (renaissance/math/exact_matmul.h), with each product kernel (tensor cores, integer units): the
// same bits for mixed magnitudes, subnormals, zero and non-finite rows and columns, odd shapes
// across tile edges, a k above 131071 with every digit at its bound, and a k above 2^19 where a
// digit sum kept in int32 for the whole k would overflow; and through exact_matmul_launch with
// strided and transposed operand views.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "renaissance/backend.h"
#include "renaissance/math/exact_matmul.h"
#include "support/test_util.h"
#if RENAISSANCE_WITH_CUDA
#include <cuda_runtime.h>

#include "backend_cuda/exact_matmul.h"
#endif

namespace renaissance {
namespace {

#if RENAISSANCE_WITH_CUDA
constexpr cuda::ExactKernel kKernels[] = {cuda::ExactKernel::kTensorCores, cuda::ExactKernel::kIntegerUnits};
const char* kernel_name(cuda::ExactKernel k) {
  return k == cuda::ExactKernel::kTensorCores ? "tensor cores" : "integer units";
}

// A seeded stream of N(0, 1) floats; `rng` is its engine, for the draws of other values.
struct Normals {
  std::mt19937 rng;
  std::normal_distribution<float> nd{0.0f, 1.0f};
  explicit Normals(uint32_t seed) : rng(seed) {}
  float operator()() { return nd(rng); }
};

// Normal values times 2^s, s drawn from [-140, 29] (subnormals up to 2^30), every 11th element
// zero.
void fill_mixed_magnitudes(std::vector<float>& a, Normals& normal) {
  for (size_t e = 0; e < a.size(); ++e) {
    const int scale = static_cast<int>(normal.rng() % 170) - 140;
    a[e] = (e % 11 == 0) ? 0.0f : std::ldexp(normal(), scale);
  }
}

void expect_device_equals_reference(const std::vector<float>& a, const std::vector<float>& b, size_t m, size_t k,
                                    size_t n) {
  std::vector<float> host(m * n);
  ASSERT_TRUE(math::exact_matmul_reference(a.data(), b.data(), host.data(), m, k, n));
  for (const cuda::ExactKernel kernel : kKernels) {
    std::vector<float> device(m * n, -1.0f);
    cuda::exact_matmul_on_device(a.data(), b.data(), device.data(), m, k, n, kernel);
    EXPECT_TRUE(testing_util::same_bits(host, device)) << kernel_name(kernel) << " " << m << "x" << k << "x" << n;
  }
}
#endif

TEST(ExactMatmulCuda, DeviceEqualsTheHostReferenceBitForBit) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  Normals normal(5);
  for (const auto& shape : {std::vector<size_t>{1, 1, 1}, {3, 7, 2}, {33, 257, 65}, {128, 768, 128}, {5, 0, 3},
                            {70, 33, 41}, {17, 95, 130}}) {
    const size_t m = shape[0], k = shape[1], n = shape[2];
    std::vector<float> a(m * k), b(k * n);
    fill_mixed_magnitudes(a, normal);
    for (float& x : b) x = normal();
    if (m > 2 && k > 0) {
      for (size_t p = 0; p < k; ++p) a[k + p] = 0.0f;  // a zero row
      a[2 * k] = std::numeric_limits<float>::infinity();  // a non-finite row
    }
    if (n > 1 && k > 0) b[1] = std::nanf("");  // a non-finite column
    expect_device_equals_reference(a, b, m, k, n);
  }
#endif
}

TEST(ExactMatmulCuda, LongSumsWithDigitsAtTheirBound) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  const size_t k = 131073;
  std::vector<float> a(2 * k), b(k * 2);
  for (size_t p = 0; p < k; ++p) {
    a[p] = 1.99999988f;                                        // q = 8192 everywhere
    a[k + p] = (p % 3 == 0) ? -1.99999988f : 1.99999988f;      // mixed signs
    b[p * 2] = 1.99999988f;
    b[p * 2 + 1] = (p % 2 == 0) ? 1.99999988f : -1.99999988f;
  }
  expect_device_equals_reference(a, b, 2, k, 2);
  for (const cuda::ExactKernel kernel : kKernels) {
    std::vector<float> c(4);
    cuda::exact_matmul_on_device(a.data(), b.data(), c.data(), 2, k, 2, kernel);
    EXPECT_EQ(c[0], 4.0f * static_cast<float>(k)) << kernel_name(kernel);  // 8192^2 * k * 2^-24, as on the host
  }
#endif
}

// k = 2^19 + 3 with q = 8192 = 128 * 64 everywhere: the high digits' product sum is 2^12 * k > 2^31,
// so a kernel that kept one int32 digit sum over the whole k would wrap; the result is exact.
TEST(ExactMatmulCuda, DigitSumsLongerThanOneInt32) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  const size_t k = (size_t{1} << 19) + 3;
  const std::vector<float> a(k, 1.99999988f), b(k, 1.99999988f);  // a 1 x k row, a k x 1 column
  expect_device_equals_reference(a, b, 1, k, 1);
  std::vector<float> c(1);
  cuda::exact_matmul_on_device(a.data(), b.data(), c.data(), 1, k, 1, cuda::ExactKernel::kTensorCores);
  EXPECT_EQ(c[0], 4.0f * static_cast<float>(k));  // 2^26 * k * 2^-24
#endif
}

// exact_matmul_launch on operand views (DeviceMatrix strides) equals the reference on the matrices
// they show: A as the transpose of a stored k x m matrix (its rows have a stride of m between
// elements) with B's columns spaced 2 apart in rows of a longer stride (both vector sets strided
// along k, the second with an element stride between vectors), then A's rows in a longer row
// stride with B as the transpose of a stored n x k matrix (both contiguous along k). The elements
// between the viewed ones are NaN: a read outside the view would turn results into NaN.
TEST(ExactMatmulCuda, StridedViewsEqualTheReference) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
#if RENAISSANCE_WITH_CUDA
  Normals normal(17);
  for (const auto& shape : {std::vector<size_t>{1, 1, 1}, {33, 7, 130}, {70, 257, 41}, {40, 128, 64}, {5, 300, 3}}) {
    const size_t m = shape[0], k = shape[1], n = shape[2];
    std::vector<float> a(m * k), b(k * n);  // the logical row-major operands
    fill_mixed_magnitudes(a, normal);
    for (size_t e = 0; e < b.size(); ++e) b[e] = (e % 7 == 0) ? 0.0f : normal() * 3.0f;
    if (m > 2 && k > 1) {
      for (size_t p = 0; p < k; ++p) a[k + p] = 0.0f;                // a zero row
      a[2 * k + k / 2] = -std::numeric_limits<float>::infinity();  // a non-finite row
    }
    if (n > 2 && k > 1) b[(k - 1) * n + 2] = std::nanf("");  // a non-finite column
    std::vector<float> expect(m * n);
    ASSERT_TRUE(math::exact_matmul_reference(a.data(), b.data(), expect.data(), m, k, n));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const size_t lda = k + 5, ldb = 2 * n + 3;
    std::vector<float> a_t(k * m), a_rows(m * lda, nan), b_spaced(k * ldb, nan), b_t(n * k);
    for (size_t i = 0; i < m; ++i) {
      for (size_t p = 0; p < k; ++p) a_t[p * m + i] = a_rows[i * lda + p] = a[i * k + p];
    }
    for (size_t p = 0; p < k; ++p) {
      for (size_t j = 0; j < n; ++j) b_spaced[p * ldb + 2 * j] = b_t[j * k + p] = b[p * n + j];
    }
    struct View {
      const std::vector<float>* a_host;
      size_t a_row_stride, a_col_stride;
      const std::vector<float>* b_host;
      size_t b_row_stride, b_col_stride;
      const char* what;
    };
    for (const View& view : {View{&a_t, 1, m, &b_spaced, ldb, 2, "A transposed, B spaced"},
                             View{&a_rows, lda, 1, &b_t, 1, k, "A in a longer row stride, B transposed"}}) {
      float *da = nullptr, *db = nullptr, *dc = nullptr;
      void* scratch = nullptr;
      ASSERT_EQ(cudaMalloc(&da, view.a_host->size() * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&db, view.b_host->size() * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&dc, m * n * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&scratch, cuda::exact_matmul_scratch_bytes(m, k, n)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(da, view.a_host->data(), view.a_host->size() * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(db, view.b_host->data(), view.b_host->size() * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
      cuda::exact_matmul_launch({da, view.a_row_stride, view.a_col_stride}, {db, view.b_row_stride, view.b_col_stride},
                                dc, m, k, n, scratch, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<float> got(m * n, -1.0f);
      ASSERT_EQ(cudaMemcpy(got.data(), dc, m * n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      cudaFree(da);
      cudaFree(db);
      cudaFree(dc);
      cudaFree(scratch);
      EXPECT_TRUE(testing_util::same_bits(expect, got)) << view.what << " " << m << "x" << k << "x" << n;
    }
  }
#endif
}

}  // namespace
}  // namespace renaissance
