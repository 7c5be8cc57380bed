// Muon's orthogonalisation on a CUDA device. Exact mode: the bits of
// math::newton_schulz_reference (renaissance/math/newton_schulz.h), for one matrix
// (newton_schulz_device) or for the matrices of one shape class at once (NewtonSchulzBatch, whose
// products are strided-batched cuBLASLt int8 products). Fast mode: torch's bf16 iteration, X, A
// and B stored in bf16 and every product a cuBLASLt bf16 product (fp32 accumulation), batched the
// same way. Host-callable; the only CUDA type in the interface is the stream, declared opaquely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend_cuda/cublaslt.h"
#include "backend_cuda/exact_matmul.h"
#include "renaissance/math/newton_schulz.h"

struct CUstream_st;

namespace renaissance {
namespace cuda {

// The iteration's fp32 scalars as device pointers, read by the kernels when they run (a
// captured graph follows later changes of the scalar block without a new capture): the
// coefficients a, b, c and eps. The step count is a launch argument (the number of kernels), so
// it is fixed when the launches are enqueued (or captured).
struct NewtonSchulzScalars {
  const float* a;
  const float* b;
  const float* c;
  const float* eps;
};

// Bytes of device scratch newton_schulz_device needs for a rows x cols matrix (or its transpose).
size_t newton_schulz_scratch_bytes(size_t rows, size_t cols);

// out (rows x cols, row-major, device) = math::newton_schulz_reference(u, rows, cols, ...) bit for
// bit, enqueued on `stream`: nothing is allocated and nothing waits, so the call can be captured
// in a CUDA graph. out may be u (in place). scratch: newton_schulz_scratch_bytes(rows, cols) bytes,
// 256-byte aligned. With `skip` every kernel does nothing when it says so at run time (out keeps
// its bytes). Throws Error(kInvalidArgument) where the reference returns false
// (max(rows, cols) above math::kExactMatmulMaxK) and for steps < 0; Error(kBackend) for a launch
// failure.
void newton_schulz_device(const float* u, size_t rows, size_t cols, float* out, const NewtonSchulzScalars& scalars,
                          int steps, void* scratch, CUstream_st* stream, SkipFlags skip = {});

// One matrix of a shape class: r x c (r <= c) or, transposed, c x r, at `start` elements into the
// array the batch is enqueued on. `tensor`: the caller's index of the matrix (Muon: its row of the
// matrix table, which picks its N and scalar block), carried for a sink of the slab.
struct NewtonSchulzEntry {
  int64_t start;
  int32_t transposed;
  int32_t tensor = 0;
};

// Where a batch leaves its result when the caller takes it out itself (enqueue_to_slab): X of
// entry b in slice b (r x c, row-major) of a slab of the scratch, fp32 or, in fast mode, bf16 bits;
// `entries` is the device copy of the entry table. slab_tiles.cuh walks it.
struct NewtonSchulzSlab {
  const void* x;
  bool bf16;
  const NewtonSchulzEntry* entries;
  size_t nb, r, c;
};

enum class NewtonSchulzMode { kExact, kFast };

// For a profiler (bench_step --muon-phases through cuda::phase_times, cuda_backend.h): mark(phase)
// is called on the host just before the launches of `phase` are enqueued, so an event recorded
// there on the same stream splits the stream's work by phase. The enqueued work is the same with
// or without it.
class NewtonSchulzPhases {
 public:
  virtual ~NewtonSchulzPhases() = default;
  virtual void mark(const std::string& phase) = 0;
};

// The matrices of one shape class (min side r, max side c) that share one scalar block,
// orthogonalised together: X of every entry lies in one r x c slab of the scratch, so each of the
// iteration's products is one strided-batched product over the class (launches per step depend on
// the number of classes, not of matrices). Exact mode computes the bits of the per-matrix
// reference: the products' integers are exact whatever the batching or cuBLASLt's algorithm, and
// the element-wise steps are the reference's. Where cuBLASLt is not loadable or offers no int8
// algorithm for the class (odd sizes), or k is above kDigitSumMaxK, exact mode runs
// newton_schulz_device on each entry instead (the same bits). Fast mode (docs/math.md, "Muon: fast
// mode"): X = u / max(‖u‖_F, eps) in fp32 rounded to bf16 (nearest even), then per step
// A = X X^T, B = c A A + b A and X = B X + a X as bf16 products with fp32 accumulation and the
// coefficients as alpha/beta, each result rounded once to bf16 (torch's addmm form); the result is
// X widened to fp32. It needs cuBLASLt and throws Error(kBackend) naming why when it is missing.
class NewtonSchulzBatch {
 public:
  // Plans the products and copies the entry table to the device: not allowed during a capture.
  // use_library false: exact mode runs one entry after another (fast mode throws).
  NewtonSchulzBatch(size_t r, size_t c, std::vector<NewtonSchulzEntry> entries, NewtonSchulzMode mode,
                    bool use_library = true);
  ~NewtonSchulzBatch();
  NewtonSchulzBatch(const NewtonSchulzBatch&) = delete;
  NewtonSchulzBatch& operator=(const NewtonSchulzBatch&) = delete;

  size_t scratch_bytes() const { return scratch_bytes_; }
  // Whether the products run as cuBLASLt batches (else: one matrix after another).
  bool batched() const { return gram_ != nullptr; }
  size_t size() const { return entries_.size(); }

  // Every entry of `u` orthogonalised in place, enqueued on `stream` (capturable); `skip` cancels
  // the kernels at run time as in newton_schulz_device (the cuBLASLt products still run, on the
  // scratch only). `phases` (optional, not during a capture) is marked before each phase, named
  // "ns <r>x<c> (<entries>): <phase>", in this order (the per-step phases once per step): exact
  // batches "normalise", "A: scales+digits", "A: int8 products", "A: combine", the same for B and
  // for Q ("Q: combine" forms the next X), "store"; fast: "normalise", "A = X X^T",
  // "B = c A A + b A", "X = B X + a X", "store"; one matrix after another: "per-matrix iteration".
  void enqueue(float* u, const NewtonSchulzScalars& scalars, int steps, void* scratch, CUstream_st* stream,
               SkipFlags skip = {}, NewtonSchulzPhases* phases = nullptr) const;

  // The same up to the store (a batched class only, else Error(kBackend)): X of every entry stays
  // in the returned slab of `scratch`, u is only read, and the caller launches its own use of the
  // slab on `stream` before the scratch is used again (no "store" phase is marked).
  NewtonSchulzSlab enqueue_to_slab(const float* u, const NewtonSchulzScalars& scalars, int steps, void* scratch,
                                   CUstream_st* stream, SkipFlags skip = {}, NewtonSchulzPhases* phases = nullptr) const;

  // Marks `phase` of this class on `phases` (nullptr: nothing), named as enqueue's phases are.
  void mark(NewtonSchulzPhases* phases, const char* phase) const;

 private:
  // The iteration of a batched class; returns the slab X ends in.
  const void* enqueue_exact(const float* u, const NewtonSchulzScalars& s, int steps, void* scratch,
                            CUstream_st* stream, SkipFlags skip, NewtonSchulzPhases* phases) const;
  const void* enqueue_fast(const float* u, const NewtonSchulzScalars& s, int steps, void* scratch,
                           CUstream_st* stream, SkipFlags skip, NewtonSchulzPhases* phases) const;

  size_t r_, c_;
  NewtonSchulzMode mode_;
  std::vector<NewtonSchulzEntry> entries_;
  NewtonSchulzEntry* device_entries_ = nullptr;
  float* device_constants_ = nullptr;  // 1.0f and 0.0f, the fast products' fixed alpha and beta
  std::unique_ptr<LtMatmul> gram_, square_, apply_;  // A = X X^T, P (B), Q; exact: P' = O O, Q' = O_B X
  size_t scratch_bytes_ = 0;
};

// The same on host arrays (copied to the device and back, synchronously): for tests and tools.
// Returns false (out untouched) where the reference does.
bool newton_schulz_on_device(const float* u, size_t rows, size_t cols, float* out,
                             const math::NewtonSchulzCoefficients& coeff = {},
                             int steps = math::kDefaultNewtonSchulzSteps, float eps = math::kDefaultNewtonSchulzEps);

// Several matrices of one shape class through NewtonSchulzBatch, on host arrays: u holds them one
// after another (matrix i: rows[i] x cols[i], each min/max side the same), out receives them.
// Returns whether the batch ran as cuBLASLt batches. For tests and tools.
bool newton_schulz_batch_on_device(const float* u, const std::vector<size_t>& rows, const std::vector<size_t>& cols,
                                   float* out, NewtonSchulzMode mode, const math::NewtonSchulzCoefficients& coeff = {},
                                   int steps = math::kDefaultNewtonSchulzSteps,
                                   float eps = math::kDefaultNewtonSchulzEps);

}  // namespace cuda
}  // namespace renaissance
