// The error of CUDA fast mode's Newton–Schulz against the float64 iteration, emulated on the CPU
// (docs/math.md, "Muon: fast mode"; the bound of tests/cuda/test_newton_schulz_cuda.cc). Three
// forms, each with bf16 operands and products accumulated in double (a GEMM's fp32 accumulation
// adds far less than bf16's rounding):
// - "fp32 X": X, A and B kept in fp32, rounded to bf16 only as operands (cuBLASLt
//   COMPUTE_32F_FAST_16BF on fp32 slabs);
// - "bf16 X": X, A and B stored in bf16, each product's alpha/beta epilogue in fp32 rounded once
//   (NewtonSchulzBatch's fast mode: normalised in fp32, then rounded);
// - "torch": the same, with torch.optim.Muon's start (rounded to bf16 first, the norm and the
//   division in bf16).
// Inputs as the CUDA test makes them (std::mt19937 normals times the scale). Standalone:
//   g++ -O2 -ffp-contract=off -Icore/include -o /tmp/ns_fast_error bench/ns_fast_error.cc && /tmp/ns_fast_error
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "renaissance/math/precision.h"

namespace {

using Mat = std::vector<double>;

// Rounded to bf16 (nearest, ties to even: the library's codec) and widened back.
float bf16(float x) { return renaissance::math::bf16_to_f32(renaissance::math::f32_to_bf16_rne(x)); }

std::vector<float> random_matrix(size_t r, size_t c, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> m(r * c);
  for (float& x : m) x = nd(rng) * scale;
  return m;
}

// Row-major n x k times k x m.
Mat product(const Mat& l, const Mat& r, size_t n, size_t k, size_t m) {
  Mat o(n * m, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t p = 0; p < k; ++p) {
      const double v = l[i * k + p];
      for (size_t j = 0; j < m; ++j) o[i * m + j] += v * r[p * m + j];
    }
  }
  return o;
}

Mat transpose(const Mat& x, size_t r, size_t c) {
  Mat t(r * c);
  for (size_t i = 0; i < r; ++i) {
    for (size_t j = 0; j < c; ++j) t[j * r + i] = x[i * c + j];
  }
  return t;
}

enum class Form { kFloat64, kFp32X, kBf16X, kTorch };

void round_bf16(Mat& m) {
  for (double& e : m) e = bf16(static_cast<float>(e));
}
void round_fp32(Mat& m) {
  for (double& e : m) e = static_cast<float>(e);
}

// Five steps of the default coefficients; the result in the wide orientation.
Mat newton_schulz(const std::vector<float>& u, size_t rows, size_t cols, Form form) {
  const bool t = rows > cols;
  const size_t r = t ? cols : rows, c = t ? rows : cols;
  Mat x(r * c);
  for (size_t i = 0; i < r; ++i) {
    for (size_t j = 0; j < c; ++j) x[i * c + j] = t ? u[j * cols + i] : u[i * cols + j];
  }
  const float fa = 3.4445f, fb = -4.7750f, fc = 2.0315f;
  double sum = 0.0;
  if (form == Form::kTorch) round_bf16(x);
  for (double e : x) sum += e * e;
  if (form == Form::kFloat64) {
    const double norm = std::max(std::sqrt(sum), 1e-7);
    for (double& e : x) e /= norm;
  } else if (form == Form::kTorch) {
    const float norm = std::max(bf16(static_cast<float>(std::sqrt(sum))), 1e-7f);
    for (double& e : x) e = bf16(static_cast<float>(e) / norm);
  } else {
    const float norm = std::max(static_cast<float>(std::sqrt(sum)), 1e-7f);
    for (double& e : x) e = static_cast<float>(e) / norm;
    if (form == Form::kBf16X) round_bf16(x);
  }
  const bool stored_bf16 = form == Form::kBf16X || form == Form::kTorch;
  for (int step = 0; step < 5; ++step) {
    if (form == Form::kFloat64) {
      const Mat a = product(x, transpose(x, r, c), r, c, r);
      const Mat p = product(a, a, r, r, r);
      Mat b(r * r);
      for (size_t e = 0; e < b.size(); ++e) b[e] = -4.7750 * a[e] + 2.0315 * p[e];
      const Mat q = product(b, x, r, r, c);
      for (size_t e = 0; e < x.size(); ++e) x[e] = 3.4445 * x[e] + q[e];
      continue;
    }
    Mat xo = x;  // the operand the tensor cores read
    round_bf16(xo);
    Mat a = product(xo, transpose(xo, r, c), r, c, r);
    round_fp32(a);
    if (stored_bf16) round_bf16(a);
    Mat ao = a;
    round_bf16(ao);
    const Mat p = product(ao, ao, r, r, r);
    Mat b(r * r);
    for (size_t e = 0; e < b.size(); ++e) {
      b[e] = static_cast<float>(static_cast<float>(fc * static_cast<float>(p[e])) + static_cast<float>(fb * static_cast<float>(a[e])));
    }
    if (stored_bf16) round_bf16(b);
    Mat bo = b;
    round_bf16(bo);
    const Mat q = product(bo, xo, r, r, c);
    for (size_t e = 0; e < x.size(); ++e) {
      x[e] = static_cast<float>(static_cast<float>(q[e]) + static_cast<float>(fa * static_cast<float>(x[e])));
    }
    if (stored_bf16) round_bf16(x);
  }
  return x;
}

}  // namespace

int main() {
  struct Case {
    size_t r, c;
    uint32_t seed;
  };
  // The CUDA test's two matrices (seeds 71 and 72) and 28 more of the same shapes and scale.
  std::vector<Case> cases;
  for (uint32_t s = 71; s < 111; s += 2) cases.push_back({64, 256, s});
  for (uint32_t s = 72; s < 92; s += 2) cases.push_back({256, 64, s});
  const Form forms[3] = {Form::kFp32X, Form::kBf16X, Form::kTorch};
  const char* names[3] = {"fp32 X", "bf16 X", "torch"};
  double lo[3] = {1e30, 1e30, 1e30}, hi[3] = {0, 0, 0}, rel_lo[3] = {1e30, 1e30, 1e30}, rel_hi[3] = {0, 0, 0};
  for (const Case& k : cases) {
    const std::vector<float> u = random_matrix(k.r, k.c, k.seed, 0.02f);
    const Mat ref = newton_schulz(u, k.r, k.c, Form::kFloat64);
    double norm = 0.0;
    for (double e : ref) norm += e * e;
    norm = std::sqrt(norm);
    std::printf("%zux%zu seed %u:", k.r, k.c, k.seed);
    for (int f = 0; f < 3; ++f) {
      const Mat x = newton_schulz(u, k.r, k.c, forms[f]);
      double d = 0.0, worst = 0.0;
      for (size_t e = 0; e < x.size(); ++e) {
        d += (x[e] - ref[e]) * (x[e] - ref[e]);
        worst = std::max(worst, std::fabs(x[e] - ref[e]));
      }
      const double rel = std::sqrt(d) / norm;
      lo[f] = std::min(lo[f], worst), hi[f] = std::max(hi[f], worst);
      rel_lo[f] = std::min(rel_lo[f], rel), rel_hi[f] = std::max(rel_hi[f], rel);
      std::printf("  %s: max %.3g rel %.3g", names[f], worst, rel);
    }
    std::printf("\n");
  }
  for (int f = 0; f < 3; ++f) {
    std::printf("%s: largest element error %.3g to %.3g, relative Frobenius distance %.3g to %.3g\n", names[f], lo[f],
                hi[f], rel_lo[f], rel_hi[f]);
  }
  return 0;
}
