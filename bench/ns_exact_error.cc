// The distance of exact mode's Newton–Schulz to the float64 iteration by shape (docs/math.md, "Muon:
// Newton–Schulz in exact mode", the table): relative Frobenius distance of
// - exact mode: cpu::newton_schulz_exact_cpu, the reference's bits (with the diagonal split);
// - "14-bit unsplit": the same iteration with A A and B X as plain exact products (the diagonal
//   inside the scaled operands), the form before the split;
// - torch's bf16 form: X, A and B stored in bf16 (nearest even), each addmm one bf16 rounding of
//   a product accumulated in double plus its fp32-like epilogue, the norm in double.
// One std::mt19937 standard normal matrix (seed 1) per shape, five steps, torch's coefficients.
//   ns_exact_error [ROWS COLS]...   (default: the table's shapes)
#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "backend_cpu/exact_matmul_cpu.h"
#include "renaissance/math/precision.h"

namespace {

using renaissance::math::NewtonSchulzCoefficients;
using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr int kThreads = 2;

Mat to_mat(const std::vector<float>& u, size_t rows, size_t cols) {
  Mat x(rows, cols);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) x(i, j) = u[i * cols + j];
  }
  return x;
}

Mat newton_schulz_f64(Mat x) {
  const NewtonSchulzCoefficients k;
  const bool tall = x.rows() > x.cols();
  if (tall) x.transposeInPlace();
  x /= std::max(x.norm(), 1e-7);
  for (int s = 0; s < 5; ++s) {
    const Mat a = x * x.transpose();
    const Mat b = double(k.b) * a + double(k.c) * (a * a);
    x = double(k.a) * x + b * x;
  }
  if (tall) x.transposeInPlace();
  return x;
}

double bf16(double v) {
  return renaissance::math::bf16_to_f32(renaissance::math::f32_to_bf16_rne(static_cast<float>(v)));
}
Mat bf16(const Mat& m) { return m.unaryExpr([](double v) { return bf16(v); }); }

Mat newton_schulz_bf16(Mat x) {
  const NewtonSchulzCoefficients k;
  const bool tall = x.rows() > x.cols();
  if (tall) x.transposeInPlace();
  x = bf16(x);
  x = bf16(x / std::max(x.norm(), 1e-7));
  for (int s = 0; s < 5; ++s) {
    const Mat a = bf16(x * x.transpose());
    const Mat b = bf16(double(k.b) * a + double(k.c) * (a * a));
    x = bf16(double(k.a) * x + b * x);
  }
  if (tall) x.transposeInPlace();
  return x;
}

// Exact mode without the split: every product an exact product of the whole matrices.
std::vector<float> newton_schulz_unsplit(const std::vector<float>& u, size_t rows, size_t cols) {
  namespace math = renaissance::math;
  namespace cpu = renaissance::cpu;
  const NewtonSchulzCoefficients k;
  const size_t r = std::min(rows, cols), c = std::max(rows, cols);
  std::vector<float> x(r * c), xt(c * r), gram(r * r), gram2(r * r), poly(r * r), q(r * c), out(rows * cols);
  cpu::newton_schulz_load(u.data(), rows, cols, math::kDefaultNewtonSchulzEps, x.data(), kThreads);
  for (int s = 0; s < 5; ++s) {
    for (size_t i = 0; i < r; ++i) {
      for (size_t j = 0; j < c; ++j) xt[j * r + i] = x[i * c + j];
    }
    cpu::exact_matmul_cpu(x.data(), xt.data(), gram.data(), r, c, r, nullptr, kThreads);
    cpu::exact_matmul_cpu(gram.data(), gram.data(), gram2.data(), r, r, r, nullptr, kThreads);
    for (size_t e = 0; e < r * r; ++e) poly[e] = math::newton_schulz_polynomial(k.b, k.c, gram[e], gram2[e]);
    cpu::exact_matmul_cpu(poly.data(), x.data(), q.data(), r, r, c, nullptr, kThreads);
    for (size_t e = 0; e < r * c; ++e) x[e] = math::newton_schulz_combine(k.a, x[e], q[e]);
  }
  cpu::newton_schulz_store(x.data(), rows, cols, out.data(), kThreads);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::pair<size_t, size_t>> shapes;
  for (int a = 1; a + 1 < argc; a += 2) shapes.emplace_back(std::strtoull(argv[a], nullptr, 10), std::strtoull(argv[a + 1], nullptr, 10));
  if (shapes.empty()) {
    shapes = {{64, 256}, {128, 512}, {256, 1152}, {1024, 256}, {768, 768}, {2048, 512}, {768, 3072}, {512, 4608}};
  }
  std::printf("| shape | exact mode (split) | 14-bit unsplit | torch's bf16 form |\n|---|---|---|---|\n");
  for (const auto& [rows, cols] : shapes) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> u(rows * cols), out(rows * cols);
    for (float& v : u) v = nd(rng);
    renaissance::cpu::newton_schulz_exact_cpu(u.data(), rows, cols, out.data(), {}, 5,
                                              renaissance::math::kDefaultNewtonSchulzEps, nullptr, kThreads);
    const Mat want = newton_schulz_f64(to_mat(u, rows, cols));
    auto rel = [&](const Mat& got) { return 100.0 * (got - want).norm() / want.norm(); };
    std::printf("| %zu×%zu | %.3f %% | %.2f %% | %.1f %% |\n", rows, cols, rel(to_mat(out, rows, cols)),
                rel(to_mat(newton_schulz_unsplit(u, rows, cols), rows, cols)), rel(newton_schulz_bf16(to_mat(u, rows, cols))));
    std::fflush(stdout);
  }
  return 0;
}
