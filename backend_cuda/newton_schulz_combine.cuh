// The combining kernels of NewtonSchulzBatch's exact mode (newton_schulz.cu, the only includer):
// each element of an exact product formed from its three int32 digit sums (the three-product form
// of exact_matmul_internal.cuh), rounded once, and the Newton–Schulz iteration's element-wise step
// applied to it (Epilogue); and the combine that also converts its result's rows into the next
// product's int8 operand (scales and digits as exact_matmul.cu's row kernel forms them).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend_cuda/exact_matmul_internal.cuh"
#include "renaissance/math/exact_matmul.h"
#include "renaissance/math/newton_schulz.h"

namespace renaissance {
namespace cuda {
namespace {

// What a combining kernel does with the rounded product v of element e = (b, i, j); the diagonals
// are nb vectors of r floats (entry b's at b * r), apart from the slabs, so that no thread reads an
// element that another thread of the same kernel writes.
enum class Epilogue {
  kStore,       // out = v, diag_out[i] = v when i == j: A = X X^T and its diagonal (r x r)
  kPolynomial,  // v = P'_ij of O O, diag_in = A's diagonal: out = (k1 * out) + (k2 * P) with
                // P = newton_schulz_square_from_split(v, O_ij, A_ii, A_jj), O_ij = (i == j ? 0 : A_ij),
                // B = (b*A) + (c*P) over A in place (r x r), and diag_out[i] = B_ii when i == j
  kUpdate,      // v = Q'_ij of O_B X, diag_in = B's diagonal: out = (k1 * out) + Q with
                // Q = newton_schulz_apply_from_split(v, B_ii, X_ij), X = (a*X) + Q over X in place (r x c)
};

// One element of an exact product of a batch from its three int32 digit sums (the three-product
// form of exact_matmul_internal.cuh): row i, column j of its matrix, gi = b * ni + i and
// gj = b * nj + j; its row scale and finiteness at si/fi[gi], its column's at sj/fj[gj]; the sum S
// in int64, one rounding (math::from_fixed_point), a NaN for a non-finite row or column, then the
// epilogue with its coefficients and the diagonals (diag_in read, diag_out written, at gi and gj;
// unused ones null) over `old`, the element's value in `out` before (unused by kStore). Returns
// the element's new value in `out`.
template <Epilogue kEpilogue, class Index>
__device__ __forceinline__ float combine_element(int32_t hh, int32_t ss, int32_t ll, float old, Index i, Index j,
                                                 Index gi, Index gj, const int* __restrict__ si,
                                                 const int* __restrict__ fi, const int* __restrict__ sj,
                                                 const int* __restrict__ fj, float c1, float c2,
                                                 const float* __restrict__ diag_in, float* __restrict__ diag_out) {
  const int64_t sum = math::from_digit_sums(hh, ss, ll);
  const float v = (fi[gi] && fj[gj]) ? math::from_fixed_point(sum, si[gi], sj[gj]) : __int_as_float(0x7fc00000);
  if (kEpilogue == Epilogue::kStore) {
    if (i == j) diag_out[gi] = v;
    return v;
  } else if (kEpilogue == Epilogue::kPolynomial) {
    const float a_ij = old;
    const float o_ij = i == j ? 0.0f : a_ij;
    const float p = math::newton_schulz_square_from_split(v, o_ij, diag_in[gi], diag_in[gj], i == j);
    const float b_ij = math::newton_schulz_polynomial(c1, c2, a_ij, p);
    if (i == j) diag_out[gi] = b_ij;
    return b_ij;
  } else {
    const float x_ij = old;
    const float q = math::newton_schulz_apply_from_split(v, diag_in[gi], x_ij);
    return math::newton_schulz_combine(c1, x_ij, q);
  }
}

// The last step's combine, X = (a*X) + Q (combine_element<kUpdate>), over the nb matrices ni x nj
// of a batch, element e = (b, i, j) with its sums at e (the callers lay the products out so), into
// out[e]. kWidth elements per thread and pass: 4 (nj a multiple of 4, so that a quad lies in one
// row, and every array 16-byte aligned: one 16-byte load per array and one store) or 1. Index: the
// type of e and of its split into (b, i, j); uint32_t where every e and every e plus the grid's
// stride fit (the launcher's choice: 32-bit divisions are a fraction of 64-bit ones), else size_t.
// The same elements and operations whatever the width and index type.
template <class Index, int kWidth>
__global__ void update_kernel(const int32_t* __restrict__ hh, const int32_t* __restrict__ ll,
                              const int32_t* __restrict__ ss, Index nb, Index ni, Index nj,
                              const int* __restrict__ si, const int* __restrict__ fi, const int* __restrict__ sj,
                              const int* __restrict__ fj, float* __restrict__ out, const float* __restrict__ a,
                              const float* __restrict__ diag_b, SkipFlags skip) {
  static_assert(kWidth == 1 || kWidth == 4, "elements one by one or by quads");
  constexpr Epilogue kE = Epilogue::kUpdate;
  if (skip_now(skip)) return;
  const float c1 = *a;
  const Index per = ni * nj, groups = nb * per / kWidth;
  for (Index t = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; t < groups;
       t += static_cast<Index>(gridDim.x) * blockDim.x) {
    const Index e = t * kWidth;
    const Index b = e / per, f = e % per, i = f / nj, j = f % nj;
    const Index gi = b * ni + i, gj = b * nj + j;
    if (kWidth == 1) {
      out[e] = combine_element<kE>(hh[e], ss[e], ll[e], out[e], i, j, gi, gj, si, fi, sj, fj, c1, 0.0f, diag_b,
                                   nullptr);
    } else {
      const int4 h = *reinterpret_cast<const int4*>(hh + e);
      const int4 s = *reinterpret_cast<const int4*>(ss + e);
      const int4 l = *reinterpret_cast<const int4*>(ll + e);
      const float4 o = *reinterpret_cast<const float4*>(out + e);
      float4 r;
      r.x = combine_element<kE>(h.x, s.x, l.x, o.x, i, j, gi, gj, si, fi, sj, fj, c1, 0.0f, diag_b, nullptr);
      r.y = combine_element<kE>(h.y, s.y, l.y, o.y, i, j + 1, gi, gj + 1, si, fi, sj, fj, c1, 0.0f, diag_b, nullptr);
      r.z = combine_element<kE>(h.z, s.z, l.z, o.z, i, j + 2, gi, gj + 2, si, fi, sj, fj, c1, 0.0f, diag_b, nullptr);
      r.w = combine_element<kE>(h.w, s.w, l.w, o.w, i, j + 3, gi, gj + 3, si, fi, sj, fj, c1, 0.0f, diag_b, nullptr);
      *reinterpret_cast<float4*>(out + e) = r;
    }
  }
}

// A combine fused with the conversion of its result's rows into the next product's operand: one
// block per row g = b * ni + i of the result (grid-stride over the nb * ni rows). First each
// element, combine_element<kEpilogue>, written to out, with the row's largest finite magnitude and
// non-finite flag (a max and an "or": exact in any order, so row_digits_kernel's shift and flag);
// with zero_diagonal the element j = i is taken as +0.0f there and in the digits (the split's O and
// O_B: VectorSet::zero_diagonal), though out keeps its value.
// Then, after the block's barrier, the row read back (from cache) and its digits stored as
// row_digits_kernel stores them (store_digit_quad at [g * kp + p]), zeros past nj and for a
// non-finite row. One element per thread and pass (quads, as update_kernel takes them, measured
// slower here: the block's work is one row). The row's shift and flag go to row_shift /
// row_finite at g, which may be si / fi: each block reads only its own row's entry there, before
// the barrier, and writes it after; they must not be sj / fj, which every block reads.
constexpr int kFusedThreads = 256;
template <Epilogue kEpilogue>
__global__ void __launch_bounds__(kFusedThreads)
    combine_and_row_digits_kernel(const int32_t* __restrict__ hh, const int32_t* __restrict__ ll,
                                  const int32_t* __restrict__ ss, size_t nb, size_t ni, size_t nj, size_t kp,
                                  const int* si, const int* fi, const int* __restrict__ sj,
                                  const int* __restrict__ fj, float* out, const float* __restrict__ k1,
                                  const float* __restrict__ k2, const float* __restrict__ diag_in,
                                  float* __restrict__ diag_out, bool zero_diagonal, int* row_shift, int* row_finite,
                                  int8_t* dh, int8_t* dl, int8_t* ds, SkipFlags skip) {
  if (skip_now(skip)) return;
  constexpr int kWarps = kFusedThreads / 32;
  __shared__ float warp_max[kWarps];
  __shared__ int warp_bad[kWarps];
  const float c1 = kEpilogue == Epilogue::kStore ? 0.0f : *k1;
  const float c2 = kEpilogue == Epilogue::kPolynomial ? *k2 : 0.0f;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (size_t g = blockIdx.x; g < nb * ni; g += gridDim.x) {
    const size_t b = g / ni, i = g % ni;
    float* row = out + g * nj;
    const size_t e0 = g * nj;
    VectorScale scale;
    for (size_t j = threadIdx.x; j < nj; j += kFusedThreads) {
      const float v = combine_element<kEpilogue, size_t>(hh[e0 + j], ss[e0 + j], ll[e0 + j],
                                                         kEpilogue == Epilogue::kStore ? 0.0f : row[j], i, j, g,
                                                         b * nj + j, si, fi, sj, fj, c1, c2, diag_in, diag_out);
      row[j] = v;
      scale.take(zero_diagonal && j == i ? 0.0f : fabsf(v));
    }
    scale.merge_warp();
    if (lane == 0) {
      warp_max[warp] = scale.max_magnitude;
      warp_bad[warp] = scale.nonfinite;
    }
    __syncthreads();  // the row's elements and the warps' partials are visible to the block
    for (int w = 0; w < kWarps; ++w) scale.merge(warp_max[w], warp_bad[w]);
    const bool finite = scale.finite();
    const int shift = scale.shift();
    if (threadIdx.x == 0) {
      row_shift[g] = shift;
      row_finite[g] = finite;
    }
    for (size_t p0 = 4 * static_cast<size_t>(threadIdx.x); p0 < kp; p0 += 4 * kFusedThreads) {
      store_digit_quad(dh, dl, ds, g * kp + p0, [&](int q) {
        const size_t p = p0 + q;
        return position_digits(p, nj, finite, zero_diagonal, i, shift, [&] { return row[p]; });
      });
    }
    __syncthreads();  // warp_max / warp_bad are written again for the next row
  }
}

}  // namespace
}  // namespace cuda
}  // namespace renaissance
