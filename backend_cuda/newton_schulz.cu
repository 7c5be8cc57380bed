// Muon's exact-mode Newton–Schulz on a CUDA device, step by step the host reference
// math::newton_schulz_reference: ‖u‖_F in the canonical tensor-norm order of
// renaissance/math/norm_reduction.h (tile partials of kNormTile elements in kNormLanes lanes of
// quads and the halving tree, then the tile partials by math::tensor_sum_lane and the same tree),
// X = u / max(‖u‖_F, eps) (transposed when rows > cols), then per step the exact products of
// exact_matmul.cu and the element-wise steps of renaissance/math/newton_schulz.h (single rounded
// fp32 operations; device code is compiled with --fmad=false, and the division is __fdiv_rn).
// P = A A and Q = B X go through the reference's diagonal split: the exact product takes A (B) with
// its diagonal taken as +0.0f in the operand's scales and digits (VectorSet::zero_diagonal, no
// copy), and the diagonal's share is added in fp32 by newton_schulz_square_from_split and
// newton_schulz_apply_from_split in the kernel that applies the element-wise step.
// The kernels take a batch: the matrices of one shape class (NewtonSchulzEntry table; null: one
// matrix at 0), each X in its own r x c slice of one slab. NewtonSchulzBatch's exact products are
// three cuBLASLt int8 products over the class (exact_matmul_internal.cuh's three-product form) and
// one combining kernel (newton_schulz_combine.cuh) that forms each exact sum in int64, rounds it
// once and applies the iteration's element-wise step. Fast mode keeps X, A and B in bf16 slabs
// (the normalisation rounds X to bf16, the store widens it) and its products are cuBLASLt's bf16
// products with the element-wise steps as their alpha/beta (torch's bf16 addmm form).
#include "backend_cuda/newton_schulz.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/exact_matmul_internal.cuh"
#include "backend_cuda/lane_tree.cuh"
#include "backend_cuda/newton_schulz_combine.cuh"
#include "backend_cuda/slab_tiles.cuh"
#include "renaissance/error.h"
#include "renaissance/math/exact_matmul.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/math/newton_schulz.h"
#include "renaissance/math/precision.h"

namespace renaissance {
namespace cuda {
namespace {

using math::kNormLanes;
constexpr int kElementThreads = 256;

// One block of kNormLanes threads per tile of entry blockIdx.y's matrix (grid-stride over the
// tiles): thread j is lane j and adds, in increasing element order, the squares (in double) of
// elements r*kNormRound + 4j + q (rounds r, quad q) of the tile; block_lane_tree makes the tile's
// partial, stored as the entry's partials[kNormComponents * t] (the layout math::tensor_sum_lane
// reads; the other component is 0). The matrix's own (row-major) order, whatever its orientation.
// A whole tile whose first element is 16-byte aligned loads its quads as float4s (the float4s j,
// j + 256, ... of the tile), any other the same elements one by one, in the same order.
__global__ void __launch_bounds__(kNormLanes)
    norm_tiles_kernel(const float* __restrict__ u_all, const SlabEntries entries, int64_t count,
                      double* __restrict__ partials_all, SkipFlags skip) {
  static_assert(math::kNormQuad == 4, "a lane's quad is one float4");
  if (skip_now(skip)) return;
  __shared__ LaneScratch sh;
  const int j = threadIdx.x;
  const float* __restrict__ u = u_all + entries.start(blockIdx.y);
  const int64_t tiles = (count + math::kNormTile - 1) / math::kNormTile;
  double* __restrict__ partials = partials_all + static_cast<int64_t>(blockIdx.y) * tiles * math::kNormComponents;
  int buf = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, buf ^= 1) {
    const int64_t begin = t * math::kNormTile;
    const int length = static_cast<int>(count - begin < math::kNormTile ? count - begin : math::kNormTile);
    const float* __restrict__ tu = u + begin;
    double acc = 0.0;
    if (length == math::kNormTile && aligned16(tu)) {
      const float4* __restrict__ u4 = reinterpret_cast<const float4*>(tu);
      float4 quads[math::kNormRounds];
#pragma unroll
      for (int r = 0; r < math::kNormRounds; ++r) quads[r] = u4[r * kNormLanes + j];
#pragma unroll
      for (int r = 0; r < math::kNormRounds; ++r) {
        acc = acc + math::square_in_double(quads[r].x);
        acc = acc + math::square_in_double(quads[r].y);
        acc = acc + math::square_in_double(quads[r].z);
        acc = acc + math::square_in_double(quads[r].w);
      }
    } else {
      for (int r = 0; r < math::kNormRounds; ++r) {
        for (int q = 0; q < math::kNormQuad; ++q) {
          const int e = r * math::kNormRound + math::kNormQuad * j + q;  // norm_lane_of(e) == j
          if (e < length) acc = acc + math::square_in_double(tu[e]);
        }
      }
    }
    double zero = 0.0;
    block_lane_tree(sh, buf, acc, zero);
    if (j == 0) {
      partials[math::kNormComponents * t] = acc;
      partials[math::kNormComponents * t + 1] = zero;
    }
  }
}

// One block of kNormLanes threads per entry (blockIdx.x): its tiles' partials combined as
// math::combine_tile_partials does (sum-lane j = math::tensor_sum_lane, then the tree), the norm
// float(sqrt(sum)), and the denominator max(norm, eps) as the reference forms it.
__global__ void __launch_bounds__(kNormLanes)
    norm_denominator_kernel(const double* __restrict__ partials_all, int64_t tiles, const float* __restrict__ eps,
                            float* __restrict__ denoms, SkipFlags skip) {
  if (skip_now(skip)) return;
  __shared__ LaneScratch sh;
  const double* __restrict__ partials = partials_all + static_cast<int64_t>(blockIdx.x) * tiles * math::kNormComponents;
  double sums[math::kNormComponents];
  math::tensor_sum_lane(partials, tiles, static_cast<int>(threadIdx.x), sums);
  block_lane_tree(sh, 0, sums[0], sums[1]);
  if (threadIdx.x == 0) {
    const float norm = static_cast<float>(sqrt(sums[0]));
    const float e = *eps;
    denoms[blockIdx.x] = math::newton_schulz_denominator(norm, e);
  }
}

// One matrix (r x r): gram holds A, gram2 holds P' = O O (O: A with a zero diagonal) on entry and
// B = (b * A) + (c * P) on exit, P_ij = newton_schulz_square_from_split(P'_ij, O_ij, A_ii, A_jj).
// B goes to gram2, not over A: every thread reads the diagonal of A, which no thread writes here.
__global__ void split_polynomial_kernel(const float* __restrict__ gram, float* __restrict__ gram2, size_t r,
                                        const float* __restrict__ b, const float* __restrict__ c, SkipFlags skip) {
  if (skip_now(skip)) return;
  const float bf = *b, cf = *c;
  for (size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < r * r;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t i = e / r, j = e % r;
    const float a_ij = gram[e];
    const float o_ij = i == j ? 0.0f : a_ij;
    const float p = math::newton_schulz_square_from_split(gram2[e], o_ij, gram[i * r + i], gram[j * r + j], i == j);
    gram2[e] = math::newton_schulz_polynomial(bf, cf, a_ij, p);
  }
}

// One matrix: x (r x c) = (a * X) + Q, Q_ij = newton_schulz_apply_from_split(Q'_ij, B_ii, X_ij),
// q holding Q' = O_B X (O_B: B with a zero diagonal) and poly B (r x r, only read).
__global__ void split_update_kernel(float* __restrict__ x, const float* __restrict__ q,
                                    const float* __restrict__ poly, size_t r, size_t c, const float* __restrict__ a,
                                    SkipFlags skip) {
  if (skip_now(skip)) return;
  const float af = *a;
  for (size_t e = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < r * c;
       e += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t i = e / c;
    const float x_ij = x[e];
    const float q_ij = math::newton_schulz_apply_from_split(q[e], poly[i * r + i], x_ij);
    x[e] = math::newton_schulz_combine(af, x_ij, q_ij);
  }
}

// slab_out_kernel's sink of the store: element e of U = X's value.
struct StoreToU {
  float* u;
  __device__ int entry(size_t) const { return 0; }
  __device__ bool quad_aligned(int64_t e) const { return aligned16(u + e); }
  __device__ void put(int, int64_t e, float x) const { u[e] = x; }
  __device__ void put_quads(int, const SlabQuads& q) const {
#pragma unroll
    for (int k = 0; k < kSlabPasses; ++k) {
      if (q.valid[k]) *reinterpret_cast<float4*>(u + q.e[k]) = q.x[k];
    }
  }
};

int64_t norm_tiles(size_t r, size_t c) {
  return static_cast<int64_t>((r * c + math::kNormTile - 1) / math::kNormTile);
}

// Carves consecutive 256-byte aligned pieces out of a scratch (or, with base null, only counts).
struct Carver {
  char* base;
  size_t at = 0;
  template <class T>
  T* take(size_t count) {
    T* p = base != nullptr ? reinterpret_cast<T*>(base + at) : nullptr;
    at += aligned(std::max<size_t>(1, count) * sizeof(T));
    return p;
  }
};

// The start of an iteration for nb entries: each matrix's norm, then X = matrix / max(norm, eps)
// (fp32, or rounded to a bf16 slab).
template <class T>
void launch_normalise(const float* u, SlabEntries entries, size_t nb, size_t r, size_t c, const float* eps,
                      double* partials, float* denoms, T* x, cudaStream_t stream, SkipFlags skip) {
  const int64_t tiles = norm_tiles(r, c);
  const dim3 grid(grid_of(static_cast<size_t>(tiles), 1), static_cast<unsigned>(nb));
  norm_tiles_kernel<<<grid, kNormLanes, 0, stream>>>(u, entries, static_cast<int64_t>(r * c), partials, skip);
  RN_CUDA_CHECK_LAUNCH("newton-schulz norm tiles");
  norm_denominator_kernel<<<static_cast<unsigned>(nb), kNormLanes, 0, stream>>>(partials, tiles, eps, denoms, skip);
  RN_CUDA_CHECK_LAUNCH("newton-schulz norm");
  slab_in_kernel<<<slab_tile_grid(nb, r, c), slab_tile_block(), 0, stream>>>(u, entries, nb, r, c, denoms, x, skip);
  RN_CUDA_CHECK_LAUNCH("newton-schulz normalise");
}

// The scratch of one matrix's r x c iteration (r <= c), in order: the norm's tile partials, the
// denominator, X, A, P' (then B), Q', and the products' scratch, sized for the three products
// (r x c)(c x r), (r x r)(r x r), (r x r)(r x c).
struct Layout {
  double* partials;
  float *denom, *x, *gram, *gram2, *q;
  void* matmul;
  size_t total;
  Layout(size_t r, size_t c, void* scratch) {
    Carver k{static_cast<char*>(scratch)};
    partials = k.take<double>(static_cast<size_t>(norm_tiles(r, c)) * math::kNormComponents);
    denom = k.take<float>(1);
    x = k.take<float>(r * c);
    gram = k.take<float>(r * r);
    gram2 = k.take<float>(r * r);
    q = k.take<float>(r * c);
    const MatmulBounds p1 = matmul_bounds(r, c, r), p2 = matmul_bounds(r, r, r), p3 = matmul_bounds(r, r, c);
    matmul = k.take<char>(matmul_scratch_bytes({r, c, std::max({p1.mk, p2.mk, p3.mk}), std::max({p1.kn, p2.kn, p3.kn})}));
    total = k.at;
  }
};

// The three planes of a digit operand or of the int32 sums, one after another: each product's three
// planes are then one strided batch of 3 * nb (plane d of entry b at d * nb + b): one cuBLASLt
// product, which fills the GPU better than three of nb (measured: bench/RESULTS.md).
template <class T>
struct Planes {
  T* base;
  T* operator[](int d) const { return base + static_cast<size_t>(d) * per_plane; }
  size_t per_plane;
};

// The scratch of a batch of nb entries. Exact: the norm, X, A/B, cuBLASLt's workspace, the
// diagonals of A and of B (r per matrix), the scales and finiteness of the left (up to c vectors
// per matrix) and right (r) operands, room for the three digit planes of each, for the three int32
// sums of the largest product. Fast:
// the norm, cuBLASLt's workspace and bf16 slabs of X, its next value, A and B (2 B per element).
struct BatchLayout {
  double* partials;
  float *denoms, *x, *gram;
  float *diag_a, *diag_b;  // exact mode: diag(A), written by the A combine; diag(B), by the B combine
  uint16_t *xh, *xh_next, *gramh, *gram2h;  // fast mode's bf16 slabs
  int *left_shift, *left_finite, *right_shift, *right_finite;
  int8_t* left_digits;   // hi, lo, hi + lo planes (Planes)
  int8_t* right_digits;
  int32_t* sums;         // HH, LL, SS planes
  void* workspace;
  size_t total;
  BatchLayout(NewtonSchulzMode mode, size_t nb, size_t r, size_t c, void* scratch) {
    Carver k{static_cast<char*>(scratch)};
    const size_t kpr = padded_k(r), kpc = padded_k(c);
    partials = k.take<double>(nb * static_cast<size_t>(norm_tiles(r, c)) * math::kNormComponents);
    denoms = k.take<float>(nb);
    const bool fast = mode == NewtonSchulzMode::kFast;
    x = fast ? nullptr : k.take<float>(nb * r * c);
    gram = fast ? nullptr : k.take<float>(nb * r * r);
    workspace = k.take<char>(kLtWorkspaceBytes);
    if (fast) {
      diag_a = diag_b = nullptr;
      xh = k.take<uint16_t>(nb * r * c);
      xh_next = k.take<uint16_t>(nb * r * c);
      gramh = k.take<uint16_t>(nb * r * r);
      gram2h = k.take<uint16_t>(nb * r * r);
      left_shift = left_finite = right_shift = right_finite = nullptr;
      left_digits = right_digits = nullptr;
      sums = nullptr;
    } else {
      xh = xh_next = gramh = gram2h = nullptr;
      diag_a = k.take<float>(nb * r);
      diag_b = k.take<float>(nb * r);
      left_shift = k.take<int>(nb * c);
      left_finite = k.take<int>(nb * c);
      right_shift = k.take<int>(nb * r);
      right_finite = k.take<int>(nb * r);
      left_digits = k.take<int8_t>(3 * nb * std::max(r * kpc, c * kpr));
      right_digits = k.take<int8_t>(3 * nb * r * kpr);
      sums = k.take<int32_t>(3 * nb * r * c);
    }
    total = k.at;
  }
};

}  // namespace

size_t newton_schulz_scratch_bytes(size_t rows, size_t cols) {
  const size_t r = std::min(rows, cols), c = std::max(rows, cols);
  return Layout(r, c, nullptr).total;
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
  const Layout l(r, c, scratch);
  const SlabEntries one{nullptr, transposed};
  launch_normalise(u, one, 1, r, c, s.eps, l.partials, l.denom, l.x, stream, skip);
  for (int step = 0; step < steps; ++step) {
    // A = X X^T.
    matmul_launch({l.x, c, 1}, {l.x, 1, c}, l.gram, r, c, r, l.matmul, stream, skip, ExactKernel::kAuto);
    // P' = O O, O = A with a zero diagonal (both operands); then B = (b*A) + (c*P) into gram2.
    matmul_launch({l.gram, r, 1}, {l.gram, r, 1}, l.gram2, r, r, r, l.matmul, stream, skip, ExactKernel::kAuto, true,
                  true);
    split_polynomial_kernel<<<grid_of(r * r, kElementThreads), kElementThreads, 0, stream>>>(l.gram, l.gram2, r, s.b,
                                                                                              s.c, skip);
    RN_CUDA_CHECK_LAUNCH("newton-schulz polynomial");
    // Q' = O_B X, O_B = B with a zero diagonal (the left operand); then X = (a*X) + Q.
    matmul_launch({l.gram2, r, 1}, {l.x, c, 1}, l.q, r, r, c, l.matmul, stream, skip, ExactKernel::kAuto, true,
                  false);
    split_update_kernel<<<grid_of(r * c, kElementThreads), kElementThreads, 0, stream>>>(l.x, l.q, l.gram2, r, c, s.a,
                                                                                          skip);
    RN_CUDA_CHECK_LAUNCH("newton-schulz update");
  }
  slab_out_kernel<<<slab_tile_grid(1, r, c), slab_tile_block(), 0, stream>>>(l.x, one, 1, r, c, StoreToU{out}, skip);
  RN_CUDA_CHECK_LAUNCH("newton-schulz store");
}

NewtonSchulzBatch::NewtonSchulzBatch(size_t r, size_t c, std::vector<NewtonSchulzEntry> entries,
                                     NewtonSchulzMode mode, bool use_library)
    : r_(r), c_(c), mode_(mode), entries_(std::move(entries)) {
  if (r > c || r == 0) throw Error(ErrorKind::kInvalidArgument, "newton-schulz batch: needs 0 < r <= c");
  if (c > math::kExactMatmulMaxK) {
    throw Error(ErrorKind::kInvalidArgument, "newton-schulz: a side of " + std::to_string(c) + " is above " +
                                                 std::to_string(math::kExactMatmulMaxK));
  }
  const size_t nb = entries_.size();
  if (nb == 0) return;
  const bool fast = mode == NewtonSchulzMode::kFast;
  std::string why = use_library ? "a class of more than 65535 matrices" : "BackendOptions::cuda_muon_batches is off";
  if (use_library && nb <= 65535) {
    const int batch = static_cast<int>(nb);
    const int64_t ri = static_cast<int64_t>(r), ci = static_cast<int64_t>(c);
    if (fast) {
      // Column-major views: the slab of row-major X's is a batch of X^T (c x r, ld c).
      gram_ = LtMatmul::plan(LtProduct::kBf16, {c, r, ci, ri * ci, true}, {c, r, ci, ri * ci, false},
                             {r, r, ri, ri * ri}, batch, &why);
      if (gram_) {
        square_ = LtMatmul::plan(LtProduct::kBf16, {r, r, ri, ri * ri}, {r, r, ri, ri * ri},
                                 {r, r, ri, ri * ri}, batch, &why);
      }
      if (square_) {
        // (B X + a X)^T = X^T B^T + a X^T.
        apply_ = LtMatmul::plan(LtProduct::kBf16, {c, r, ci, ri * ci}, {r, r, ri, ri * ri, true},
                                {c, r, ci, ri * ci}, batch, &why);
      }
    } else if (padded_k(c) <= kDigitSumMaxK) {
      // Digit arrays hold one vector per row (k contiguous, padded to kp): the products read them
      // as column-major kp x count, A transposed (cuBLASLt's int8 "TN" form); the three digit
      // planes of an operand follow one another, so each product is one batch of 3 * nb (Planes).
      const int planes_batch = 3 * batch;
      const int64_t kpr = static_cast<int64_t>(padded_k(r)), kpc = static_cast<int64_t>(padded_k(c));
      const uint64_t ukpr = static_cast<uint64_t>(kpr), ukpc = static_cast<uint64_t>(kpc);
      gram_ = LtMatmul::plan(LtProduct::kInt8, {ukpc, r, kpc, ri * kpc, true}, {ukpc, r, kpc, ri * kpc, false},
                             {r, r, ri, ri * ri}, planes_batch, &why);  // A = X X^T from X's row digits
      if (gram_) {
        square_ = LtMatmul::plan(LtProduct::kInt8, {ukpr, r, kpr, ri * kpr, true}, {ukpr, r, kpr, ri * kpr, false},
                                 {r, r, ri, ri * ri}, planes_batch, &why);  // P' = O O (O symmetric: its row digits)
      }
      if (square_) {
        // Q'^T (c x r) = X^T O_B^T from X's column digits and O_B's row digits: row-major Q'.
        apply_ = LtMatmul::plan(LtProduct::kInt8, {ukpr, c, kpr, ci * kpr, true}, {ukpr, r, kpr, ri * kpr, false},
                                {c, r, ci, ri * ci}, planes_batch, &why);
      }
    } else {
      why = "k = " + std::to_string(c) + " is above the int32 bound of the three-product form";
    }
  }
  if (!apply_) {
    gram_.reset();
    square_.reset();
    if (fast) throw Error(ErrorKind::kBackend, "cuda backend: muon_mode=fast needs cuBLASLt: " + why);
    scratch_bytes_ = newton_schulz_scratch_bytes(r, c);  // one entry after another, own kernels
    return;
  }
  scratch_bytes_ = BatchLayout(mode, nb, r, c, nullptr).total;
  RN_CUDA_CHECK(cudaMalloc(&device_entries_, nb * sizeof(NewtonSchulzEntry)));
  RN_CUDA_CHECK(cudaMemcpy(device_entries_, entries_.data(), nb * sizeof(NewtonSchulzEntry), cudaMemcpyHostToDevice));
  const float constants[2] = {1.0f, 0.0f};
  RN_CUDA_CHECK(cudaMalloc(&device_constants_, sizeof(constants)));
  RN_CUDA_CHECK(cudaMemcpy(device_constants_, constants, sizeof(constants), cudaMemcpyHostToDevice));
}

NewtonSchulzBatch::~NewtonSchulzBatch() {
  if (device_entries_ != nullptr) (void)cudaFree(device_entries_);
  if (device_constants_ != nullptr) (void)cudaFree(device_constants_);
}

void NewtonSchulzBatch::mark(NewtonSchulzPhases* phases, const char* phase) const {
  if (phases == nullptr) return;
  phases->mark("ns " + std::to_string(r_) + "x" + std::to_string(c_) + " (" + std::to_string(entries_.size()) +
               "): " + phase);
}

void NewtonSchulzBatch::enqueue(float* u, const NewtonSchulzScalars& s, int steps, void* scratch, CUstream_st* stream,
                                SkipFlags skip, NewtonSchulzPhases* phases) const {
  if (steps < 0) throw Error(ErrorKind::kInvalidArgument, "newton-schulz: steps = " + std::to_string(steps));
  if (entries_.empty()) return;
  if (!batched()) {
    mark(phases, "per-matrix iteration");
    for (const NewtonSchulzEntry& e : entries_) {
      float* m = u + e.start;
      newton_schulz_device(m, e.transposed ? c_ : r_, e.transposed ? r_ : c_, m, s, steps, scratch, stream, skip);
    }
    return;
  }
  const NewtonSchulzSlab slab = enqueue_to_slab(u, s, steps, scratch, stream, skip, phases);
  mark(phases, "store");
  launch_slab_out(slab, StoreToU{u}, stream, skip);
}

NewtonSchulzSlab NewtonSchulzBatch::enqueue_to_slab(const float* u, const NewtonSchulzScalars& s, int steps,
                                                    void* scratch, CUstream_st* stream, SkipFlags skip,
                                                    NewtonSchulzPhases* phases) const {
  if (steps < 0) throw Error(ErrorKind::kInvalidArgument, "newton-schulz: steps = " + std::to_string(steps));
  if (!batched()) throw Error(ErrorKind::kBackend, "newton-schulz: a class that is not batched has no slab");
  const bool fast = mode_ == NewtonSchulzMode::kFast;
  NewtonSchulzSlab slab{nullptr, fast, device_entries_, entries_.size(), r_, c_};
  if (entries_.empty()) return slab;
  slab.x = fast ? enqueue_fast(u, s, steps, scratch, stream, skip, phases)
                : enqueue_exact(u, s, steps, scratch, stream, skip, phases);
  return slab;
}

const void* NewtonSchulzBatch::enqueue_exact(const float* u, const NewtonSchulzScalars& s, int steps, void* scratch,
                                             CUstream_st* stream, SkipFlags skip, NewtonSchulzPhases* phases) const {
  const size_t nb = entries_.size(), r = r_, c = c_;
  const size_t kpr = padded_k(r), kpc = padded_k(c);
  const BatchLayout l(mode_, nb, r, c, scratch);
  const SlabEntries entries{device_entries_, false};
  mark(phases, "normalise");
  launch_normalise(u, entries, nb, r, c, s.eps, l.partials, l.denoms, l.x, stream, skip);
  // The digit planes of a vector set of `count` vectors per entry (padded length kp) in `base`.
  auto planes = [&](int8_t* base, size_t count, size_t kp) { return Planes<int8_t>{base, nb * count * kp}; };
  // An operand's vectors to fixed point: their scales (shift, finite), then the hi, lo and hi + lo
  // int8 digit planes.
  auto to_digits = [&](const VectorSet& set, size_t kp, int* shift, int* finite, Planes<int8_t> digits) {
    launch_digits(set, kp, shift, finite, digits[0], digits[1], digits[2], stream, skip);
  };
  // The three int8 products of one exact product, HH, LL and SS, as one batch of 3 * nb (Planes).
  auto products = [&](const LtMatmul& p, Planes<int8_t> a, Planes<int8_t> b) {
    p.enqueue(a.base, b.base, l.sums, stream, l.workspace);
  };
  // The last step's combine, X = (a*X) + Q, which forms no next operand: element-wise.
  auto combine_update = [&](size_t ni, size_t nj, const int* si, const int* fi, const int* sj, const int* fj,
                            float* out, const float* a, const float* diag_b) {
    const Planes<int32_t> sums{l.sums, nb * ni * nj};
    // By quads where a quad lies in one row and every array is 16-byte aligned (the scratch's
    // pieces are 256-byte aligned; out is one of them).
    const bool quads = nj % 4 == 0 && aligned16(sums[0]) && aligned16(sums[1]) && aligned16(sums[2]) &&
                       aligned16(out);
    const size_t width = quads ? 4 : 1, elements = nb * ni * nj;
    const unsigned grid = grid_of(elements / width, kElementThreads);
    // 32-bit indices when the last element plus one grid stride (in elements) stays below 2^32.
    const bool narrow = elements + width * grid * kElementThreads <= size_t{UINT32_MAX};
    const auto launch = [&](auto kernel, auto index) {
      using Index = decltype(index);
      kernel<<<grid, kElementThreads, 0, stream>>>(sums[0], sums[1], sums[2], static_cast<Index>(nb),
                                                   static_cast<Index>(ni), static_cast<Index>(nj), si, fi, sj, fj,
                                                   out, a, diag_b, skip);
    };
    if (quads && narrow) {
      launch(update_kernel<uint32_t, 4>, uint32_t{});
    } else if (quads) {
      launch(update_kernel<size_t, 4>, size_t{});
    } else if (narrow) {
      launch(update_kernel<uint32_t, 1>, uint32_t{});
    } else {
      launch(update_kernel<size_t, 1>, size_t{});
    }
    RN_CUDA_CHECK_LAUNCH("newton-schulz combine");
  };
  // A combine that also converts its result's rows into the next product's operand (their scales
  // to row_shift / row_finite, their digits to `digits`; zero_diagonal: the split's O or O_B).
  auto combine_to_rows = [&](auto epilogue, size_t ni, size_t nj, size_t kp, const int* si, const int* fi,
                             const int* sj, const int* fj, float* out, const float* k1, const float* k2,
                             const float* diag_in, float* diag_out, bool zero_diagonal, int* row_shift,
                             int* row_finite, Planes<int8_t> digits) {
    constexpr Epilogue kE = decltype(epilogue)::value;
    const Planes<int32_t> sums{l.sums, nb * ni * nj};
    combine_and_row_digits_kernel<kE><<<grid_of(nb * ni, 1), kFusedThreads, 0, stream>>>(
        sums[0], sums[1], sums[2], nb, ni, nj, kp, si, fi, sj, fj, out, k1, k2, diag_in, diag_out, zero_diagonal,
        row_shift, row_finite, digits[0], digits[1], digits[2], skip);
    RN_CUDA_CHECK_LAUNCH("newton-schulz combine with the next operand's rows");
  };
  const VectorSet x_rows{l.x, nb, r, c, c, 1, r * c, false}, x_cols{l.x, nb, c, r, 1, c, r * c, false};
  const Planes<int8_t> x_row_digits = planes(l.left_digits, r, kpc), off_row_digits = planes(l.left_digits, r, kpr),
                       x_col_digits = planes(l.left_digits, c, kpr), off_b_row_digits = planes(l.right_digits, r, kpr);
  // Where each operand's scales live: X's rows and O_B's rows in right_shift / right_finite, O's
  // rows and X's columns in left_shift / left_finite. Each combine reads its operands' scales and
  // writes the next operand's elsewhere, since every block reads the column scales sj.
  for (int step = 0; step < steps; ++step) {
    // A = X X^T: both operands are X's rows. The combine keeps diag(A) in diag_a and forms the
    // split's O (A's rows, the diagonal taken as 0) for the next product.
    mark(phases, "A: scales+digits");
    if (step == 0) to_digits(x_rows, kpc, l.right_shift, l.right_finite, x_row_digits);  // later: Q's combine
    mark(phases, "A: int8 products");
    products(*gram_, x_row_digits, x_row_digits);
    mark(phases, "A: combine");
    combine_to_rows(std::integral_constant<Epilogue, Epilogue::kStore>{}, r, r, kpr, l.right_shift, l.right_finite,
                    l.right_shift, l.right_finite, l.gram, nullptr, nullptr, nullptr, l.diag_a, true, l.left_shift,
                    l.left_finite, off_row_digits);
    // B = (b*A) + (c*P), P from P' = O O: A is exactly symmetric (S_ij = S_ji, the same two
    // scales), so is O, and O's columns are its rows. The combine reads diag(A) from diag_a (B is
    // written over A), keeps diag(B) in diag_b and forms O_B (B's rows, the diagonal taken as 0).
    mark(phases, "B: int8 products");
    products(*square_, off_row_digits, off_row_digits);
    mark(phases, "B: combine");
    combine_to_rows(std::integral_constant<Epilogue, Epilogue::kPolynomial>{}, r, r, kpr, l.left_shift,
                    l.left_finite, l.left_shift, l.left_finite, l.gram, s.b, s.c, l.diag_a, l.diag_b, true,
                    l.right_shift, l.right_finite, off_b_row_digits);
    // X = (a*X) + Q, Q from Q' = O_B X: O_B's rows (left), X's columns (right); row i of Q takes
    // B_ii from diag_b.
    mark(phases, "Q: scales+digits");
    to_digits(x_cols, kpr, l.left_shift, l.left_finite, x_col_digits);
    mark(phases, "Q: int8 products");
    products(*apply_, x_col_digits, off_b_row_digits);
    mark(phases, "Q: combine");
    if (step + 1 == steps) {
      combine_update(r, c, l.right_shift, l.right_finite, l.left_shift, l.left_finite, l.x, s.a, l.diag_b);
    } else {  // with the next step's A operand: X's row scales (over O_B's, each row its own) and digits
      combine_to_rows(std::integral_constant<Epilogue, Epilogue::kUpdate>{}, r, c, kpc, l.right_shift,
                      l.right_finite, l.left_shift, l.left_finite, l.x, s.a, nullptr, l.diag_b, nullptr, false,
                      l.right_shift, l.right_finite, x_row_digits);
    }
  }
  return l.x;
}

const void* NewtonSchulzBatch::enqueue_fast(const float* u, const NewtonSchulzScalars& s, int steps, void* scratch,
                                            CUstream_st* stream, SkipFlags skip, NewtonSchulzPhases* phases) const {
  const size_t nb = entries_.size(), r = r_, c = c_;
  const BatchLayout l(mode_, nb, r, c, scratch);
  const SlabEntries entries{device_entries_, false};
  const float* one = device_constants_;
  const float* zero = device_constants_ + 1;
  mark(phases, "normalise");
  launch_normalise(u, entries, nb, r, c, s.eps, l.partials, l.denoms, l.xh, stream, skip);
  uint16_t* x = l.xh;
  uint16_t* next = l.xh_next;
  for (int step = 0; step < steps; ++step) {
    mark(phases, "A = X X^T");
    gram_->enqueue(x, x, l.gramh, stream, l.workspace, one, zero);
    mark(phases, "B = c A A + b A");
    square_->enqueue(l.gramh, l.gramh, l.gram2h, stream, l.workspace, s.c, s.b, l.gramh);
    mark(phases, "X = B X + a X");
    apply_->enqueue(x, l.gram2h, next, stream, l.workspace, one, s.a, x);
    std::swap(x, next);
  }
  return x;
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

bool newton_schulz_batch_on_device(const float* u, const std::vector<size_t>& rows, const std::vector<size_t>& cols,
                                   float* out, NewtonSchulzMode mode, const math::NewtonSchulzCoefficients& coeff,
                                   int steps, float eps) {
  if (rows.size() != cols.size() || rows.empty()) {
    throw Error(ErrorKind::kInvalidArgument, "newton-schulz batch: rows and cols must name the same matrices");
  }
  const size_t r = std::min(rows[0], cols[0]), c = std::max(rows[0], cols[0]);
  std::vector<NewtonSchulzEntry> entries;
  size_t count = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (std::min(rows[i], cols[i]) != r || std::max(rows[i], cols[i]) != c) {
      throw Error(ErrorKind::kInvalidArgument, "newton-schulz batch: the matrices are not of one shape class");
    }
    entries.push_back({static_cast<int64_t>(count), rows[i] > cols[i] ? 1 : 0});
    count += rows[i] * cols[i];
  }
  const NewtonSchulzBatch batch(r, c, entries, mode);
  float *du = nullptr, *scalars = nullptr;
  void* scratch = nullptr;
  RN_CUDA_CHECK(cudaMalloc(&du, (count + 1) * sizeof(float)));
  RN_CUDA_CHECK(cudaMalloc(&scalars, 4 * sizeof(float)));
  RN_CUDA_CHECK(cudaMalloc(&scratch, batch.scratch_bytes() + 256));
  const float host_scalars[4] = {coeff.a, coeff.b, coeff.c, eps};
  RN_CUDA_CHECK(cudaMemcpy(du, u, count * sizeof(float), cudaMemcpyHostToDevice));
  RN_CUDA_CHECK(cudaMemcpy(scalars, host_scalars, sizeof(host_scalars), cudaMemcpyHostToDevice));
  batch.enqueue(du, {scalars, scalars + 1, scalars + 2, scalars + 3}, steps, scratch, nullptr);
  RN_CUDA_CHECK(cudaDeviceSynchronize());
  RN_CUDA_CHECK(cudaMemcpy(out, du, count * sizeof(float), cudaMemcpyDeviceToHost));
  RN_CUDA_CHECK(cudaFree(du));
  RN_CUDA_CHECK(cudaFree(scalars));
  RN_CUDA_CHECK(cudaFree(scratch));
  return batch.batched();
}

}  // namespace cuda
}  // namespace renaissance
