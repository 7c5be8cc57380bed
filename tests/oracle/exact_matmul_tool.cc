// The CPU exact product and Newton–Schulz (backend_cpu/exact_matmul_cpu.h) as a command, for the
// numpy oracle (exact_matmul_numpy.py), which writes the operands as raw little-endian float32 and
// reads the result back:
//   exact_matmul_tool matmul M K N A.f32 B.f32 C.f32 THREADS
//   exact_matmul_tool ns ROWS COLS STEPS U.f32 OUT.f32 THREADS      (torch's coefficients, eps 1e-7)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend_cpu/exact_matmul_cpu.h"

namespace {

std::vector<float> read_floats(const char* path, size_t count) {
  std::vector<float> x(count);
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr || std::fread(x.data(), sizeof(float), count, f) != count) {
    std::fprintf(stderr, "cannot read %zu floats from %s\n", count, path);
    std::exit(2);
  }
  std::fclose(f);
  return x;
}

void write_floats(const char* path, const std::vector<float>& x) {
  FILE* f = std::fopen(path, "wb");
  if (f == nullptr || std::fwrite(x.data(), sizeof(float), x.size(), f) != x.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "cannot write %s\n", path);
    std::exit(2);
  }
}

size_t arg(const char* s) { return static_cast<size_t>(std::strtoull(s, nullptr, 10)); }

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "matmul" && argc == 9) {
    const size_t m = arg(argv[2]), k = arg(argv[3]), n = arg(argv[4]);
    const std::vector<float> a = read_floats(argv[5], m * k), b = read_floats(argv[6], k * n);
    std::vector<float> c(m * n);
    if (!renaissance::cpu::exact_matmul_cpu(a.data(), b.data(), c.data(), m, k, n, nullptr,
                                            static_cast<int>(arg(argv[8])))) {
      return 3;
    }
    write_floats(argv[7], c);
    return 0;
  }
  if (what == "ns" && argc == 8) {
    const size_t rows = arg(argv[2]), cols = arg(argv[3]);
    const std::vector<float> u = read_floats(argv[5], rows * cols);
    std::vector<float> out(rows * cols);
    if (!renaissance::cpu::newton_schulz_exact_cpu(u.data(), rows, cols, out.data(), {}, static_cast<int>(arg(argv[4])),
                                                   renaissance::math::kDefaultNewtonSchulzEps, nullptr,
                                                   static_cast<int>(arg(argv[7])))) {
      return 3;
    }
    write_floats(argv[6], out);
    return 0;
  }
  std::fprintf(stderr,
               "usage: %s matmul M K N A.f32 B.f32 C.f32 THREADS\n"
               "       %s ns ROWS COLS STEPS U.f32 OUT.f32 THREADS\n",
               argv[0], argv[0]);
  return 1;
}
