// The exact matrix product of Muon's Newton–Schulz orthogonalisation (docs/math.md, "Muon: the
// exact matrix product"), written once for every backend.
//
// Block fixed point: each row i of the left operand A (m x k) and each column j of the right
// operand B (k x n) gets a power-of-two scale from its largest magnitude, so that every element
// becomes an integer q with |q| <= 2^13 (rounded half to even). The dot products of those
// integers are exact in int64, so any summation order, blocking over k or cut of q into int8
// digits (q = 128*hi + lo, hi in [-64, 64], lo in [-64, 63]) gives the same integers; each is then
// rounded once to fp32 together with the two scales. CPU and CUDA therefore compute the same
// bits whatever their kernels, and a numpy int64 matmul is an independent oracle.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "renaissance/math/host_device.h"

namespace renaissance {
namespace math {

// |q| <= 2^kFixedPointBits: two int8 digits per element, a digit product <= 2^12 and an element
// product <= 2^26.
constexpr int kFixedPointBits = 13;
// The longest k whose exact sums the rounding step takes exactly: |sum| <= k * 2^26 < 2^53.
constexpr uint64_t kExactMatmulMaxK = uint64_t{1} << 26;

// The scale exponent of a row (or column) whose largest magnitude is `amax`: with
// 2^e <= amax < 2^(e+1), shift = 12 - e, so amax * 2^shift lies in [2^12, 2^13) and rounds to at
// most 2^13. A zero row gets 0 (every q is 0). amax must be finite (see exact_matmul_reference).
RN_HD int fixed_point_shift(float amax) {
  if (amax == 0.0f) return 0;
  int exp2 = 0;
  (void)frexp(static_cast<double>(amax), &exp2);  // amax = f * 2^exp2, f in [0.5, 1): e = exp2 - 1
  return (kFixedPointBits - 1) - (exp2 - 1);
}

// x * 2^shift rounded to the nearest integer, ties to even, with no dependence on the floating
// point rounding mode. x * 2^shift is exact in double (a float times a power of two in range), and
// for |y| >= 1/2 so is y + 1/2 (|y| < 2^14 and y has at most 24 significant bits). r is integral
// and |r| <= 2^14, so its parity is that of its int64 value (two's complement: -3 & 1 == 1).
RN_HD int32_t to_fixed_point(float x, int shift) {
  const double y = ldexp(static_cast<double>(x), shift);
  if (fabs(y) < 0.5) return 0;
  double r = floor(y + 0.5);
  if (r - y == 0.5 && (static_cast<int64_t>(r) & 1) != 0) r -= 1.0;  // a tie went up to an odd integer
  return static_cast<int32_t>(r);
}

// The int8 digits of a fixed-point integer q (|q| <= 2^kFixedPointBits) for the integer units that
// multiply int8 (CUDA's tensor cores, the CPU's AMX tiles): q = 128 hi + lo with
// lo = ((q + 64) mod 128) - 64 in [-64, 63], hi = (q - lo) / 128 in [-64, 64] (exact), and
// sum = hi + lo in [-127, 127] (q = 8127 gives 126, q = -8128 gives -127). Vector code that
// restates this split names this function.
struct FixedPointDigits {
  int8_t hi, lo, sum;
};
RN_HD FixedPointDigits fixed_point_digits(int32_t q) {
  const int32_t l = ((q + 64) & 127) - 64;
  const int32_t h = (q - l) / 128;
  return {static_cast<int8_t>(h), static_cast<int8_t>(l), static_cast<int8_t>(h + l)};
}

// The integer dot product Σ q·q' over k from its digit sums HH = Σ hi·hi', X = Σ hi·lo' + lo·hi'
// and LL = Σ lo·lo': 2^14 HH + 2^7 X + LL. Exact in int64.
RN_HD int64_t from_digit_cross_sums(int64_t hh, int64_t cross, int64_t ll) { return hh * 16384 + cross * 128 + ll; }
// The three-product form: with SS = Σ sum·sum' the cross terms are SS - HH - LL (Karatsuba's), so
// three int8 products give the dot product.
RN_HD int64_t from_digit_sums(int64_t hh, int64_t ss, int64_t ll) { return from_digit_cross_sums(hh, ss - hh - ll, ll); }
// The longest k whose three digit sums fit int32: |SS| <= k * 127^2 < 2^31 for k <= 2^16.
constexpr size_t kDigitSumMaxK = size_t{1} << 16;

// The exact integer sum of products, scaled back by 2^-(shift_a + shift_b), rounded once to fp32:
// the sum is exact in double (|sum| < 2^53 for k <= kExactMatmulMaxK), the power-of-two scaling
// too, so the one rounding is the conversion to float (nearest, ties to even).
RN_HD float from_fixed_point(int64_t sum, int shift_a, int shift_b) {
  return static_cast<float>(ldexp(static_cast<double>(sum), -(shift_a + shift_b)));
}

// The reference product C = A B (row-major, A m x k, B k x n) on the host: the definition above,
// one element at a time. An element of C whose row of A or column of B holds an inf or a NaN is a
// NaN (the scale is undefined there; the step's non-finite check skips such a step before).
// k must be at most kExactMatmulMaxK (returns false otherwise, C untouched).
inline bool exact_matmul_reference(const float* a, const float* b, float* c, size_t m, size_t k, size_t n) {
  if (k > kExactMatmulMaxK) return false;
  std::vector<int> row_shift(m), col_shift(n);
  std::vector<bool> row_finite(m, true), col_finite(n, true);
  std::vector<int32_t> qa(m * k), qb(k * n);
  // Vector v of `count`, element p at x[v * outer + p * inner] (a row of A or a column of B):
  // its shift, whether it is finite, and its fixed-point values at the same places in q.
  auto scale_vectors = [k](const float* x, size_t count, size_t outer, size_t inner, std::vector<int>& shift,
                           std::vector<bool>& finite, std::vector<int32_t>& q) {
    for (size_t v = 0; v < count; ++v) {
      float amax = 0.0f;
      for (size_t p = 0; p < k; ++p) {
        const float ax = std::fabs(x[v * outer + p * inner]);
        if (!std::isfinite(ax)) finite[v] = false;
        if (ax > amax) amax = ax;
      }
      shift[v] = finite[v] ? fixed_point_shift(amax) : 0;
      for (size_t p = 0; p < k; ++p) {
        q[v * outer + p * inner] = finite[v] ? to_fixed_point(x[v * outer + p * inner], shift[v]) : 0;
      }
    }
  };
  scale_vectors(a, m, k, 1, row_shift, row_finite, qa);
  scale_vectors(b, n, 1, n, col_shift, col_finite, qb);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      if (!row_finite[i] || !col_finite[j]) {
        c[i * n + j] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      int64_t sum = 0;
      for (size_t p = 0; p < k; ++p) sum += int64_t{qa[i * k + p]} * int64_t{qb[p * n + j]};
      c[i * n + j] = from_fixed_point(sum, row_shift[i], col_shift[j]);
    }
  }
  return true;
}

}  // namespace math
}  // namespace renaissance
