// cuBLASLt for Muon's batched Newton–Schulz products: the library is loaded at first use (dlopen
// of libcublasLt.so.<major>, so the library and its Python wheel need nothing of CUDA's but the
// driver until a Muon step asks for it), and one strided-batched product is planned once (its
// descriptors and the heuristic's algorithm) and enqueued many times, capturable in a CUDA graph.
// Column-major, cuBLASLt's convention: D = alpha * op(A) op(B) + beta * C.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

struct CUstream_st;

namespace renaissance {
namespace cuda {

// The products Muon uses:
// - kInt8: int8 x int8 -> int32 sums, int32 scaling (alpha and beta host ints 1 and 0). Integer
//   sums are exact, so every algorithm cuBLASLt may choose gives the same integers as long as no
//   sum leaves int32 (the caller bounds k).
// - kBf16: bf16 operands, C and D (torch's bf16 matmul and addmm): fp32 accumulation
//   (CUBLAS_COMPUTE_32F), D = alpha * acc + beta * C in fp32, rounded once to bf16; alpha and beta
//   are device floats read when the product runs. 2 B per element read and written. Not bitwise
//   across algorithms or devices.
enum class LtProduct { kInt8, kBf16 };

// One operand's column-major layout: rows x cols with leading dimension ld, `batch_stride` elements
// between the batch's matrices; `transposed`: the product reads op(X) = X^T.
struct LtLayout {
  uint64_t rows;
  uint64_t cols;
  int64_t ld;
  int64_t batch_stride;
  bool transposed = false;
};

// Bytes of device workspace each enqueue is given (the heuristic chooses within it).
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// Whether cuBLASLt could be loaded (why not, in *why, when it could not). Loads it on first call.
bool cublaslt_available(std::string* why = nullptr);

class LtMatmul {
 public:
  // Plans D (m x n) = op(A) op(B) (+ beta C, C = D's layout) over `batch` matrices. Returns
  // nullptr, with the reason in *why, when cuBLASLt is not loadable or offers no algorithm for
  // these layouts on the current device.
  static std::unique_ptr<LtMatmul> plan(LtProduct product, const LtLayout& a, const LtLayout& b, const LtLayout& d,
                                        int batch, std::string* why);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // Enqueues the product on `stream` (no allocation, no host wait). kInt8: alpha and beta are
  // ignored (1 and 0) and c may be null; kBf16: device floats, c may equal d.
  // workspace: kLtWorkspaceBytes of device memory, 256-byte aligned. Throws Error(kBackend) when
  // cuBLASLt reports a failure.
  void enqueue(const void* a, const void* b, void* d, CUstream_st* stream, void* workspace,
               const float* alpha = nullptr, const float* beta = nullptr, const void* c = nullptr) const;

 private:
  struct State;
  explicit LtMatmul(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace cuda
}  // namespace renaissance
