// The interface every backend implements: one arena, copies in and out of it, and the execution
// of a compiled step. Backends keep their own dispatch tables (indexed by RangeOp/ComputeOp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/graph.h"
#include "renaissance/kinds.h"
#include "renaissance/math/rank_reduction.h"
#include "renaissance/plan.h"

namespace renaissance {

enum class BackendKind { kCpu, kCuda, kAuto };
const char* backend_kind_name(BackendKind kind);
bool parse_backend_kind(const std::string& text, BackendKind* out);

// How the CPU backend's OpenMP loop hands out the blocks of a range. kStatic: one contiguous run
// of blocks per thread, so each thread streams through one stretch of every span (the hardware
// prefetchers see long runs) and the same pages every step. kDynamic: blocks taken on demand
// (schedule(dynamic, 1)). Neither changes a bit: every element (and every norm tile) is computed
// the same way wherever it lands.
enum class CpuSchedule { kStatic, kDynamic };
const char* cpu_schedule_name(CpuSchedule schedule);  // "static", "dynamic"
bool parse_cpu_schedule(const std::string& text, CpuSchedule* out);

// The CPU backend's performance switches, none of which changes a bit of any result (the CPU
// backend validates them when it is made: Error(kBackend) for a chunk that is not a positive
// multiple of 64 or a schedule outside CpuSchedule). The library never reads the environment:
// the programs (the CLI, the benchmarks, the conformance suite, the Python module) fill these
// from RENAISSANCE_CPU_* through tools/program_env.h, which names each variable below.
struct CpuTuning {
  // RENAISSANCE_CPU_CHUNK: elements per block of the element-wise ops. A multiple of the
  // 64-element region padding, so blocks start on 256-byte boundaries; the CHECK_FINITE scan of
  // the arena takes 8 chunks per block. Element-wise results do not depend on it.
  uint64_t chunk_elements = 16384;
  // RENAISSANCE_CPU_SCHEDULE. Dynamic by default: on the 16-core H200 host (a shared virtual
  // machine) static runs wait for the slowest thread; bench/cpu_ab.py measured dynamic 1.02-1.15x
  // faster than static at 2 and 16 threads on resnet50, bert_base and gpt2_small (bench/JOURNAL.md).
  CpuSchedule schedule = CpuSchedule::kDynamic;
  // RENAISSANCE_CPU_PREFETCH: software prefetch this many elements ahead in the element-wise
  // updates (0: off). 256 elements (1 KiB per array) by default: on the H200 host's Xeon,
  // bench/cpu_ab.py (two calls, interleaved rounds, medians) measured it 1.01-1.08x faster than
  // no prefetch at 2 threads in 5 of 6 layout runs (bert_base once 0.99x) and 1.06-1.07x at 16
  // threads; farther distances (1024, 4096) were slower. Same bits (cpu_ab checks fingerprints).
  uint64_t prefetch_elements = 256;
  // RENAISSANCE_CPU_FIRST_TOUCH: the arena's pages are first written by the thread that will
  // update them (the ops' partition) instead of one memset.
  bool first_touch = true;
  // RENAISSANCE_CPU_HUGEPAGES: a 2 MiB-aligned arena with madvise(MADV_HUGEPAGE).
  bool huge_pages = true;
  // RENAISSANCE_CPU_AMX: Muon's exact products on the AMX tile unit where the CPU and the OS offer
  // it (off: the SIMD lanes). The same integers either way (backend_cpu/exact_matmul_amx.h).
  bool amx_tiles = true;
};

// The rules of CpuTuning's values, stated once: the CPU backend refuses anything else, and the
// programs' environment reader (tools/program_env.h) refuses it first, naming the variable.
// A chunk starts blocks on the 256-byte region alignment (64 floats).
constexpr bool cpu_chunk_is_valid(uint64_t chunk_elements) {
  return chunk_elements != 0 && chunk_elements % 64 == 0;
}

struct BackendOptions {
  int threads = 0;  // CPU: OpenMP threads (0: all cores)
  CpuTuning cpu;    // CPU: the performance switches above
  // CUDA: launch shape overrides (0: the backend's choice). Results never depend on them. A
  // kernel built for fewer threads per block clamps cuda_block (the element-wise updates: 256).
  int cuda_block = 0;
  int cuda_grid = 0;
  bool cuda_graph = true;  // capture the step into one CUDA graph
  // Muon's Newton–Schulz as cuBLASLt batches, one per shape class and scalar block (exact mode:
  // the same bits as one matrix after another; muon_mode=fast runs only so). Off: one matrix
  // after another with the library's own integer kernels, slower by 1.7-2.3x on the H200
  // (bench/RESULTS.md).
  bool cuda_muon_batches = true;
};

// One G tensor to fill: `count` elements at byte `offset` of the arena, tensor number `tensor`.
// dtype kFp32: floats; kBf16 / kFp16: each synthetic value rounded to nearest even into 2 bytes.
struct GradientTarget {
  uint64_t offset = 0;
  uint64_t count = 0;
  uint64_t tensor = 0;
  Precision dtype = Precision::kFp32;
};

// One sweep of the same-traffic reference over `count` floats: every span listed is read at
// elements [0, count); the `updates` spans are also written back (in place, bits unchanged).
struct TrafficPass {
  uint64_t count = 0;
  std::vector<uint64_t> reads;    // arena byte offsets, read only
  std::vector<uint64_t> updates;  // arena byte offsets, read and written
};

// The passes whose traffic equals one step of `kind` on `plan`, bytes_per_param(kind, check)
// (docs/design.md, "Performance model"): the non-finite check reads G; LARS's norm pass reads W
// and G of the weight group; LAMB's weight group is two passes (G, W read, M, V updated; then M,
// V read, W updated); every other update reads G and reads and writes W and the state (M, V).
inline std::vector<TrafficPass> same_traffic_passes(const MemoryPlan& plan, OptimizerKind kind, bool check_finite) {
  std::vector<TrafficPass> passes;
  for (Group group : {Group::kWeight, Group::kBiasLike}) {
    const Span g = plan.group_span(Family::kG, group);
    if (g.count == 0) continue;
    const uint64_t w = plan.group_span(Family::kW, group).offset;
    if (check_finite) passes.push_back({g.count, {g.offset}, {}});
    const NormPass norm = group == Group::kWeight ? kind_info(kind).norm : NormPass::kNone;
    if (norm == NormPass::kLarsTrustRatio) passes.push_back({g.count, {w, g.offset}, {}});
    if (norm == NormPass::kLambTrustRatio) {
      const uint64_t m = plan.group_span(Family::kM, group).offset, v = plan.group_span(Family::kV, group).offset;
      passes.push_back({g.count, {g.offset, w}, {m, v}});
      passes.push_back({g.count, {m, v}, {w}});
      continue;
    }
    TrafficPass update{g.count, {g.offset}, {w}};
    if (plan.has_family(Family::kM)) update.updates.push_back(plan.group_span(Family::kM, group).offset);
    if (plan.has_family(Family::kV)) update.updates.push_back(plan.group_span(Family::kV, group).offset);
    passes.push_back(update);
  }
  return passes;
}

// Bytes one run of `passes` moves: 4 per element read, 4 more per element written.
inline double traffic_bytes(const std::vector<TrafficPass>& passes) {
  double bytes = 0.0;
  for (const TrafficPass& p : passes) bytes += 4.0 * static_cast<double>(p.count) * static_cast<double>(p.reads.size() + 2 * p.updates.size());
  return bytes;
}

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
  // `rows` rows of row_bytes each, packed in src, to offset + r * dst_pitch: the same slots of
  // many scalar blocks in one copy (CUDA: one cudaMemcpy2DAsync). The default loops upload().
  virtual void upload_rows(uint64_t offset, uint64_t dst_pitch, const void* src, uint64_t row_bytes, uint64_t rows) {
    for (uint64_t r = 0; r < rows; ++r) upload(offset + r * dst_pitch, static_cast<const char*>(src) + r * row_bytes, row_bytes);
  }

  // Called once after compile() with the step it will run (CUDA captures its graph here).
  virtual void prepare(const CompiledStep& step) = 0;
  // Runs one whole step. Asynchronous on CUDA; download() synchronizes.
  virtual void execute(const CompiledStep& step) = 0;
  // A second step this backend may be given to execute() besides the prepared one (a tensor_mask
  // task's masked program, prepared when first needed); kept until the next prepare(). CUDA
  // captures it into a second graph; the CPU has nothing to prepare.
  virtual void prepare_alternate(const CompiledStep& step) { (void)step; }
  virtual void synchronize() = 0;

  // Writes math::synthetic_gradient(seed, step, tensor, i, amplitude) into each listed G tensor,
  // on the backend's own memory (no host copy). Used by `renaissance run` and the benchmarks.
  virtual void fill_synthetic_gradients(const std::vector<GradientTarget>& targets, uint64_t seed,
                                        uint64_t step, float amplitude) = 0;

  // The reference a memory-bound step is compared with: runs `passes` in place over
  // this backend's own arena (no extra buffers), each reading and writing back exactly what the
  // step does with trivial arithmetic that leaves every bit as it was, and returns the bytes
  // moved per second in GB/s: traffic_bytes(passes) over the fastest of `runs` timed runs (one
  // untimed run first when runs > 1), since a limit is what the memory system can do. With
  // runs = 1 a caller can interleave it with steps so both see the same neighbours. A memcpy
  // is no such reference: a regular store also reads its destination (write-allocate).
  virtual double same_traffic_gbps(const std::vector<TrafficPass>& passes, int runs) = 0;

  // Runs `count` steps and returns each one's time in milliseconds, measured where the work
  // runs. The default brackets each step with a host clock and synchronize(), where both
  // methods are one. The CUDA backend puts CUDA events around each graph launch and either
  // enqueues all `count` steps back to back with one synchronisation at the end (synced false:
  // the device's time per step), or synchronises after each step (synced true: what a loop that
  // waits for every step sees, host launch latency included).
  virtual std::vector<double> timed_steps(const CompiledStep& step, int count, bool synced = false) {
    (void)synced;
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

  // One pass of a sharded step's gradient reduction (math::RankReduce: the rank-order mean of the
  // landed blocks, or the fast path's widening / division by K) over memory of this backend: the
  // arena or a device-memory communicator's workspace (ShardedStep). Enqueued as a step is: on
  // CUDA after the work already on stream(), without a host wait; the CPU runs it at once.
  virtual void reduce_ranks(const math::RankReduce& op) = 0;

  // The CUDA stream (a cudaStream_t) every execute(), upload() and reduce_ranks() ends on: work
  // enqueued there later runs after them (a communicator enqueues its collectives there).
  // nullptr on the CPU, whose calls return when their work is done.
  virtual void* stream() { return nullptr; }

  // CUDA only (a no-op elsewhere): order each execute() after the work already queued on the
  // caller's stream `stream` (a cudaStream_t; nullptr: none), and everything queued there later
  // after the step, with events and no host synchronisation (the PyTorch adapter passes torch's
  // current stream). The step itself still runs on the backend's streams: bits are unchanged.
  virtual void set_launch_stream(void* stream) { (void)stream; }

  // Kernel launches (graph nodes) one step costs on this backend, or -1 where that is not a
  // meaningful figure (the CPU backend runs ops, not launches).
  virtual int launches_per_step() const { return -1; }
};

bool backend_available(BackendKind kind);
// Resolves kAuto to CUDA when a device is present, else the CPU.
BackendKind resolve_backend(BackendKind kind);
std::unique_ptr<Backend> create_backend(BackendKind kind, const BackendOptions& options);

}  // namespace renaissance
