// What exact_matmul.cu shares with the other exact-mode device code (newton_schulz.cu): the
// product's launcher over a scratch sized by explicit bounds, on a cudaStream_t, and the operand
// preparation (scales and int8 digits) over sets of vectors of several matrices at once, which the
// batched Newton–Schulz feeds to cuBLASLt's int8 products.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backend_cuda/exact_matmul.h"
#include "renaissance/math/exact_matmul.h"

namespace renaissance {
namespace cuda {

// k of the digit arrays is padded with zeros to a multiple of this (one mma k step; cuBLASLt's
// int8 products want leading dimensions that are multiples of 4).
constexpr size_t kPadK = 32;
size_t padded_k(size_t k);

// Blocks for `items` work items, per_block per block, at least 1 and at most 2^20 (the exact-mode
// kernels loop grid-stride, so any grid is correct).
inline unsigned grid_of(size_t items, unsigned per_block) {
  const size_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(blocks, size_t{1} << 20)));
}

// A scratch piece's size rounded up to 256 bytes, so that every piece starts 256-byte aligned.
inline size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

// nb matrices' vectors (rows of a left operand or columns of a right one), `count` per matrix, each
// of `len` elements: vector v of matrix m has element p at base[m * mstride + v * outer + p * inner].
// zero_diagonal (square matrices, count == len): element v of vector v is taken as +0.0f, in the
// vector's scale (its largest magnitude and its finiteness) and in its digits, whatever the matrix
// holds there; the operand O of math::newton_schulz_reference's diagonal split without a copy.
struct VectorSet {
  const float* base;
  size_t nb;
  size_t count;
  size_t len;
  size_t outer;
  size_t inner;
  size_t mstride;
  bool zero_diagonal;
};

// Per vector g = m * count + v: its shift and finiteness at g (exact_matmul.h's scale), and its
// fixed-point values' digits at [g * kp, g * kp + kp) (zero padded past len): hi and lo
// (math::fixed_point_digits), and with `sum` non-null hi + lo. kp is a multiple of kPadK and hi,
// lo, sum are 4-byte aligned (the digits are stored four at a time).
// The three-product form (math::from_digit_sums) then gets every digit cross term from three int8
// products.
void launch_digits(const VectorSet& set, size_t kp, int* shift, int* finite, int8_t* hi, int8_t* lo, int8_t* sum,
                   cudaStream_t stream, SkipFlags skip);

// A vector's scale as its elements come in, in any order and split over any threads: its largest
// finite magnitude and whether any element is non-finite (a max and an "or": exact in any order,
// so every split gives the same), hence its shift (exact_matmul.h's scale; 0 for a non-finite
// vector, whose results are NaN whatever its digits hold).
struct VectorScale {
  float max_magnitude = 0.0f;
  int nonfinite = 0;
  // On locals, stored back: so the compiler makes selects. The same test on the members compiled to
  // branches, which cost gpt2_small's exact step 1.0 ms of conversions (bench/JOURNAL.md).
  __device__ __forceinline__ void take(float magnitude) {
    float mx = max_magnitude;
    int bad = nonfinite;
    if (!isfinite(magnitude)) bad = 1;
    else if (magnitude > mx) mx = magnitude;
    max_magnitude = mx;
    nonfinite = bad;
  }
  __device__ __forceinline__ void merge(float other_max, int other_nonfinite) {
    max_magnitude = fmaxf(max_magnitude, other_max);
    nonfinite |= other_nonfinite;
  }
  // The whole warp's scale in every lane (every lane must take part); each shuffle next to its use.
  __device__ __forceinline__ void merge_warp() {
    for (int o = 16; o > 0; o /= 2) {
      max_magnitude = fmaxf(max_magnitude, __shfl_xor_sync(0xffffffffu, max_magnitude, o));
      nonfinite |= __shfl_xor_sync(0xffffffffu, nonfinite, o);
    }
  }
  __device__ __forceinline__ bool finite() const { return nonfinite == 0; }
  __device__ __forceinline__ int shift() const { return finite() ? math::fixed_point_shift(max_magnitude) : 0; }
};

// The digits of position p of a vector of `len` elements (math::fixed_point_digits of its fixed
// point q; hi + lo is the middle digit of the three-product form, math::from_digit_sums): q is 0
// past len (the padding), for a non-finite vector (as the reference: its results are NaN whatever
// q holds) and, with zero_diagonal, at p = diagonal; else element() at `shift`, read only then.
template <class Element>
__device__ __forceinline__ math::FixedPointDigits position_digits(size_t p, size_t len, bool vector_finite,
                                                                  bool zero_diagonal, size_t diagonal, int shift,
                                                                  Element element) {
  const bool zero = p >= len || !vector_finite || (zero_diagonal && p == diagonal);
  return math::fixed_point_digits(zero ? 0 : math::to_fixed_point(element(), shift));
}

// Stores the digits of four adjacent positions p0 .. p0 + 3 of a vector, digit(q) being position
// p0 + q's, as one 32-bit word per plane at `at` (the lower position in the lower byte, as in
// memory; `sum` null: not stored). `at` is 4-byte aligned where the planes are (kp of kPadK).
template <class Digit>
__device__ __forceinline__ void store_digit_quad(int8_t* hi, int8_t* lo, int8_t* sum, size_t at, Digit digit) {
  uint32_t word_hi = 0, word_lo = 0, word_sum = 0;
  for (int q = 0; q < 4; ++q) {
    const math::FixedPointDigits d = digit(q);
    word_hi |= static_cast<uint32_t>(static_cast<uint8_t>(d.hi)) << (8 * q);
    word_lo |= static_cast<uint32_t>(static_cast<uint8_t>(d.lo)) << (8 * q);
    word_sum |= static_cast<uint32_t>(static_cast<uint8_t>(d.sum)) << (8 * q);
  }
  *reinterpret_cast<uint32_t*>(hi + at) = word_hi;
  *reinterpret_cast<uint32_t*>(lo + at) = word_lo;
  if (sum != nullptr) *reinterpret_cast<uint32_t*>(sum + at) = word_sum;
}

// The longest padded k whose three int32 digit sums cannot overflow (the math's bound).
using math::kDigitSumMaxK;

// Upper bounds of the products one scratch serves: rows of A (m), columns of B (n), and the
// digit counts of A (m * padded k) and B (n * padded k); matmul_bounds gives one product's.
struct MatmulBounds {
  size_t m;
  size_t n;
  size_t mk;
  size_t kn;
};
MatmulBounds matmul_bounds(size_t m, size_t k, size_t n);

size_t matmul_scratch_bytes(const MatmulBounds& bounds);

// exact_matmul_launch's body (a, b, c, dims, scratch of matmul_scratch_bytes of bounds that hold
// this call's, stream, skip flags) with a choice of product kernel. a_zero_diagonal (m == k) and
// b_zero_diagonal (k == n): the product of that operand with its diagonal taken as +0.0f
// (VectorSet::zero_diagonal), the matrix itself untouched.
void matmul_launch(DeviceMatrix a, DeviceMatrix b, float* c, size_t m, size_t k, size_t n, void* scratch,
                   cudaStream_t stream, SkipFlags skip, ExactKernel kernel, bool a_zero_diagonal = false,
                   bool b_zero_diagonal = false);

__device__ __forceinline__ bool skip_now(SkipFlags skip) {
  return (skip.first != nullptr && *skip.first != 0) || (skip.second != nullptr && *skip.second != 0);
}

}  // namespace cuda
}  // namespace renaissance
