// Muon's exact matrix product on a CUDA device: the scales (a max per row of A and per column of
// B: exact in any order), the fixed-point operands, the int64 sums and the one rounding of
// renaissance/math/exact_matmul.h. A first, plain kernel set (one thread per element of C); the
// result is fixed by the definition, so faster kernels (int8 tensor-core digits) give the same bits.
#include "backend_cuda/exact_matmul.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend_cuda/cuda_check.h"
#include "renaissance/error.h"
#include "renaissance/math/exact_matmul.h"

namespace renaissance {
namespace cuda {
namespace {

constexpr int kScaleThreads = 256;

// Vector v of `count` vectors, element p at base[v * outer + p * inner]: a row of A (outer = k,
// inner = 1) or a column of B (outer = 1, inner = n). Writes its shift and whether it is finite.
__global__ void vector_scales_kernel(const float* base, size_t count, size_t len, size_t outer, size_t inner,
                                     int* shift, int* finite) {
  __shared__ float amax[kScaleThreads];
  __shared__ int bad[kScaleThreads];
  const size_t v = blockIdx.x;
  if (v >= count) return;
  float mx = 0.0f;
  int nonfinite = 0;
  for (size_t p = threadIdx.x; p < len; p += blockDim.x) {
    const float x = fabsf(base[v * outer + p * inner]);
    if (!isfinite(x)) nonfinite = 1;
    else if (x > mx) mx = x;
  }
  amax[threadIdx.x] = mx;
  bad[threadIdx.x] = nonfinite;
  __syncthreads();
  for (int s = kScaleThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      amax[threadIdx.x] = fmaxf(amax[threadIdx.x], amax[threadIdx.x + s]);  // a max: exact in any order
      bad[threadIdx.x] |= bad[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    finite[v] = !bad[0];
    shift[v] = bad[0] ? 0 : math::fixed_point_shift(amax[0]);
  }
}

__global__ void fixed_point_kernel(const float* base, size_t count, size_t len, size_t outer, size_t inner,
                                   const int* shift, int32_t* q) {
  const size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= count * len) return;
  const size_t v = e / len, p = e % len;
  const size_t at = v * outer + p * inner;
  q[at] = math::to_fixed_point(base[at], shift[v]);
}

__global__ void integer_product_kernel(const int32_t* qa, const int32_t* qb, const int* row_shift,
                                       const int* row_finite, const int* col_shift, const int* col_finite, float* c,
                                       size_t m, size_t k, size_t n) {
  const size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= m * n) return;
  const size_t i = e / n, j = e % n;
  if (!row_finite[i] || !col_finite[j]) {
    c[e] = __int_as_float(0x7fc00000);  // quiet NaN
    return;
  }
  int64_t sum = 0;
  for (size_t p = 0; p < k; ++p) sum += static_cast<int64_t>(qa[i * k + p]) * qb[p * n + j];
  c[e] = math::from_fixed_point(sum, row_shift[i], col_shift[j]);
}

unsigned blocks_for(size_t elements, unsigned threads) {
  return static_cast<unsigned>((elements + threads - 1) / threads);
}

}  // namespace

void exact_matmul_device(const float* a, const float* b, float* c, size_t m, size_t k, size_t n) {
  if (k > math::kExactMatmulMaxK) {
    throw Error(ErrorKind::kInvalidArgument, "exact matmul: k = " + std::to_string(k) + " is above " +
                                                 std::to_string(math::kExactMatmulMaxK));
  }
  if (m == 0 || n == 0) return;
  int *row_shift = nullptr, *row_finite = nullptr, *col_shift = nullptr, *col_finite = nullptr;
  int32_t *qa = nullptr, *qb = nullptr;
  RN_CUDA_CHECK(cudaMalloc(&row_shift, m * sizeof(int)));
  RN_CUDA_CHECK(cudaMalloc(&row_finite, m * sizeof(int)));
  RN_CUDA_CHECK(cudaMalloc(&col_shift, n * sizeof(int)));
  RN_CUDA_CHECK(cudaMalloc(&col_finite, n * sizeof(int)));
  RN_CUDA_CHECK(cudaMalloc(&qa, (m * k + 1) * sizeof(int32_t)));
  RN_CUDA_CHECK(cudaMalloc(&qb, (k * n + 1) * sizeof(int32_t)));
  vector_scales_kernel<<<static_cast<unsigned>(m), kScaleThreads>>>(a, m, k, k, 1, row_shift, row_finite);
  RN_CUDA_CHECK_LAUNCH("exact matmul row scales");
  vector_scales_kernel<<<static_cast<unsigned>(n), kScaleThreads>>>(b, n, k, 1, n, col_shift, col_finite);
  RN_CUDA_CHECK_LAUNCH("exact matmul column scales");
  if (k > 0) {
    fixed_point_kernel<<<blocks_for(m * k, 256), 256>>>(a, m, k, k, 1, row_shift, qa);
    RN_CUDA_CHECK_LAUNCH("exact matmul fixed point of A");
    fixed_point_kernel<<<blocks_for(k * n, 256), 256>>>(b, n, k, 1, n, col_shift, qb);
    RN_CUDA_CHECK_LAUNCH("exact matmul fixed point of B");
  }
  integer_product_kernel<<<blocks_for(m * n, 128), 128>>>(qa, qb, row_shift, row_finite, col_shift, col_finite, c,
                                                           m, k, n);
  RN_CUDA_CHECK_LAUNCH("exact matmul integer product");
  RN_CUDA_CHECK(cudaDeviceSynchronize());
  for (void* p : {static_cast<void*>(row_shift), static_cast<void*>(row_finite), static_cast<void*>(col_shift),
                  static_cast<void*>(col_finite), static_cast<void*>(qa), static_cast<void*>(qb)}) {
    RN_CUDA_CHECK(cudaFree(p));
  }
}

void exact_matmul_on_device(const float* a, const float* b, float* c, size_t m, size_t k, size_t n) {
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  RN_CUDA_CHECK(cudaMalloc(&da, (m * k + 1) * sizeof(float)));
  RN_CUDA_CHECK(cudaMalloc(&db, (k * n + 1) * sizeof(float)));
  RN_CUDA_CHECK(cudaMalloc(&dc, (m * n + 1) * sizeof(float)));
  RN_CUDA_CHECK(cudaMemcpy(da, a, m * k * sizeof(float), cudaMemcpyHostToDevice));
  RN_CUDA_CHECK(cudaMemcpy(db, b, k * n * sizeof(float), cudaMemcpyHostToDevice));
  exact_matmul_device(da, db, dc, m, k, n);
  RN_CUDA_CHECK(cudaMemcpy(c, dc, m * n * sizeof(float), cudaMemcpyDeviceToHost));
  RN_CUDA_CHECK(cudaFree(da));
  RN_CUDA_CHECK(cudaFree(db));
  RN_CUDA_CHECK(cudaFree(dc));
}

}  // namespace cuda
}  // namespace renaissance
