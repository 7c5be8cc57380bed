// The interface every backend implements: one arena, copies in and out of it, and the execution
// of a compiled step. Backends keep their own dispatch tables (indexed by RangeOp/ComputeOp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/graph.h"

namespace renaissance {

enum class BackendKind { kCpu, kCuda, kAuto };
const char* backend_kind_name(BackendKind kind);
bool parse_backend_kind(const std::string& text, BackendKind* out);

struct BackendOptions {
  int threads = 0;  // CPU: OpenMP threads (0: all cores)
  // CUDA: launch shape overrides (0: the backend's choice). Results never depend on them.
  int cuda_block = 0;
  int cuda_grid = 0;
  bool cuda_graph = true;  // capture the step into one CUDA graph
};

// One G tensor to fill: `count` floats at byte `offset` of the arena, tensor number `tensor`.
struct GradientTarget {
  uint64_t offset = 0;
  uint64_t count = 0;
  uint64_t tensor = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  // e.g. "cpu (AVX2, 2 threads)" or "cuda (NVIDIA H200, sm_90)".
  virtual std::string describe() const = 0;

  // Allocates the zero-filled arena; any earlier arena is freed.
  virtual void allocate_arena(uint64_t bytes) = 0;
  // Base address of the arena in the backend's memory (host pointer on CPU, device on CUDA).
  virtual void* arena() = 0;
  virtual void upload(uint64_t offset, const void* src, uint64_t bytes) = 0;
  virtual void download(uint64_t offset, void* dst, uint64_t bytes) = 0;

  // Called once after compile() with the step it will run (CUDA captures its graph here).
  virtual void prepare(const CompiledStep& step) = 0;
  // Runs one whole step. Asynchronous on CUDA; download() synchronizes.
  virtual void execute(const CompiledStep& step) = 0;
  virtual void synchronize() = 0;

  // Writes math::synthetic_gradient(seed, step, tensor, i, amplitude) into each listed G tensor,
  // on the backend's own memory (no host copy). Used by `renaissance run` and the benchmarks.
  virtual void fill_synthetic_gradients(const std::vector<GradientTarget>& targets, uint64_t seed,
                                        uint64_t step, float amplitude) = 0;

  // Measures this backend's memory copy bandwidth in GB/s (bytes read + bytes written, per
  // second) over a buffer of `bytes`: the floor that a memory-bound step is compared with.
  virtual double copy_bandwidth_gbps(uint64_t bytes) = 0;

  // Runs `count` steps and returns each one's time in milliseconds, measured where the work
  // runs. The default brackets each step with a host clock and synchronize(); the CUDA backend
  // overrides it with CUDA events around each graph launch.
  virtual std::vector<double> timed_steps(const CompiledStep& step, int count) {
    std::vector<double> ms;
    ms.reserve(static_cast<size_t>(count));
    synchronize();
    for (int i = 0; i < count; ++i) {
      const auto start = std::chrono::steady_clock::now();
      execute(step);
      synchronize();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
    return ms;
  }

  // Kernel launches (graph nodes) one step costs on this backend, or -1 where that is not a
  // meaningful figure (the CPU backend runs ops, not launches).
  virtual int launches_per_step() const { return -1; }
};

bool backend_available(BackendKind kind);
// Resolves kAuto to CUDA when a device is present, else the CPU.
BackendKind resolve_backend(BackendKind kind);
std::unique_ptr<Backend> create_backend(BackendKind kind, const BackendOptions& options);

}  // namespace renaissance
