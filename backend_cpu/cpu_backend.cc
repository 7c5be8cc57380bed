// The CPU backend class: a zero-filled, page-aligned host arena (anonymous memory, optionally on
// transparent huge pages and first touched by the threads that update it: BackendOptions::cpu),
// the op dispatch tables (filled from the X-macro op lists, so every op must have a run_* function),
// and the executor that runs the step's graphs in order.
#include "backend_cpu/cpu_backend.h"
#include "backend_cpu/cpu_ops.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/math/synthetic_gradient.h"
#include "renaissance/plan.h"

namespace renaissance {
namespace cpu {

namespace {

using OpFn = void (*)(const CpuContext&, const GraphNode&);

#define RN_CPU_OP(name) &run_##name,
RN_OP_TABLES(OpFn, RN_CPU_OP)
#undef RN_CPU_OP

constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

// Writes nothing new to the pages of [p, p + bytes): an atomic OR with 0 on one word per page is
// a write access (the page is placed now, by this thread) that leaves every bit as it was, even
// where a neighbouring thread touches the same page.
void touch_pages(char* p, uint64_t bytes, uint64_t page) {
  if (bytes == 0) return;
  const uintptr_t first = reinterpret_cast<uintptr_t>(p);
  const uintptr_t last = first + bytes;
  for (uintptr_t a = first; a < last; a = (a / page + 1) * page) {
    __atomic_fetch_or(reinterpret_cast<uint32_t*>(a & ~uintptr_t{3}), 0u, __ATOMIC_RELAXED);
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options) : tuning_(options.cpu) {
    threads_ = options.threads > 0 ? options.threads : omp_get_num_procs();
    page_ = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  }
  ~CpuBackend() override { release(); }

  BackendKind kind() const override { return BackendKind::kCpu; }

  // The switches that differ from their defaults are named, so a benchmark row says what ran.
  std::string describe() const override {
    const CpuTuning d;
    std::ostringstream os;
    os << "cpu (" << current_simd_target() << ", " << threads_ << (threads_ == 1 ? " thread" : " threads");
    if (tuning_.chunk_elements != d.chunk_elements) os << ", chunk " << tuning_.chunk_elements;
    if (tuning_.schedule != d.schedule) os << ", " << cpu_schedule_name(tuning_.schedule);
    if (tuning_.prefetch_elements != d.prefetch_elements) os << ", prefetch " << tuning_.prefetch_elements;
    if (tuning_.first_touch != d.first_touch) os << (tuning_.first_touch ? ", first touch" : ", memset arena");
    if (tuning_.huge_pages != d.huge_pages) os << (tuning_.huge_pages ? ", huge pages" : ", no huge pages");
    if (tuning_.amx_tiles != d.amx_tiles) os << (tuning_.amx_tiles ? ", amx tiles" : ", no amx tiles");
    os << ")";
    return os.str();
  }

  // Anonymous memory is zero-filled by the kernel, so no bit depends on who first writes a page;
  // that only decides where it lives (NUMA node) and when it is faulted in. With huge pages the
  // arena starts on a 2 MiB boundary and is advised MADV_HUGEPAGE (without: MADV_NOHUGEPAGE, so
  // the A/B is not blurred by a system set to "always"); the advice is a hint, never an error.
  // Without first touch, one memset by this thread places every page now (the old behaviour);
  // with it, prepare() faults the update spans in with the ops' own partition.
  void allocate_arena(uint64_t bytes) override {
    release();
    bytes_ = bytes;
    const uint64_t align = tuning_.huge_pages ? kHugePageBytes : page_;
    const uint64_t rounded = round_up(std::max<uint64_t>(bytes, 1), align);
    mapped_bytes_ = rounded + align - page_;  // room to move the start to an `align` boundary
    void* base = mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      mapped_bytes_ = 0;
      throw Error(ErrorKind::kBackend, "cpu backend: cannot allocate an arena of " + std::to_string(bytes) + " bytes");
    }
    mapping_ = static_cast<char*>(base);
    arena_ = mapping_ + (round_up(reinterpret_cast<uintptr_t>(mapping_), align) - reinterpret_cast<uintptr_t>(mapping_));
    (void)madvise(arena_, rounded, tuning_.huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    placed_ = !tuning_.first_touch;
    if (placed_) std::memset(arena_, 0, rounded);
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

  // First touch: every span of every update node (the nodes with a W span) is faulted in by the
  // thread that will update it, with the ops' block size and schedule; then the remaining nodes'
  // spans (the check over all of G, norm passes) where still untouched. The tile-wise updates
  // split by tiles rather than elements, which differs only at tensor ends. Pages touched before
  // (scalars, norm tables uploaded by compile()) keep their place and their contents.
  void prepare(const CompiledStep& step) override {
    if (placed_) return;
    placed_ = true;
    for (int pass = 0; pass < 2; ++pass) {
      for (const auto& graph : step.graphs) {
        for (const GraphNode& node : graph) {
          if (node.kind != NodeKind::kRange || (node.span(Family::kW).count > 0) != (pass == 0)) continue;
          for (Family family : {Family::kW, Family::kG, Family::kM, Family::kV}) {
            const Span* span = &node.span(family);
            if (span->count == 0) continue;
            // G of model-dtype gradients holds elements of its encoding's size.
            const uint64_t size = family == Family::kG ? precision_bytes(node.grad.encoding) : sizeof(float);
            check_range(span->offset, span->count * size);
            char* base = arena_ + span->offset;
            parallel_blocks(threads_, span->count, tuning_.chunk_elements, [&](uint64_t b, uint64_t e) {
              touch_pages(base + b * size, (e - b) * size, page_);
            }, tuning_.schedule);
          }
        }
      }
    }
  }

  void execute(const CompiledStep& step) override {
    CpuContext ctx;
    ctx.arena = arena_;
    ctx.threads = threads_;
    ctx.tuning = tuning_;
    ctx.scalars = step.scalars_in(arena_);
    for (const auto& graph : step.graphs) {
      for (const GraphNode& node : graph) {
        run_node(ctx, node);
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
    ctx.tuning = tuning_;
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
      if (t.dtype != Precision::kFp32) {
        // Model-dtype gradients: the synthetic value rounded to nearest even (GradientTarget).
        const uint64_t elem = precision_bytes(t.dtype);
        check_range(t.offset, t.count * elem);
        char* h = arena_ + t.offset;
        parallel_blocks(threads_, t.count, tuning_.chunk_elements, [&](uint64_t begin, uint64_t end) {
          for (uint64_t i = begin; i < end; ++i) {
            const float x = math::synthetic_gradient(seed, step, t.tensor, i, amplitude);
            math::store_encoding(t.dtype, h, i, math::f32_to_encoded_rne(t.dtype, x));
          }
        }, tuning_.schedule);
        continue;
      }
      check_range(t.offset, t.count * sizeof(float));
      float* g = reinterpret_cast<float*>(arena_ + t.offset);
      parallel_blocks(threads_, t.count, tuning_.chunk_elements, [&](uint64_t begin, uint64_t end) {
        for (uint64_t i = begin; i < end; ++i) g[i] = math::synthetic_gradient(seed, step, t.tensor, i, amplitude);
      }, tuning_.schedule);
    }
  }

  // Every element is independent (math::rank_reduce_element): the blocks' split over threads
  // changes no bit. The pointers may lie outside the arena (a host communicator's workspace).
  void reduce_ranks(const math::RankReduce& op) override {
    if (op.count == 0) return;
    parallel_blocks(threads_, op.count, tuning_.chunk_elements, [&](uint64_t begin, uint64_t end) {
      for (uint64_t i = begin; i < end; ++i) math::rank_reduce_element(op, i);
    }, tuning_.schedule);
  }

 private:
  void check_range(uint64_t offset, uint64_t bytes) const {
    if (offset > bytes_ || bytes > bytes_ - offset) {
      throw Error(ErrorKind::kBackend, "cpu backend: copy of " + std::to_string(bytes) + " bytes at offset " +
                                           std::to_string(offset) + " is outside the arena");
    }
  }

  void release() {
    if (mapping_ != nullptr) munmap(mapping_, mapped_bytes_);
    mapping_ = arena_ = nullptr;
    mapped_bytes_ = bytes_ = 0;
  }

  CpuTuning tuning_;
  char* mapping_ = nullptr;  // what mmap returned (arena_ is at or after it, aligned)
  uint64_t mapped_bytes_ = 0;
  char* arena_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t page_ = 4096;
  bool placed_ = true;  // the arena's pages have been placed (memset or first touch done)
  int threads_ = 1;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  if (options.threads < 0) throw_invalid("threads must be >= 0 (0: all cores), got " + std::to_string(options.threads));
  const CpuTuning& t = options.cpu;
  if (!cpu_chunk_is_valid(t.chunk_elements)) {
    throw Error(ErrorKind::kBackend, "cpu backend: chunk_elements " + std::to_string(t.chunk_elements) +
                                         ": expected a positive multiple of 64");
  }
  if (static_cast<unsigned>(t.schedule) > static_cast<unsigned>(CpuSchedule::kDynamic)) {
    throw Error(ErrorKind::kBackend, "cpu backend: schedule " + std::to_string(static_cast<int>(t.schedule)) +
                                         ": expected static or dynamic");
  }
  return std::make_unique<CpuBackend>(options);
}

}  // namespace cpu
}  // namespace renaissance
