// Muon's exact matrix product on a CUDA device: the scales (a max per row of A and per column of
// B: exact in any order), the fixed-point operands, the exact integer sums and the one rounding of
// renaissance/math/exact_matmul.h. The integer sums run in a shared-memory tiled kernel with int32
// products summed over chunks of kChunk and the chunks summed in int64: exact, so the bits are the
// reference's whatever the tiling (a faster kernel, e.g. int8 digits on tensor cores, gives the
// same bits by the same argument).
#include "backend_cuda/exact_matmul.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/exact_matmul_internal.cuh"
#include "renaissance/error.h"
#include "renaissance/math/exact_matmul.h"

namespace renaissance {
namespace cuda {
namespace {

constexpr int kScaleThreads = 256;
constexpr int kElementThreads = 256;
// The tiled integer product: a kTile x kTile tile of C per block of kTileThreads x kTileThreads
// threads (each thread kTile/kTileThreads squared elements), k in chunks of kChunk.
constexpr int kTile = 64;
constexpr int kTileThreads = 16;
constexpr int kPerThread = kTile / kTileThreads;
constexpr int kChunk = 16;
// A chunk's int32 sum holds at most kChunk products of |q| <= 2^13 each: <= kChunk * 2^26 < 2^31.
static_assert(static_cast<int64_t>(kChunk) << (2 * math::kFixedPointBits) < (int64_t{1} << 31),
              "a chunk's int32 sum cannot overflow");
static_assert((kTile * kChunk) % (kTileThreads * kTileThreads) == 0, "whole loads per thread");

__device__ __forceinline__ bool skip_now(const int32_t* skip) { return skip != nullptr && *skip != 0; }

// Vector v of `count` vectors, element p at base[v * outer + p * inner]: a row of A (outer = row
// stride, inner = column stride) or a column of B (outer = column stride, inner = row stride).
// Writes its shift and whether it is finite.
__global__ void __launch_bounds__(kScaleThreads)
    vector_scales_kernel(const float* base, size_t count, size_t len, size_t outer, size_t inner, int* shift,
                         int* finite, const int32_t* skip) {
  if (skip_now(skip)) return;
  __shared__ float amax[kScaleThreads];
  __shared__ int bad[kScaleThreads];
  for (size_t v = blockIdx.x; v < count; v += gridDim.x) {
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
    __syncthreads();  // amax/bad are rewritten by the next vector
  }
}

// q[v * len + p] = the fixed point of base[v * outer + p * inner] (0 for a non-finite vector, as
// the reference: its results are NaN whatever q holds). |q| <= 2^13 fits int16. The element order
// of the walk follows whichever side is contiguous (reads when inner == 1, else the vectors).
__global__ void fixed_point_kernel(const float* base, size_t count, size_t len, size_t outer, size_t inner,
                                   const int* shift, const int* finite, int16_t* q, const int32_t* skip) {
  if (skip_now(skip)) return;
  const size_t total = count * len;
  for (size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    size_t v, p;
    if (inner == 1) {
      v = e / len;
      p = e % len;
    } else {
      p = e / count;
      v = e % count;
    }
    q[v * len + p] = finite[v] ? static_cast<int16_t>(math::to_fixed_point(base[v * outer + p * inner], shift[v])) : 0;
  }
}

// C (m x n) from qa (m x k, row i contiguous) and qb (n x k, column j of B contiguous): the exact
// integer dot products, kChunk products in int32, the chunks in int64, then the one rounding.
// One block per kTile x kTile tile of C (grid-stride over tiles); out-of-range operands load as 0
// (adding 0 changes no integer sum).
__global__ void __launch_bounds__(kTileThreads* kTileThreads)
    integer_product_kernel(const int16_t* __restrict__ qa, const int16_t* __restrict__ qb,
                           const int* __restrict__ row_shift, const int* __restrict__ row_finite,
                           const int* __restrict__ col_shift, const int* __restrict__ col_finite, float* __restrict__ c,
                           size_t m, size_t k, size_t n, const int32_t* skip) {
  if (skip_now(skip)) return;
  __shared__ int32_t as[kChunk][kTile + 1];
  __shared__ int32_t bs[kChunk][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * kTileThreads + tx;
  const size_t tiles_n = (n + kTile - 1) / kTile;
  const size_t tiles = ((m + kTile - 1) / kTile) * tiles_n;
  for (size_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const size_t i0 = (t / tiles_n) * kTile, j0 = (t % tiles_n) * kTile;
    int64_t sum[kPerThread][kPerThread];
#pragma unroll
    for (int a = 0; a < kPerThread; ++a) {
#pragma unroll
      for (int b = 0; b < kPerThread; ++b) sum[a][b] = 0;
    }
    for (size_t p0 = 0; p0 < k; p0 += kChunk) {
#pragma unroll
      for (int l = 0; l < kTile * kChunk / (kTileThreads * kTileThreads); ++l) {
        const int idx = tid + l * kTileThreads * kTileThreads;
        const int v = idx / kChunk, p = idx % kChunk;
        const size_t i = i0 + v, j = j0 + v, pp = p0 + p;
        as[p][v] = (i < m && pp < k) ? static_cast<int32_t>(qa[i * k + pp]) : 0;
        bs[p][v] = (j < n && pp < k) ? static_cast<int32_t>(qb[j * k + pp]) : 0;
      }
      __syncthreads();
      int32_t acc[kPerThread][kPerThread];
#pragma unroll
      for (int a = 0; a < kPerThread; ++a) {
#pragma unroll
        for (int b = 0; b < kPerThread; ++b) acc[a][b] = 0;
      }
#pragma unroll
      for (int p = 0; p < kChunk; ++p) {
        int32_t av[kPerThread], bv[kPerThread];
#pragma unroll
        for (int a = 0; a < kPerThread; ++a) av[a] = as[p][ty + a * kTileThreads];
#pragma unroll
        for (int b = 0; b < kPerThread; ++b) bv[b] = bs[p][tx + b * kTileThreads];
#pragma unroll
        for (int a = 0; a < kPerThread; ++a) {
#pragma unroll
          for (int b = 0; b < kPerThread; ++b) acc[a][b] += av[a] * bv[b];
        }
      }
#pragma unroll
      for (int a = 0; a < kPerThread; ++a) {
#pragma unroll
        for (int b = 0; b < kPerThread; ++b) sum[a][b] += acc[a][b];
      }
      __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < kPerThread; ++a) {
      const size_t i = i0 + ty + a * kTileThreads;
      if (i >= m) continue;
#pragma unroll
      for (int b = 0; b < kPerThread; ++b) {
        const size_t j = j0 + tx + b * kTileThreads;
        if (j >= n) continue;
        c[i * n + j] = (row_finite[i] && col_finite[j]) ? math::from_fixed_point(sum[a][b], row_shift[i], col_shift[j])
                                                        : __int_as_float(0x7fc00000);  // quiet NaN
      }
    }
  }
}

unsigned grid_of(size_t items, unsigned per_block) {
  const size_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(blocks, size_t{1} << 20)));
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

size_t matmul_scratch_bytes(const MatmulBounds& b) {
  return 2 * aligned(b.m * sizeof(int)) + 2 * aligned(b.n * sizeof(int)) + aligned(b.mk * sizeof(int16_t)) +
         aligned(b.kn * sizeof(int16_t));
}

void matmul_launch(DeviceMatrix a, DeviceMatrix b, float* c, size_t m, size_t k, size_t n, void* scratch,
                   cudaStream_t stream, const int32_t* skip) {
  if (k > math::kExactMatmulMaxK) {
    throw Error(ErrorKind::kInvalidArgument, "exact matmul: k = " + std::to_string(k) + " is above " +
                                                 std::to_string(math::kExactMatmulMaxK));
  }
  if (m == 0 || n == 0) return;
  char* at = static_cast<char*>(scratch);
  auto take = [&at](size_t bytes) {
    char* p = at;
    at += aligned(bytes);
    return p;
  };
  int* row_shift = reinterpret_cast<int*>(take(m * sizeof(int)));
  int* row_finite = reinterpret_cast<int*>(take(m * sizeof(int)));
  int* col_shift = reinterpret_cast<int*>(take(n * sizeof(int)));
  int* col_finite = reinterpret_cast<int*>(take(n * sizeof(int)));
  int16_t* qa = reinterpret_cast<int16_t*>(take(m * k * sizeof(int16_t)));
  int16_t* qb = reinterpret_cast<int16_t*>(take(k * n * sizeof(int16_t)));
  vector_scales_kernel<<<grid_of(m, 1), kScaleThreads, 0, stream>>>(a.data, m, k, a.row_stride, a.col_stride,
                                                                     row_shift, row_finite, skip);
  RN_CUDA_CHECK_LAUNCH("exact matmul row scales");
  vector_scales_kernel<<<grid_of(n, 1), kScaleThreads, 0, stream>>>(b.data, n, k, b.col_stride, b.row_stride,
                                                                     col_shift, col_finite, skip);
  RN_CUDA_CHECK_LAUNCH("exact matmul column scales");
  if (k > 0) {
    fixed_point_kernel<<<grid_of(m * k, kElementThreads), kElementThreads, 0, stream>>>(
        a.data, m, k, a.row_stride, a.col_stride, row_shift, row_finite, qa, skip);
    RN_CUDA_CHECK_LAUNCH("exact matmul fixed point of A");
    fixed_point_kernel<<<grid_of(k * n, kElementThreads), kElementThreads, 0, stream>>>(
        b.data, n, k, b.col_stride, b.row_stride, col_shift, col_finite, qb, skip);
    RN_CUDA_CHECK_LAUNCH("exact matmul fixed point of B");
  }
  const size_t tiles = ((m + kTile - 1) / kTile) * ((n + kTile - 1) / kTile);
  integer_product_kernel<<<grid_of(tiles, 1), dim3(kTileThreads, kTileThreads), 0, stream>>>(
      qa, qb, row_shift, row_finite, col_shift, col_finite, c, m, k, n, skip);
  RN_CUDA_CHECK_LAUNCH("exact matmul integer product");
}

size_t exact_matmul_scratch_bytes(size_t m, size_t k, size_t n) { return matmul_scratch_bytes({m, n, m * k, k * n}); }

void exact_matmul_launch(DeviceMatrix a, DeviceMatrix b, float* c, size_t m, size_t k, size_t n, void* scratch,
                         CUstream_st* stream, const int32_t* skip) {
  matmul_launch(a, b, c, m, k, n, scratch, stream, skip);
}

void exact_matmul_device(const float* a, const float* b, float* c, size_t m, size_t k, size_t n) {
  if (k > math::kExactMatmulMaxK) {
    throw Error(ErrorKind::kInvalidArgument, "exact matmul: k = " + std::to_string(k) + " is above " +
                                                 std::to_string(math::kExactMatmulMaxK));
  }
  if (m == 0 || n == 0) return;
  void* scratch = nullptr;
  RN_CUDA_CHECK(cudaMalloc(&scratch, exact_matmul_scratch_bytes(m, k, n)));
  matmul_launch({a, k, 1}, {b, n, 1}, c, m, k, n, scratch, nullptr, nullptr);
  RN_CUDA_CHECK(cudaDeviceSynchronize());
  RN_CUDA_CHECK(cudaFree(scratch));
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
