// Muon's exact matrix product on a CUDA device: the scales (a max per row of A and per column of
// B: exact in any order), the fixed-point operands, the exact integer sums and the one rounding of
// renaissance/math/exact_matmul.h. Each q (|q| <= 2^13) is stored as two int8 digits,
// q = 128*hi + lo with lo in [-64, 63] and hi in [-64, 64], each operand's vectors contiguous
// along k and k padded with zeros to a multiple of kPadK. Two product kernels compute the same
// integers (sums of integers are exact in any order):
// - tensor cores (sm_80 and later): mma.sync m16n8k32 s8 x s8 -> s32 for the digit products
//   HH, HL + LH and LL, each summed in int32 over at most kFlushK values of k (|HH|, |LL| <=
//   kFlushK * 2^12, |HL + LH| <= kFlushK * 2^13 < 2^31), then S = 2^14 HH + 2^7 (HL + LH) + LL in
//   int64;
// - integer units (any device): q = 128*hi + lo rebuilt in shared memory, kChunk products summed
//   in int32 (<= kChunk * 2^26 < 2^31), the chunks in int64.
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

// Sets with inner == 1 (rows of a row-major matrix): one warp per vector, kRowWarps per block.
constexpr int kRowWarps = 8;
// Sets with inner != 1 (columns of a row-major matrix): a block of kColVectors x kColRows threads
// takes kColVectors adjacent vectors, lane = vector, so that a warp reads one position of 32
// vectors (adjacent floats when outer == 1); the digits go through a shared tile of kColP
// positions per vector and leave as one warp per vector, four digits per lane and 32-bit store.
// 32 rows measured fastest of 8, 16 and 32 on an H100 (bench/RESULTS.md); at 32, two blocks per SM
// keep ~26 MB of 768-long tiles in flight, within L2, where a tile's second read (the digits) can hit.
constexpr int kColVectors = 32;
constexpr int kColRows = 32;
constexpr int kColP = 4 * kColVectors;
static_assert(kPadK % 4 == 0 && kColP % 4 == 0, "a tile's positions are whole 32-bit words of digits");
// The integer-unit product: a kTile x kTile tile of C per block of kTileThreads x kTileThreads
// threads (each thread kTile/kTileThreads squared elements), k in chunks of kChunk.
constexpr int kTile = 64;
constexpr int kTileThreads = 16;
constexpr int kPerThread = kTile / kTileThreads;
constexpr int kChunk = 16;
// A chunk's int32 sum holds at most kChunk products of |q| <= 2^13 each: <= kChunk * 2^26 < 2^31.
static_assert(static_cast<int64_t>(kChunk) << (2 * math::kFixedPointBits) < (int64_t{1} << 31),
              "a chunk's int32 sum cannot overflow");
static_assert((kTile * kChunk) % (kTileThreads * kTileThreads) == 0, "whole loads per thread");
static_assert(kPadK % kChunk == 0, "a padded k is a whole number of chunks");
// The tensor-core product: a block of 2 x 2 warps, each warp a 32 x 16 piece of C (2 x 2 tiles of
// 16 x 8), k in steps of 32; the int32 digit sums are moved into int64 every kFlushK values of k.
constexpr int kMmaWarpRows = 32, kMmaWarpCols = 16;
constexpr int kMmaBlockRows = 2 * kMmaWarpRows, kMmaBlockCols = 2 * kMmaWarpCols;
constexpr size_t kFlushK = size_t{1} << 16;
// A digit product is at most 64 * 64 = 2^12; HL + LH adds two per k.
static_assert(static_cast<int64_t>(kFlushK) * (int64_t{2} << 12) < (int64_t{1} << 31),
              "the int32 digit sums cannot overflow");
static_assert(kFlushK % kPadK == 0, "a flush block is a whole number of k steps");

// position_digits of the element at position p of `vector` (vector v of the set).
__device__ __forceinline__ math::FixedPointDigits element_digits(const VectorSet& set, const float* vector, size_t v,
                                                                 size_t p, bool vector_finite, int shift) {
  return position_digits(p, set.len, vector_finite, set.zero_diagonal, v, shift,
                         [&] { return vector[p * set.inner]; });
}

// A set with inner == 1 (rows of a row-major matrix), scales and digits in one pass: one warp
// per vector g = m * count + v (kRowWarps warps per block, grid-stride over the nb * count
// vectors), its lanes adjacent positions. First the vector's largest magnitude and whether it is
// finite (element p = v taken as +0.0f with set.zero_diagonal), a max and an "or" over the warp's
// lanes (exact in any order), hence its shift, written at g; then its digits from the same
// elements (read again, from cache), each lane four adjacent positions as one 32-bit word per
// digit plane at [g * kp + p] (kp and the planes' alignment: exact_matmul_internal.cuh), zeros
// past len.
__global__ void __launch_bounds__(32 * kRowWarps)
    row_digits_kernel(const VectorSet set, size_t kp, int* shift, int* finite, int8_t* hi, int8_t* lo, int8_t* sum,
                      SkipFlags skip) {
  if (skip_now(skip)) return;
  const int lane = threadIdx.x % 32;
  const size_t vectors = set.nb * set.count, stride = static_cast<size_t>(gridDim.x) * kRowWarps;
  for (size_t g = static_cast<size_t>(blockIdx.x) * kRowWarps + threadIdx.x / 32; g < vectors; g += stride) {
    const size_t v = g % set.count;
    const float* vector = set.base + (g / set.count) * set.mstride + v * set.outer;
    VectorScale scale;
    for (size_t p = lane; p < set.len; p += 32) scale.take(set.zero_diagonal && p == v ? 0.0f : fabsf(vector[p]));
    scale.merge_warp();  // every lane of the warp has the same g: the whole warp takes part
    const bool vector_finite = scale.finite();
    const int vector_shift = scale.shift();
    if (lane == 0) {
      finite[g] = vector_finite;
      shift[g] = vector_shift;
    }
    for (size_t p0 = 4 * static_cast<size_t>(lane); p0 < kp; p0 += 4 * 32) {
      store_digit_quad(hi, lo, sum, g * kp + p0, [&](int q) {
        return element_digits(set, vector, v, p0 + q, vector_finite, vector_shift);
      });
    }
  }
}

// A set with inner != 1 (columns of a row-major matrix), scales and digits in one kernel: one
// block of kColVectors x kColRows threads per tile of kColVectors adjacent vectors of one matrix
// (grid-stride over the tiles). First the scales: the thread (x, y) takes vector x of the tile at
// positions y, y + kColRows, ... (a warp reads one position of adjacent vectors), then row y = 0
// merges the kColRows partial maxima and flags of its vector and writes its shift and finiteness
// (to g, and to shared memory for the digits). The elements, the +0.0f of a zero diagonal and the
// non-finite test are row_digits_kernel's; a max and an "or" are exact in any order, so the shift
// and the flag are the same. Then the digits, kColP positions at a time through a shared tile:
// the thread (x, y) converts vector x at positions y, y + kColRows, ... of the piece (reading the
// elements again, from cache), then warp y writes vectors y, y + kColRows, ... of the tile, lane x
// positions 4x .. 4x + 3 as one 32-bit word per digit array (a warp's store: 128 contiguous
// bytes). Each digit is element_digits of its element; only the order of the stores differs from
// row_digits_kernel's. kp - p0 is a multiple of 4 (kp of kPadK), and hi/lo/sum are 4-byte aligned
// (exact_matmul_internal.cuh), so the words are whole and aligned. A row of the tile is kColP / 4
// + 1 words: the byte stores of phase one (32 vectors, one position) and the word loads of phase
// two (one vector, 32 words) meet 32 different banks.
__global__ void __launch_bounds__(kColVectors* kColRows)
    column_digits_kernel(const VectorSet set, size_t kp, int* shift, int* finite, int8_t* hi, int8_t* lo, int8_t* sum,
                         SkipFlags skip) {
  if (skip_now(skip)) return;
  constexpr int kWords = kColP / 4 + 1;
  __shared__ float amax[kColRows][kColVectors];
  __shared__ int bad[kColRows][kColVectors];
  __shared__ int tile_shift[kColVectors];
  __shared__ int tile_finite[kColVectors];
  __shared__ uint32_t tile[3][kColVectors][kWords];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const size_t tiles_v = (set.count + kColVectors - 1) / kColVectors;
  for (size_t t = blockIdx.x; t < set.nb * tiles_v; t += gridDim.x) {
    const size_t m = t / tiles_v, v0 = (t % tiles_v) * kColVectors;
    const size_t v = v0 + tx;
    const float* vector = set.base + m * set.mstride + v * set.outer;
    VectorScale scale;
    if (v < set.count) {
      for (size_t p = ty; p < set.len; p += kColRows) {
        scale.take(set.zero_diagonal && p == v ? 0.0f : fabsf(vector[p * set.inner]));
      }
    }
    amax[ty][tx] = scale.max_magnitude;
    bad[ty][tx] = scale.nonfinite;
    __syncthreads();
    if (ty == 0 && v < set.count) {
      for (int y = 1; y < kColRows; ++y) scale.merge(amax[y][tx], bad[y][tx]);
      const size_t g = m * set.count + v;
      const int vector_shift = scale.shift();
      finite[g] = scale.finite();
      shift[g] = vector_shift;
      tile_finite[tx] = scale.finite();
      tile_shift[tx] = vector_shift;
    }
    __syncthreads();
    for (size_t p0 = 0; p0 < kp; p0 += kColP) {
      const int np = static_cast<int>(kp - p0 < static_cast<size_t>(kColP) ? kp - p0 : kColP);
      if (v < set.count) {
        const bool vector_finite = tile_finite[tx] != 0;
        const int vector_shift = tile_shift[tx];
        // The tile's words as bytes (the lower position in the lower byte, as in memory); an
        // int8's byte is its value mod 256.
        unsigned char* row_hi = reinterpret_cast<unsigned char*>(tile[0][tx]);
        unsigned char* row_lo = reinterpret_cast<unsigned char*>(tile[1][tx]);
        unsigned char* row_sum = reinterpret_cast<unsigned char*>(tile[2][tx]);
        for (int pl = ty; pl < np; pl += kColRows) {
          const math::FixedPointDigits d = element_digits(set, vector, v, p0 + pl, vector_finite, vector_shift);
          row_hi[pl] = static_cast<unsigned char>(d.hi);
          row_lo[pl] = static_cast<unsigned char>(d.lo);
          row_sum[pl] = static_cast<unsigned char>(d.sum);
        }
      }
      __syncthreads();
      if (4 * tx < np) {
        for (int vl = ty; vl < kColVectors && v0 + vl < set.count; vl += kColRows) {
          const size_t at = (m * set.count + v0 + vl) * kp + p0 + 4 * static_cast<size_t>(tx);
          *reinterpret_cast<uint32_t*>(hi + at) = tile[0][vl][tx];
          *reinterpret_cast<uint32_t*>(lo + at) = tile[1][vl][tx];
          if (sum != nullptr) *reinterpret_cast<uint32_t*>(sum + at) = tile[2][vl][tx];
        }
      }
      __syncthreads();  // the tile is rewritten by the next piece
    }
  }
}

// C[i][j] from the exact sum S: the one rounding, or a NaN for a non-finite row or column.
__device__ __forceinline__ float product_value(int64_t sum, size_t i, size_t j, const int* row_shift,
                                               const int* row_finite, const int* col_shift, const int* col_finite) {
  return (row_finite[i] && col_finite[j]) ? math::from_fixed_point(sum, row_shift[i], col_shift[j])
                                          : __int_as_float(0x7fc00000);  // quiet NaN
}

// Operands of the product kernels: A's digits (m x kp, row i contiguous), B's (n x kp, column j
// of B contiguous), the scales and finiteness of both, C.
struct Digits {
  const int8_t* __restrict__ ah;
  const int8_t* __restrict__ al;
  const int8_t* __restrict__ bh;
  const int8_t* __restrict__ bl;
  const int* __restrict__ row_shift;
  const int* __restrict__ row_finite;
  const int* __restrict__ col_shift;
  const int* __restrict__ col_finite;
};

// Integer units: one block per kTile x kTile tile of C (grid-stride over tiles); out-of-range rows
// and columns load as 0 (adding 0 changes no integer sum).
__global__ void __launch_bounds__(kTileThreads* kTileThreads)
    integer_product_kernel(const Digits d, float* __restrict__ c, size_t m, size_t kp, size_t n, SkipFlags skip) {
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
    for (size_t p0 = 0; p0 < kp; p0 += kChunk) {
#pragma unroll
      for (int l = 0; l < kTile * kChunk / (kTileThreads * kTileThreads); ++l) {
        const int idx = tid + l * kTileThreads * kTileThreads;
        const int v = idx / kChunk, p = idx % kChunk;
        const size_t i = i0 + v, j = j0 + v, at_a = i * kp + p0 + p, at_b = j * kp + p0 + p;
        as[p][v] = i < m ? 128 * static_cast<int32_t>(d.ah[at_a]) + d.al[at_a] : 0;
        bs[p][v] = j < n ? 128 * static_cast<int32_t>(d.bh[at_b]) + d.bl[at_b] : 0;
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
        if (j < n) c[i * n + j] = product_value(sum[a][b], i, j, d.row_shift, d.row_finite, d.col_shift, d.col_finite);
      }
    }
  }
}

// Four consecutive int8 digits of a row (k contiguous) as one 32-bit fragment register (the lower
// k in the lower byte, as mma reads it); 0 past the last row.
__device__ __forceinline__ uint32_t digit_quad(const int8_t* base, size_t row, size_t rows, size_t kp, size_t k) {
  return row < rows ? *reinterpret_cast<const uint32_t*>(base + row * kp + k) : 0u;
}

// D += A B for one m16n8k32 tile, int8 digits, int32 sums.
__device__ __forceinline__ void mma_s8(int32_t (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();  // never launched below sm_80 (tensor_cores_available)
#endif
}

// f(a, b, r) for every register r of every 16 x 8 fragment (a, b) of a warp's 32 x 16 piece of C,
// unrolled, so that the fragment arrays stay in registers.
template <class F>
__device__ __forceinline__ void for_each_fragment_register(F f) {
#pragma unroll
  for (int a = 0; a < 2; ++a) {
#pragma unroll
    for (int b = 0; b < 2; ++b) {
#pragma unroll
      for (int r = 0; r < 4; ++r) f(a, b, r);
    }
  }
}

// Tensor cores: one block of 4 warps per kMmaBlockRows x kMmaBlockCols tile of C (grid-stride
// over tiles), warp w the 32 x 16 piece at rows 32*(w/2), columns 16*(w%2). The fragments follow
// the PTX layout of m16n8k32 (.row A, .col B; g = lane/4, t = lane%4): A registers 0..3 hold
// rows g, g+8, g, g+8 at k 4t..4t+3, 4t..4t+3, 16+4t.., 16+4t..; B registers 0, 1 column g at k
// 4t.., 16+4t..; D registers 0..3 rows g, g, g+8, g+8 at columns 2t, 2t+1, 2t, 2t+1.
__global__ void __launch_bounds__(128)
    mma_product_kernel(const Digits d, float* __restrict__ c, size_t m, size_t kp, size_t n, SkipFlags skip) {
  if (skip_now(skip)) return;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, tq = lane % 4;
  const size_t tiles_n = (n + kMmaBlockCols - 1) / kMmaBlockCols;
  const size_t tiles = ((m + kMmaBlockRows - 1) / kMmaBlockRows) * tiles_n;
  for (size_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const size_t i0 = (t / tiles_n) * kMmaBlockRows + (warp / 2) * kMmaWarpRows;
    const size_t j0 = (t % tiles_n) * kMmaBlockCols + (warp % 2) * kMmaWarpCols;
    int64_t sum[2][2][4];
    for_each_fragment_register([&](int a, int b, int r) { sum[a][b][r] = 0; });
    for (size_t k0 = 0; k0 < kp; k0 += kFlushK) {
      const size_t k_end = k0 + kFlushK < kp ? k0 + kFlushK : kp;
      int32_t hh[2][2][4] = {}, mid[2][2][4] = {}, ll[2][2][4] = {};
      for (size_t k = k0; k < k_end; k += kPadK) {
        uint32_t ah[2][4], al[2][4], bh[2][2], bl[2][2];
#pragma unroll
        for (int a = 0; a < 2; ++a) {
          const size_t r0 = i0 + a * 16 + g, r1 = r0 + 8;
          ah[a][0] = digit_quad(d.ah, r0, m, kp, k + 4 * tq);
          ah[a][1] = digit_quad(d.ah, r1, m, kp, k + 4 * tq);
          ah[a][2] = digit_quad(d.ah, r0, m, kp, k + 16 + 4 * tq);
          ah[a][3] = digit_quad(d.ah, r1, m, kp, k + 16 + 4 * tq);
          al[a][0] = digit_quad(d.al, r0, m, kp, k + 4 * tq);
          al[a][1] = digit_quad(d.al, r1, m, kp, k + 4 * tq);
          al[a][2] = digit_quad(d.al, r0, m, kp, k + 16 + 4 * tq);
          al[a][3] = digit_quad(d.al, r1, m, kp, k + 16 + 4 * tq);
        }
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const size_t col = j0 + b * 8 + g;
          bh[b][0] = digit_quad(d.bh, col, n, kp, k + 4 * tq);
          bh[b][1] = digit_quad(d.bh, col, n, kp, k + 16 + 4 * tq);
          bl[b][0] = digit_quad(d.bl, col, n, kp, k + 4 * tq);
          bl[b][1] = digit_quad(d.bl, col, n, kp, k + 16 + 4 * tq);
        }
#pragma unroll
        for (int a = 0; a < 2; ++a) {
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            mma_s8(hh[a][b], ah[a], bh[b]);
            mma_s8(mid[a][b], ah[a], bl[b]);
            mma_s8(mid[a][b], al[a], bh[b]);
            mma_s8(ll[a][b], al[a], bl[b]);
          }
        }
      }
      for_each_fragment_register([&](int a, int b, int r) {
        sum[a][b][r] += math::from_digit_cross_sums(hh[a][b][r], mid[a][b][r], ll[a][b][r]);
      });
    }
    for_each_fragment_register([&](int a, int b, int r) {
      const size_t i = i0 + a * 16 + g + (r >= 2 ? 8 : 0);
      const size_t j = j0 + b * 8 + 2 * tq + (r & 1);
      if (i < m && j < n) {
        c[i * n + j] = product_value(sum[a][b][r], i, j, d.row_shift, d.row_finite, d.col_shift, d.col_finite);
      }
    });
  }
}

// Whether the current device has int8 mma (compute capability 8.0 or later), asked once per device.
bool tensor_cores_available() {
  int device = 0;
  RN_CUDA_CHECK(cudaGetDevice(&device));
  static int cached_device = -1;
  static bool cached = false;
  if (device != cached_device) {
    int major = 0;
    RN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    cached = major >= 8;
    cached_device = device;
  }
  return cached;
}

}  // namespace

size_t padded_k(size_t k) { return (k + kPadK - 1) / kPadK * kPadK; }

void launch_digits(const VectorSet& set, size_t kp, int* shift, int* finite, int8_t* hi, int8_t* lo, int8_t* sum,
                   cudaStream_t stream, SkipFlags skip) {
  if (set.nb * set.count == 0) return;
  if (set.inner != 1) {
    const size_t tiles_v = set.nb * ((set.count + kColVectors - 1) / kColVectors);
    column_digits_kernel<<<grid_of(tiles_v, 1), dim3(kColVectors, kColRows), 0, stream>>>(set, kp, shift, finite, hi,
                                                                                            lo, sum, skip);
    RN_CUDA_CHECK_LAUNCH("exact matmul scales and digits");
  } else {
    row_digits_kernel<<<grid_of(set.nb * set.count, kRowWarps), 32 * kRowWarps, 0, stream>>>(set, kp, shift, finite,
                                                                                               hi, lo, sum, skip);
    RN_CUDA_CHECK_LAUNCH("exact matmul scales and digits");
  }
}

MatmulBounds matmul_bounds(size_t m, size_t k, size_t n) { return {m, n, m * padded_k(k), n * padded_k(k)}; }

size_t matmul_scratch_bytes(const MatmulBounds& b) {
  return 2 * aligned(b.m * sizeof(int)) + 2 * aligned(b.n * sizeof(int)) + 2 * aligned(b.mk) + 2 * aligned(b.kn);
}

void matmul_launch(DeviceMatrix a, DeviceMatrix b, float* c, size_t m, size_t k, size_t n, void* scratch,
                   cudaStream_t stream, SkipFlags skip, ExactKernel kernel, bool a_zero_diagonal,
                   bool b_zero_diagonal) {
  if (k > math::kExactMatmulMaxK) {
    throw Error(ErrorKind::kInvalidArgument, "exact matmul: k = " + std::to_string(k) + " is above " +
                                                 std::to_string(math::kExactMatmulMaxK));
  }
  if ((a_zero_diagonal && m != k) || (b_zero_diagonal && k != n)) {
    throw Error(ErrorKind::kInvalidArgument, "exact matmul: a zero diagonal needs a square operand");
  }
  if (m == 0 || n == 0) return;
  const size_t kp = padded_k(k);
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
  int8_t* ah = reinterpret_cast<int8_t*>(take(m * kp));
  int8_t* al = reinterpret_cast<int8_t*>(take(m * kp));
  int8_t* bh = reinterpret_cast<int8_t*>(take(n * kp));
  int8_t* bl = reinterpret_cast<int8_t*>(take(n * kp));
  const VectorSet rows_of_a{a.data, 1, m, k, a.row_stride, a.col_stride, 0, a_zero_diagonal};
  const VectorSet cols_of_b{b.data, 1, n, k, b.col_stride, b.row_stride, 0, b_zero_diagonal};
  launch_digits(rows_of_a, kp, row_shift, row_finite, ah, al, nullptr, stream, skip);
  launch_digits(cols_of_b, kp, col_shift, col_finite, bh, bl, nullptr, stream, skip);
  const Digits d{ah, al, bh, bl, row_shift, row_finite, col_shift, col_finite};
  const bool mma = kernel == ExactKernel::kTensorCores || (kernel == ExactKernel::kAuto && tensor_cores_available());
  if (kernel == ExactKernel::kTensorCores && !tensor_cores_available()) {
    throw Error(ErrorKind::kInvalidArgument, "exact matmul: the tensor-core kernel needs compute capability 8.0");
  }
  if (mma) {
    const size_t tiles = ((m + kMmaBlockRows - 1) / kMmaBlockRows) * ((n + kMmaBlockCols - 1) / kMmaBlockCols);
    mma_product_kernel<<<grid_of(tiles, 1), 128, 0, stream>>>(d, c, m, kp, n, skip);
    RN_CUDA_CHECK_LAUNCH("exact matmul tensor-core product");
  } else {
    const size_t tiles = ((m + kTile - 1) / kTile) * ((n + kTile - 1) / kTile);
    integer_product_kernel<<<grid_of(tiles, 1), dim3(kTileThreads, kTileThreads), 0, stream>>>(d, c, m, kp, n, skip);
    RN_CUDA_CHECK_LAUNCH("exact matmul integer product");
  }
}

size_t exact_matmul_scratch_bytes(size_t m, size_t k, size_t n) { return matmul_scratch_bytes(matmul_bounds(m, k, n)); }

void exact_matmul_launch(DeviceMatrix a, DeviceMatrix b, float* c, size_t m, size_t k, size_t n, void* scratch,
                         CUstream_st* stream, SkipFlags skip) {
  matmul_launch(a, b, c, m, k, n, scratch, stream, skip, ExactKernel::kAuto);
}

void exact_matmul_device(const float* a, const float* b, float* c, size_t m, size_t k, size_t n, ExactKernel kernel) {
  if (k > math::kExactMatmulMaxK) {
    throw Error(ErrorKind::kInvalidArgument, "exact matmul: k = " + std::to_string(k) + " is above " +
                                                 std::to_string(math::kExactMatmulMaxK));
  }
  if (m == 0 || n == 0) return;
  void* scratch = nullptr;
  RN_CUDA_CHECK(cudaMalloc(&scratch, exact_matmul_scratch_bytes(m, k, n)));
  matmul_launch({a, k, 1}, {b, n, 1}, c, m, k, n, scratch, nullptr, {}, kernel);
  RN_CUDA_CHECK(cudaDeviceSynchronize());
  RN_CUDA_CHECK(cudaFree(scratch));
}

void exact_matmul_on_device(const float* a, const float* b, float* c, size_t m, size_t k, size_t n, ExactKernel kernel) {
  float *da = nullptr, *db = nullptr, *dc = nullptr;
  RN_CUDA_CHECK(cudaMalloc(&da, (m * k + 1) * sizeof(float)));
  RN_CUDA_CHECK(cudaMalloc(&db, (k * n + 1) * sizeof(float)));
  RN_CUDA_CHECK(cudaMalloc(&dc, (m * n + 1) * sizeof(float)));
  RN_CUDA_CHECK(cudaMemcpy(da, a, m * k * sizeof(float), cudaMemcpyHostToDevice));
  RN_CUDA_CHECK(cudaMemcpy(db, b, k * n * sizeof(float), cudaMemcpyHostToDevice));
  exact_matmul_device(da, db, dc, m, k, n, kernel);
  RN_CUDA_CHECK(cudaMemcpy(c, dc, m * n * sizeof(float), cudaMemcpyDeviceToHost));
  RN_CUDA_CHECK(cudaFree(da));
  RN_CUDA_CHECK(cudaFree(db));
  RN_CUDA_CHECK(cudaFree(dc));
}

}  // namespace cuda
}  // namespace renaissance
