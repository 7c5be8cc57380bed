// Muon's exact-mode Newton–Schulz on a CUDA device, step by step the host reference
// math::newton_schulz_reference: ‖u‖_F in the canonical tensor-norm order of
// renaissance/math/norm_reduction.h (tile partials of kNormTile elements in kNormLanes lanes of
// quads and the halving tree, then the tile partials by math::tensor_sum_lane and the same tree),
// X = u / max(‖u‖_F, eps) (transposed when rows > cols), then per step the exact products of
// exact_matmul.cu and the element-wise steps of renaissance/math/newton_schulz.h (single rounded
// fp32 operations; device code is compiled with --fmad=false, and the division is __fdiv_rn).
#include "backend_cuda/newton_schulz.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/exact_matmul_internal.cuh"
#include "renaissance/error.h"
#include "renaissance/math/exact_matmul.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/math/newton_schulz.h"

namespace renaissance {
namespace cuda {
namespace {

using math::kNormLanes;
constexpr int kElementThreads = 256;

// math::norm_lane_tree over the block's kNormLanes threads through shared memory (lane j adds
// lane j + s, s = 128 ... 1); the root is left in lanes[0]. Every thread of the block calls it.
__device__ __forceinline__ void lane_tree(double* lanes) {
  const int j = threadIdx.x;
  for (int s = kNormLanes / 2; s > 0; s >>= 1) {
    if (j < s) lanes[j] = lanes[j] + lanes[j + s];
    __syncthreads();
  }
}

// One block of kNormLanes threads per tile of u (grid-stride): thread j is lane j and adds, in
// increasing element order, the squares (in double) of elements r*kNormRound + 4j + q (rounds r,
// quad q) of the tile; the tree makes the tile's partial, stored as partials[kNormComponents * t]
// (the layout math::tensor_sum_lane reads; the other component is 0).
__global__ void __launch_bounds__(kNormLanes)
    norm_tiles_kernel(const float* __restrict__ u, int64_t count, double* __restrict__ partials,
                      SkipFlags skip) {
  if (skip_now(skip)) return;
  __shared__ double lanes[kNormLanes];
  const int j = threadIdx.x;
  const int64_t tiles = (count + math::kNormTile - 1) / math::kNormTile;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t begin = t * math::kNormTile;
    const int length = static_cast<int>(count - begin < math::kNormTile ? count - begin : math::kNormTile);
    double acc = 0.0;
    for (int r = 0; r < math::kNormRounds; ++r) {
      for (int q = 0; q < math::kNormQuad; ++q) {
        const int e = r * math::kNormRound + math::kNormQuad * j + q;  // norm_lane_of(e) == j
        if (e < length) acc = acc + math::square_in_double(u[begin + e]);
      }
    }
    lanes[j] = acc;
    __syncthreads();
    lane_tree(lanes);
    if (j == 0) {
      partials[math::kNormComponents * t] = lanes[0];
      partials[math::kNormComponents * t + 1] = 0.0;
    }
    __syncthreads();  // lanes[0] is read before the next tile overwrites it
  }
}

// One block of kNormLanes threads: the tiles' partials combined as math::combine_tile_partials
// does (sum-lane j = math::tensor_sum_lane, then the tree), the norm float(sqrt(sum)), and the
// denominator max(norm, eps) as the reference forms it (norm > eps ? norm : eps).
__global__ void __launch_bounds__(kNormLanes)
    norm_denominator_kernel(const double* __restrict__ partials, int64_t tiles, const float* __restrict__ eps,
                            float* __restrict__ denom, SkipFlags skip) {
  if (skip_now(skip)) return;
  __shared__ double lanes[kNormLanes];
  double sums[math::kNormComponents];
  math::tensor_sum_lane(partials, tiles, static_cast<int>(threadIdx.x), sums);
  lanes[threadIdx.x] = sums[0];
  __syncthreads();
  lane_tree(lanes);
  if (threadIdx.x == 0) {
    const float norm = static_cast<float>(sqrt(lanes[0]));
    const float e = *eps;
    *denom = math::newton_schulz_denominator(norm, e);
  }
}

// X (r x c) = u / denom, X = u^T when transposed (u is rows x cols; r x c = cols x rows then).
__global__ void load_x_kernel(const float* __restrict__ u, size_t cols, bool transposed, size_t r, size_t c,
                              const float* __restrict__ denom, float* __restrict__ x, SkipFlags skip) {
  if (skip_now(skip)) return;
  const float d = *denom;
  for (size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < r * c;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t i = e / c, j = e % c;
    const float v = transposed ? u[j * cols + i] : u[i * cols + j];
    x[e] = __fdiv_rn(v, d);
  }
}

// B = (b * A) + (c * P), in place over A.
__global__ void polynomial_kernel(float* __restrict__ gram, const float* __restrict__ gram2, size_t count,
                                  const float* __restrict__ b, const float* __restrict__ c, SkipFlags skip) {
  if (skip_now(skip)) return;
  const float bf = *b, cf = *c;
  for (size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    gram[e] = math::newton_schulz_polynomial(bf, cf, gram[e], gram2[e]);
  }
}

// X = (a * X) + Q.
__global__ void update_x_kernel(float* __restrict__ x, const float* __restrict__ q, size_t count,
                                const float* __restrict__ a, SkipFlags skip) {
  if (skip_now(skip)) return;
  const float af = *a;
  for (size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[e] = math::newton_schulz_combine(af, x[e], q[e]);
  }
}

// out (rows x cols) = X, or X^T when transposed.
__global__ void store_out_kernel(const float* __restrict__ x, size_t cols, bool transposed, size_t r, size_t c,
                                 float* __restrict__ out, SkipFlags skip) {
  if (skip_now(skip)) return;
  for (size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < r * c;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t i = e / c, j = e % c;
    out[transposed ? j * cols + i : e] = x[e];
  }
}

unsigned grid_of(size_t items, unsigned per_block) {
  const size_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(blocks, size_t{1} << 20)));
}

size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The scratch of an r x c iteration (r <= c), in order: the norm's tile partials, the
// denominator, X, A (then B in place), P, Q, and the products' scratch, sized for the three
// products (r x c)(c x r), (r x r)(r x r), (r x r)(r x c).
struct Layout {
  size_t partials, denom, x, gram, gram2, q, matmul, total;
  Layout(size_t r, size_t c) {
    const size_t tiles = (r * c + math::kNormTile - 1) / math::kNormTile;
    size_t at = 0;
    auto take = [&at](size_t bytes) {
      const size_t p = at;
      at += aligned(bytes);
      return p;
    };
    partials = take(std::max<size_t>(1, tiles) * math::kNormComponents * sizeof(double));
    denom = take(sizeof(float));
    x = take(r * c * sizeof(float));
    gram = take(r * r * sizeof(float));
    gram2 = take(r * r * sizeof(float));
    q = take(r * c * sizeof(float));
    // The three products' bounds: (r, c, r), (r, r, r), (r, r, c) as (m, k, n).
    const MatmulBounds p1 = matmul_bounds(r, c, r), p2 = matmul_bounds(r, r, r), p3 = matmul_bounds(r, r, c);
    matmul = take(matmul_scratch_bytes({r, c, std::max({p1.mk, p2.mk, p3.mk}), std::max({p1.kn, p2.kn, p3.kn})}));
    total = at;
  }
};

}  // namespace

size_t newton_schulz_scratch_bytes(size_t rows, size_t cols) {
  const size_t r = std::min(rows, cols), c = std::max(rows, cols);
  return Layout(r, c).total;
}

void newton_schulz_device(const float* u, size_t rows, size_t cols, float* out, const NewtonSchulzScalars& s,
                          int steps, void* scratch, CUstream_st* stream, SkipFlags skip) {
  const bool transposed = rows > cols;
  const size_t r = transposed ? cols : rows, c = transposed ? rows : cols;  // X is r x c, r <= c
  if (c > math::kExactMatmulMaxK) {
    throw Error(ErrorKind::kInvalidArgument, "newton-schulz: a side of " + std::to_string(c) + " is above " +
                                                 std::to_string(math::kExactMatmulMaxK));
  }
  if (steps < 0) throw Error(ErrorKind::kInvalidArgument, "newton-schulz: steps = " + std::to_string(steps));
  if (r == 0) return;
  const Layout l(r, c);
  char* base = static_cast<char*>(scratch);
  double* partials = reinterpret_cast<double*>(base + l.partials);
  float* denom = reinterpret_cast<float*>(base + l.denom);
  float* x = reinterpret_cast<float*>(base + l.x);
  float* gram = reinterpret_cast<float*>(base + l.gram);
  float* gram2 = reinterpret_cast<float*>(base + l.gram2);
  float* q = reinterpret_cast<float*>(base + l.q);
  void* mm = base + l.matmul;
  const int64_t count = static_cast<int64_t>(r * c);
  const int64_t tiles = (count + math::kNormTile - 1) / math::kNormTile;

  norm_tiles_kernel<<<grid_of(static_cast<size_t>(tiles), 1), kNormLanes, 0, stream>>>(u, count, partials, skip);
  RN_CUDA_CHECK_LAUNCH("newton-schulz norm tiles");
  norm_denominator_kernel<<<1, kNormLanes, 0, stream>>>(partials, tiles, s.eps, denom, skip);
  RN_CUDA_CHECK_LAUNCH("newton-schulz norm");
  load_x_kernel<<<grid_of(r * c, kElementThreads), kElementThreads, 0, stream>>>(u, cols, transposed, r, c, denom, x,
                                                                                  skip);
  RN_CUDA_CHECK_LAUNCH("newton-schulz normalise");
  for (int step = 0; step < steps; ++step) {
    matmul_launch({x, c, 1}, {x, 1, c}, gram, r, c, r, mm, stream, skip, ExactKernel::kAuto);          // A = X X^T
    matmul_launch({gram, r, 1}, {gram, r, 1}, gram2, r, r, r, mm, stream, skip, ExactKernel::kAuto);   // P = A A
    polynomial_kernel<<<grid_of(r * r, kElementThreads), kElementThreads, 0, stream>>>(gram, gram2, r * r, s.b, s.c,
                                                                                        skip);
    RN_CUDA_CHECK_LAUNCH("newton-schulz polynomial");
    matmul_launch({gram, r, 1}, {x, c, 1}, q, r, r, c, mm, stream, skip, ExactKernel::kAuto);          // Q = B X
    update_x_kernel<<<grid_of(r * c, kElementThreads), kElementThreads, 0, stream>>>(x, q, r * c, s.a, skip);
    RN_CUDA_CHECK_LAUNCH("newton-schulz update");
  }
  store_out_kernel<<<grid_of(r * c, kElementThreads), kElementThreads, 0, stream>>>(x, cols, transposed, r, c, out,
                                                                                     skip);
  RN_CUDA_CHECK_LAUNCH("newton-schulz store");
}

bool newton_schulz_on_device(const float* u, size_t rows, size_t cols, float* out,
                             const math::NewtonSchulzCoefficients& coeff, int steps, float eps) {
  if (std::max(rows, cols) > math::kExactMatmulMaxK) return false;
  const size_t count = rows * cols;
  float *du = nullptr, *scalars = nullptr;
  void* scratch = nullptr;
  RN_CUDA_CHECK(cudaMalloc(&du, (count + 1) * sizeof(float)));
  RN_CUDA_CHECK(cudaMalloc(&scalars, 4 * sizeof(float)));
  RN_CUDA_CHECK(cudaMalloc(&scratch, newton_schulz_scratch_bytes(rows, cols) + 256));
  const float host_scalars[4] = {coeff.a, coeff.b, coeff.c, eps};
  RN_CUDA_CHECK(cudaMemcpy(du, u, count * sizeof(float), cudaMemcpyHostToDevice));
  RN_CUDA_CHECK(cudaMemcpy(scalars, host_scalars, sizeof(host_scalars), cudaMemcpyHostToDevice));
  newton_schulz_device(du, rows, cols, du, {scalars, scalars + 1, scalars + 2, scalars + 3}, steps, scratch, nullptr);
  RN_CUDA_CHECK(cudaDeviceSynchronize());
  RN_CUDA_CHECK(cudaMemcpy(out, du, count * sizeof(float), cudaMemcpyDeviceToHost));
  RN_CUDA_CHECK(cudaFree(du));
  RN_CUDA_CHECK(cudaFree(scalars));
  RN_CUDA_CHECK(cudaFree(scratch));
  return true;
}

}  // namespace cuda
}  // namespace renaissance
