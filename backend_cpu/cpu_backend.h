// The CPU backend: OpenMP threads over chunks of a range, Highway SIMD inside a chunk. This
// header is shared by the backend class and the op files (one per op family).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "renaissance/backend.h"
#include "renaissance/graph.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace cpu {

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options);

// Elements per OpenMP work item. A multiple of the 64-element region padding, so chunks start
// on 256-byte boundaries. Element-wise results do not depend on it (nor on the thread count).
constexpr uint64_t kChunkElements = 16384;

// What an op needs to run: the arena and the thread count.
struct CpuContext {
  char* arena = nullptr;
  int threads = 1;
  ScalarPtrs scalars{};
  const CompiledStep* step = nullptr;  // the step being run (for its LARS table offsets)

  template <class T>
  T* at(const Span& span) const {
    return reinterpret_cast<T*>(arena + span.offset);
  }
  bool step_skipped() const { return scalars.i32[kHasNonFinite] != 0; }
};

// Runs fn(begin, end) over [0, count) in chunks of kChunkElements on the context's threads.
template <class Fn>
void parallel_chunks(const CpuContext& ctx, uint64_t count, Fn&& fn) {
  const int64_t chunks = static_cast<int64_t>((count + kChunkElements - 1) / kChunkElements);
  const int threads = static_cast<int>(std::min<int64_t>(ctx.threads, std::max<int64_t>(chunks, 1)));
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t c = 0; c < chunks; ++c) {
    const uint64_t begin = static_cast<uint64_t>(c) * kChunkElements;
    fn(begin, std::min(count, begin + kChunkElements));
  }
}

// One function per op of RN_RANGE_OPS / RN_COMPUTE_OPS, implemented in the ops_*.cc files.
#define RN_DECLARE_CPU_RANGE_OP(name) void run_##name(const CpuContext& ctx, const GraphNode& node);
RN_RANGE_OPS(RN_DECLARE_CPU_RANGE_OP)
RN_COMPUTE_OPS(RN_DECLARE_CPU_RANGE_OP)
#undef RN_DECLARE_CPU_RANGE_OP

// Name of the Highway target the dispatcher currently picks (for describe() and tests).
const char* current_simd_target();

}  // namespace cpu
}  // namespace renaissance
