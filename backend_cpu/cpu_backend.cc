// The CPU backend class: a zero-filled, 256-byte-aligned host arena, the op dispatch tables
// (filled from the X-macro op lists, so every op must have a run_* function), and the executor
// that runs the step's graphs in order.
#include "backend_cpu/cpu_backend.h"
#include "backend_cpu/cpu_ops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/math/synthetic_gradient.h"
#include "renaissance/plan.h"

namespace renaissance {
namespace cpu {

namespace {

using OpFn = void (*)(const CpuContext&, const GraphNode&);

constexpr OpFn kRangeOps[kNumRangeOps] = {
#define RN_TABLE_ENTRY(name) &run_##name,
    RN_RANGE_OPS(RN_TABLE_ENTRY)
#undef RN_TABLE_ENTRY
};
constexpr OpFn kComputeOps[kNumComputeOps] = {
#define RN_TABLE_ENTRY(name) &run_##name,
    RN_COMPUTE_OPS(RN_TABLE_ENTRY)
#undef RN_TABLE_ENTRY
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options) {
    threads_ = options.threads > 0 ? options.threads : omp_get_num_procs();
  }
  ~CpuBackend() override { std::free(arena_); }

  BackendKind kind() const override { return BackendKind::kCpu; }

  std::string describe() const override {
    std::ostringstream os;
    os << "cpu (" << current_simd_target() << ", " << threads_ << (threads_ == 1 ? " thread)" : " threads)");
    return os.str();
  }

  void allocate_arena(uint64_t bytes) override {
    std::free(arena_);
    arena_ = nullptr;
    bytes_ = bytes;
    const uint64_t rounded = (std::max<uint64_t>(bytes, 1) + kRegionAlignBytes - 1) / kRegionAlignBytes * kRegionAlignBytes;
    arena_ = static_cast<char*>(std::aligned_alloc(kRegionAlignBytes, rounded));
    if (arena_ == nullptr) {
      throw Error(ErrorKind::kBackend, "cpu backend: cannot allocate an arena of " + std::to_string(bytes) + " bytes");
    }
    std::memset(arena_, 0, rounded);
  }

  void* arena() override { return arena_; }

  void upload(uint64_t offset, const void* src, uint64_t bytes) override {
    check_range(offset, bytes);
    std::memcpy(arena_ + offset, src, bytes);
  }
  void download(uint64_t offset, void* dst, uint64_t bytes) override {
    check_range(offset, bytes);
    std::memcpy(dst, arena_ + offset, bytes);
  }

  void prepare(const CompiledStep&) override {}

  void execute(const CompiledStep& step) override {
    CpuContext ctx;
    ctx.arena = arena_;
    ctx.threads = threads_;
    ctx.scalars.f32 = ctx.at<float>(step.scalars_f32);
    ctx.scalars.i32 = ctx.at<int32_t>(step.scalars_i32);
    ctx.scalars.f64 = ctx.at<double>(step.scalars_f64);
    for (const auto& graph : step.graphs) {
      for (const GraphNode& node : graph) {
        if (node.kind == NodeKind::kRange) {
          kRangeOps[static_cast<int>(node.range_op)](ctx, node);
        } else {
          kComputeOps[static_cast<int>(node.compute_op)](ctx, node);
        }
      }
    }
  }

  void synchronize() override {}

  // The same-traffic reference over this arena, with the step's threads and chunking
  // (Backend::same_traffic_gbps). The key is 0 but opaque to the compiler.
  double same_traffic_gbps(const std::vector<TrafficPass>& passes, int runs) override {
    static volatile uint32_t key = 0;
    // A volatile store of the passes' fold: the loads cannot be dropped as dead.
    [[maybe_unused]] static volatile uint32_t sink = 0;
    CpuContext ctx;
    ctx.arena = arena_;
    ctx.threads = threads_;
    for (const TrafficPass& p : passes) {
      for (uint64_t off : p.reads) check_range(off, p.count * sizeof(float));
      for (uint64_t off : p.updates) check_range(off, p.count * sizeof(float));
    }
    std::vector<double> seconds;
    const int warmup = runs > 1 ? 1 : 0;
    for (int rep = 0; rep < warmup + std::max(runs, 1); ++rep) {
      const auto start = std::chrono::steady_clock::now();
      uint32_t fold = 0;
      for (const TrafficPass& p : passes) fold ^= run_same_traffic_pass(ctx, p, key);
      sink = fold;
      if (rep >= warmup) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return traffic_bytes(passes) / *std::min_element(seconds.begin(), seconds.end()) / 1e9;
  }

  void fill_synthetic_gradients(const std::vector<GradientTarget>& targets, uint64_t seed, uint64_t step,
                                float amplitude) override {
    for (const GradientTarget& t : targets) {
      check_range(t.offset, t.count * sizeof(float));
      float* g = reinterpret_cast<float*>(arena_ + t.offset);
      parallel_blocks(threads_, t.count, kChunkElements, [&](uint64_t begin, uint64_t end) {
        for (uint64_t i = begin; i < end; ++i) g[i] = math::synthetic_gradient(seed, step, t.tensor, i, amplitude);
      });
    }
  }

 private:
  void check_range(uint64_t offset, uint64_t bytes) const {
    if (offset > bytes_ || bytes > bytes_ - offset) {
      throw Error(ErrorKind::kBackend, "cpu backend: copy of " + std::to_string(bytes) + " bytes at offset " +
                                           std::to_string(offset) + " is outside the arena");
    }
  }

  char* arena_ = nullptr;
  uint64_t bytes_ = 0;
  int threads_ = 1;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  if (options.threads < 0) throw_invalid("threads must be >= 0 (0: all cores), got " + std::to_string(options.threads));
  return std::make_unique<CpuBackend>(options);
}

}  // namespace cpu
}  // namespace renaissance
