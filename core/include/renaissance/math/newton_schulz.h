// Muon's orthogonalisation in exact mode (docs/math.md, "Muon: Newton–Schulz in exact mode"): the
// host reference that every backend must match bit for bit. The matrix products are
// exact_matmul.h's, the Frobenius norm follows the canonical tensor-norm order of
// norm_reduction.h, and the element-wise steps are single fp32 operations in a fixed order (no
// FMA contraction).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "renaissance/math/exact_matmul.h"
#include "renaissance/math/host_device.h"
#include "renaissance/math/norm_reduction.h"

namespace renaissance {
namespace math {

// torch.optim.Muon's defaults: X <- a X + (b A + c A A) X with A = X X^T, five times.
struct NewtonSchulzCoefficients {
  float a = 3.4445f;
  float b = -4.7750f;
  float c = 2.0315f;
};
constexpr int kDefaultNewtonSchulzSteps = 5;
constexpr float kDefaultNewtonSchulzEps = 1e-7f;

// The element-wise steps, written once for every backend (each bracket one rounded fp32
// operation; the project's flags forbid contracting them into an FMA, on the host and in CUDA):
// the normalisation's denominator max(‖u‖_F, eps), B = (b*A) + (c*P) and X = (a*X) + Q.
RN_HD float newton_schulz_denominator(float norm, float eps) { return norm > eps ? norm : eps; }
RN_HD float newton_schulz_polynomial(float b, float c, float gram, float gram2) {
  const float bt = b * gram;
  const float ct = c * gram2;
  return bt + ct;
}
RN_HD float newton_schulz_combine(float a, float x, float q) {
  const float at = a * x;
  return at + q;
}

// The diagonal split of the two products by a Gram-like matrix (A = X X^T is symmetric with a
// dominant diagonal, and so is B): with d = diag(M) and O = M with a zero diagonal, the exact
// product takes O, whose row and column scales come from the off-diagonal entries, and the
// diagonal's share is added in fp32. Scaling M itself would give every row the scale of its
// diagonal and cost the off-diagonal entries about log2(sqrt(cols)) of their 14 bits (docs/math.md,
// "Muon: Newton-Schulz in exact mode", has the measured distances).
//   P = A A:  P_ij = ((P'_ij + d_i*O_ij) + O_ij*d_j) [+ d_i*d_i when i == j],  P' = O O exact;
//   Q = B X:  Q_ij = Q'_ij + e_i*X_ij,  Q' = O_B X exact, e = diag(B).
// Each bracket is one rounded fp32 operation, in this order on every backend.
RN_HD float newton_schulz_square_from_split(float p_off, float o_ij, float d_i, float d_j, bool diagonal) {
  const float left = d_i * o_ij;
  const float right = o_ij * d_j;
  const float s1 = p_off + left;
  const float s2 = s1 + right;
  if (!diagonal) return s2;
  const float dd = d_i * d_i;
  return s2 + dd;
}
RN_HD float newton_schulz_apply_from_split(float q_off, float e_i, float x_ij) {
  const float t = e_i * x_ij;
  return q_off + t;
}

// out (rows x cols, row-major) = the orthogonalised update of u (rows x cols):
// X = u / max(‖u‖_F, eps) (‖u‖_F = sqrt of the canonical sum in double, rounded to float; one fp32
// division per element), on u^T when rows > cols; then `steps` times
//   A = X X^T (exact), P = A A and Q = B X (exact, through the diagonal split above),
//   B = (b*A) + (c*P), X = (a*X) + Q (each bracket one rounded fp32 operation); out = X, transposed back when rows > cols.
// Returns false (out untouched) when an exact product would be too long (k above kExactMatmulMaxK).
inline bool newton_schulz_reference(const float* u, size_t rows, size_t cols, float* out,
                                    const NewtonSchulzCoefficients& coeff = {},
                                    int steps = kDefaultNewtonSchulzSteps, float eps = kDefaultNewtonSchulzEps) {
  const bool transposed = rows > cols;
  const size_t r = transposed ? cols : rows, c = transposed ? rows : cols;  // X is r x c, r <= c
  if (c > kExactMatmulMaxK) return false;
  std::vector<float> x(r * c), xt(c * r), gram(r * r), gram2(r * r), poly(r * r), off(r * r), q(r * c);
  for (size_t i = 0; i < r; ++i) {
    for (size_t j = 0; j < c; ++j) x[i * c + j] = transposed ? u[j * cols + i] : u[i * cols + j];
  }
  // The norm of u: the same elements in either orientation, summed in u's own (row-major) order.
  const float norm = static_cast<float>(std::sqrt(tensor_sum_of_squares(u, static_cast<int64_t>(rows * cols))));
  const float denom = newton_schulz_denominator(norm, eps);
  for (float& v : x) v = v / denom;
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < r; ++i) {
      for (size_t j = 0; j < c; ++j) xt[j * r + i] = x[i * c + j];
    }
    exact_matmul_reference(x.data(), xt.data(), gram.data(), r, c, r);
    // P = A A through the diagonal split: off = A with a zero diagonal, P' = off off.
    for (size_t e = 0; e < r * r; ++e) off[e] = e % (r + 1) == 0 ? 0.0f : gram[e];
    exact_matmul_reference(off.data(), off.data(), gram2.data(), r, r, r);
    for (size_t i = 0; i < r; ++i) {
      for (size_t j = 0; j < r; ++j) {
        gram2[i * r + j] = newton_schulz_square_from_split(gram2[i * r + j], off[i * r + j], gram[i * r + i],
                                                          gram[j * r + j], i == j);
      }
    }
    for (size_t e = 0; e < r * r; ++e) poly[e] = newton_schulz_polynomial(coeff.b, coeff.c, gram[e], gram2[e]);
    // Q = B X through the diagonal split: off = B with a zero diagonal, Q' = off X.
    for (size_t e = 0; e < r * r; ++e) off[e] = e % (r + 1) == 0 ? 0.0f : poly[e];
    exact_matmul_reference(off.data(), x.data(), q.data(), r, r, c);
    for (size_t i = 0; i < r; ++i) {
      for (size_t j = 0; j < c; ++j) {
        q[i * c + j] = newton_schulz_apply_from_split(q[i * c + j], poly[i * r + i], x[i * c + j]);
      }
    }
    for (size_t e = 0; e < r * c; ++e) x[e] = newton_schulz_combine(coeff.a, x[e], q[e]);
  }
  for (size_t i = 0; i < r; ++i) {
    for (size_t j = 0; j < c; ++j) {
      if (transposed) {
        out[j * cols + i] = x[i * c + j];
      } else {
        out[i * cols + j] = x[i * c + j];
      }
    }
  }
  return true;
}

}  // namespace math
}  // namespace renaissance
