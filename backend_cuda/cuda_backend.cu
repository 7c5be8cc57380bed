// The CUDA backend class: a zero-filled device arena, host<->device copies ordered on the step
// stream, the op dispatch tables (filled from the X-macro op lists, so every op needs a launch_*
// function), one stream per StreamKind joined by events, and the capture of the whole step into
// one CUDA graph at prepare(). execute() is then a single cudaGraphLaunch: nothing in a step
// waits for the host, and lr / loss scale changes are plain copies into the scalar region that
// the graph's kernels read through pointers, so the graph is never re-captured, with one exception:
// Muon's Newton–Schulz step count is the number of kernels enqueued, so a change of a block's
// ns_steps slot (seen in upload / upload_rows) makes the graphs be captured again before the next
// step.
#include "backend_cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "backend_cuda/grad_chunks.h"
#include "backend_cuda/newton_schulz.h"
#include "backend_cuda/phase_recorder.h"
#include "renaissance/error.h"
#include "renaissance/plan.h"

namespace renaissance {
namespace cuda {

namespace {

using LaunchFn = void (*)(const CudaContext&, const GraphNode&);

#define RN_CUDA_OP(name) &launch_##name,
RN_OP_TABLES(LaunchFn, RN_CUDA_OP)
#undef RN_CUDA_OP

struct DeviceProbe {
  bool available = false;
  std::string reason;
};

// Probed once: the answer cannot change while the process runs, and a failed probe must not
// leave a sticky error behind for later calls.
const DeviceProbe& probe() {
  static const DeviceProbe result = [] {
    DeviceProbe p;
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      p.reason = std::string("the CUDA runtime found no usable device: ") + cudaGetErrorName(status) + " (" +
                 cudaGetErrorString(status) + ")";
      return p;
    }
    if (count == 0) {
      p.reason = "the CUDA runtime reports 0 devices";
      return p;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      p.reason = "cannot read the properties of CUDA device 0";
      return p;
    }
    // The build embeds sm_90 code and compute_75 PTX: older devices cannot load either.
    if (prop.major * 10 + prop.minor < 75) {
      p.reason = std::string("CUDA device 0 (") + prop.name + ") has compute capability " +
                 std::to_string(prop.major) + "." + std::to_string(prop.minor) + "; 7.5 or newer is needed";
      return p;
    }
    p.available = true;
    return p;
  }();
  return result;
}

// A prepared program: its ProgramId (0: none), never its address (a step built where a destroyed
// one stood has the old address but not the old id), its node count, and its captured graph
// (null without CUDA graphs).
struct Captured {
  uint64_t id = 0;
  size_t nodes = 0;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;

  bool runs(const CompiledStep& step) const {
    return exec != nullptr && step.id.value() == id && step.node_count() == nodes;
  }
  void release() {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    *this = Captured{};
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options) : options_(options) {
    launch_.block = options.cuda_block > 0 ? options.cuda_block : kDefaultBlock;
    launch_.grid = options.cuda_grid;
    RN_CUDA_CHECK(cudaGetDevice(&device_));
    cudaDeviceProp prop{};
    RN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    launch_.sm_count = prop.multiProcessorCount;
    std::ostringstream os;
    os << "cuda (" << prop.name << ", sm_" << prop.major << prop.minor << ")";
    description_ = os.str();
    try {
      // Blocking streams (not cudaStreamNonBlocking): work a user puts on the legacy default
      // stream, e.g. a cudaMemcpy into task.grad(i), stays ordered with the step.
      for (auto& stream : streams_) RN_CUDA_CHECK(cudaStreamCreate(&stream));
      RN_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
      for (auto& event : join_) RN_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      RN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&check_scratch_), 2 * sizeof(unsigned)));
      RN_CUDA_CHECK(cudaMemset(check_scratch_, 0, 2 * sizeof(unsigned)));
      RN_CUDA_CHECK(cudaDeviceSynchronize());
    } catch (...) {
      release_all();  // a destructor does not run for a constructor that throws
      throw;
    }
  }

  ~CudaBackend() override { release_all(); }

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string describe() const override { return description_; }
  void allocate_arena(uint64_t bytes) override {
    release_graph();  // a captured graph points into the old arena
    forget_muon_host();
    if (arena_ != nullptr) {
      RN_CUDA_CHECK(cudaStreamSynchronize(origin()));
      RN_CUDA_CHECK(cudaFree(arena_));
      arena_ = nullptr;
    }
    bytes_ = bytes;
    const uint64_t rounded = (std::max<uint64_t>(bytes, 1) + kRegionAlignBytes - 1) / kRegionAlignBytes * kRegionAlignBytes;
    const cudaError_t status = cudaMalloc(reinterpret_cast<void**>(&arena_), rounded);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      arena_ = nullptr;
      throw Error(ErrorKind::kBackend, "cuda backend: cannot allocate an arena of " + std::to_string(bytes) +
                                           " bytes on " + description_ + ": " + cudaGetErrorString(status));
    }
    RN_CUDA_CHECK(cudaMemsetAsync(arena_, 0, rounded, origin()));
    RN_CUDA_CHECK(cudaStreamSynchronize(origin()));
  }

  void* arena() override { return arena_; }

  // Ordered on the step stream after every step already launched. From pageable memory the
  // runtime stages the source before returning, so the caller may reuse it at once and the
  // host does not wait for the GPU (set_lr between graph replays costs no synchronization).
  void upload(uint64_t offset, const void* src, uint64_t bytes) override {
    check_range(offset, bytes);
    if (bytes == 0) return;
    watch_ns_steps(offset, src, bytes);
    RN_CUDA_CHECK(cudaMemcpyAsync(arena_ + offset, src, bytes, cudaMemcpyHostToDevice, origin()));
  }

  void upload_rows(uint64_t offset, uint64_t dst_pitch, const void* src, uint64_t row_bytes, uint64_t rows) override {
    if (rows == 0 || row_bytes == 0) return;
    check_range(offset, (rows - 1) * dst_pitch + row_bytes);
    for (uint64_t r = 0; r < rows; ++r) {
      watch_ns_steps(offset + r * dst_pitch, static_cast<const char*>(src) + r * row_bytes, row_bytes);
    }
    RN_CUDA_CHECK(cudaMemcpy2DAsync(arena_ + offset, dst_pitch, src, row_bytes, row_bytes, rows, cudaMemcpyHostToDevice,
                                    origin()));
  }

  void download(uint64_t offset, void* dst, uint64_t bytes) override {
    check_range(offset, bytes);
    if (bytes == 0) return;
    RN_CUDA_CHECK(cudaMemcpyAsync(dst, arena_ + offset, bytes, cudaMemcpyDeviceToHost, origin()));
    RN_CUDA_CHECK(cudaStreamSynchronize(origin()));
  }

  void prepare(const CompiledStep& step) override {
    release_graph();
    forget_muon_host();  // the tables are loaded again for the new program at its capture
    prepare_program(step, &main_);
    if (!options_.cuda_graph) return;
    size_t nodes = 0;
    RN_CUDA_CHECK(cudaGraphGetNodes(main_.graph, nullptr, &nodes));
    graph_nodes_ = static_cast<int>(nodes);
  }

  // A tensor_mask task's masked program (Backend::prepare_alternate): a second graph beside the
  // prepared one, so switching programs costs no capture after the first time.
  void prepare_alternate(const CompiledStep& step) override {
    alternate_.release();
    prepare_program(step, &alternate_);
  }

  void execute(const CompiledStep& step) override {
    // A caller's stream (set_launch_stream): the step waits for what is queued there, and what
    // is queued there later waits for the step. Two events, no host wait, the same kernels.
    if (launch_stream_ != nullptr) {
      RN_CUDA_CHECK(cudaEventRecord(launch_in_, launch_stream_));
      RN_CUDA_CHECK(cudaStreamWaitEvent(origin(), launch_in_, 0));
    }
    if (ns_steps_changed_) refresh_for_ns_steps(step);
    if (main_.runs(step)) {
      RN_CUDA_CHECK(cudaGraphLaunch(main_.exec, origin()));
    } else if (alternate_.runs(step)) {
      RN_CUDA_CHECK(cudaGraphLaunch(alternate_.exec, origin()));
    } else {
      // Only a program with a Muon node needs the tables: the sharded step's reduce and gather
      // programs run between its update programs without reloading them.
      if (muon_program_ != step.id.value() && muon_node(step) != nullptr) load_muon_host(step);
      enqueue(step);
    }
    if (launch_stream_ != nullptr) {
      RN_CUDA_CHECK(cudaEventRecord(launch_out_, origin()));
      RN_CUDA_CHECK(cudaStreamWaitEvent(launch_stream_, launch_out_, 0));
    }
  }

  void set_launch_stream(void* stream) override {
    if (stream != nullptr && launch_in_ == nullptr) {
      RN_CUDA_CHECK(cudaEventCreateWithFlags(&launch_in_, cudaEventDisableTiming));
      RN_CUDA_CHECK(cudaEventCreateWithFlags(&launch_out_, cudaEventDisableTiming));
    }
    launch_stream_ = static_cast<cudaStream_t>(stream);
  }

  void synchronize() override { RN_CUDA_CHECK(cudaStreamSynchronize(origin())); }

  // CUDA events around each step on the step stream (Backend's default uses a host clock);
  // synced: wait for each step before launching the next (Backend::timed_steps).
  std::vector<double> timed_steps(const CompiledStep& step, int count, bool synced = false) override {
    std::vector<cudaEvent_t> events(2 * static_cast<size_t>(std::max(count, 0)), nullptr);
    std::vector<double> ms;
    try {
      for (auto& e : events) RN_CUDA_CHECK(cudaEventCreate(&e));
      for (int i = 0; i < count; ++i) {
        RN_CUDA_CHECK(cudaEventRecord(events[2 * i], origin()));
        execute(step);
        RN_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], origin()));
        if (synced) RN_CUDA_CHECK(cudaEventSynchronize(events[2 * i + 1]));
      }
      RN_CUDA_CHECK(cudaStreamSynchronize(origin()));
      for (int i = 0; i < count; ++i) {
        float t = 0.0f;
        RN_CUDA_CHECK(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]));
        ms.push_back(t);
      }
    } catch (...) {
      for (auto e : events) {
        if (e != nullptr) (void)cudaEventDestroy(e);
      }
      throw;
    }
    for (auto e : events) RN_CUDA_CHECK(cudaEventDestroy(e));
    return ms;
  }

  // Nodes of the captured graph (one kernel per node), or -1 without a graph.
  int launches_per_step() const override { return main_.exec != nullptr ? graph_nodes_ : -1; }

  void fill_synthetic_gradients(const std::vector<GradientTarget>& targets, uint64_t seed, uint64_t step,
                                float amplitude) override {
    for (const GradientTarget& t : targets) {
      if (t.dtype != Precision::kFp32) {
        check_range(t.offset, t.count * precision_bytes(t.dtype));
        launch_synthetic_gradient_half(arena_ + t.offset, t.count, seed, step, t.tensor, amplitude, t.dtype, launch_,
                                       origin());
        continue;
      }
      check_range(t.offset, t.count * sizeof(float));
      launch_synthetic_gradient(reinterpret_cast<float*>(arena_ + t.offset), t.count, seed, step, t.tensor,
                                amplitude, launch_, origin());
    }
  }

  // The same-traffic reference over this arena on the step stream, with the step's launch
  // shape, its passes captured in one CUDA graph as a step is (no launch gaps between them):
  // CUDA events around each graph launch (Backend::same_traffic_gbps).
  double same_traffic_gbps(const std::vector<TrafficPass>& passes, int runs) override {
    for (const TrafficPass& p : passes) {
      for (uint64_t off : p.reads) check_range(off, p.count * sizeof(float));
      for (uint64_t off : p.updates) check_range(off, p.count * sizeof(float));
    }
    static volatile uint32_t key = 0;  // 0, but the compiler cannot know: the loads stay
    uint32_t* sink = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    auto release = [&] {
      if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      if (sink != nullptr) (void)cudaFree(sink);
      if (start != nullptr) (void)cudaEventDestroy(start);
      if (stop != nullptr) (void)cudaEventDestroy(stop);
    };
    std::vector<float> ms;
    try {
      RN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&sink), sizeof(uint32_t)));
      RN_CUDA_CHECK(cudaEventCreate(&start));
      RN_CUDA_CHECK(cudaEventCreate(&stop));
      RN_CUDA_CHECK(cudaStreamBeginCapture(origin(), cudaStreamCaptureModeThreadLocal));
      try {
        for (const TrafficPass& p : passes) launch_same_traffic(arena_, p, key, sink, launch_, origin());
      } catch (...) {
        // End the broken capture so the stream is usable again (as prepare() does).
        if (cudaStreamEndCapture(origin(), &graph) != cudaSuccess) graph = nullptr;
        (void)cudaGetLastError();
        throw;
      }
      RN_CUDA_CHECK(cudaStreamEndCapture(origin(), &graph));
      RN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      // As prepare() does for the step: else the first launch also uploads the graph, and a
      // single run (runs = 1, between the CLI's steps) would time that too.
      RN_CUDA_CHECK(cudaGraphUpload(exec, origin()));
      const int warmup = runs > 1 ? 1 : 0;
      for (int rep = 0; rep < warmup + std::max(runs, 1); ++rep) {
        RN_CUDA_CHECK(cudaEventRecord(start, origin()));
        RN_CUDA_CHECK(cudaGraphLaunch(exec, origin()));
        RN_CUDA_CHECK(cudaEventRecord(stop, origin()));
        RN_CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0.0f;
        RN_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        if (rep >= warmup) ms.push_back(t);  // a first run warms up clocks and the TLB
      }
    } catch (...) {
      release();
      throw;
    }
    release();
    return traffic_bytes(passes) / (static_cast<double>(*std::min_element(ms.begin(), ms.end())) * 1e-3) / 1e9;
  }

  // On the step stream (every execute() joins its streams there), no host wait.
  void reduce_ranks(const math::RankReduce& op) override {
    if (op.count == 0) return;
    launch_rank_reduce(op, launch_, origin());
  }
  void* stream() override { return origin(); }

  cudaStream_t origin() const { return streams_[static_cast<int>(StreamKind::kUpdate)]; }

  // cuda::phase_times (cuda_backend.h).
  std::vector<PhaseTime> profile_phases(const CompiledStep& step, int count, double hold_ms) {
    if (count < 1) throw_invalid("phase_times: count must be >= 1, got " + std::to_string(count));
    if (!(hold_ms >= 0.0 && hold_ms <= 10000.0)) {
      throw_invalid("phase_times: hold_ms must be in [0, 10000], got " + std::to_string(hold_ms));
    }
    if (ns_steps_changed_) refresh_for_ns_steps(step);
    if (muon_program_ != step.id.value() && muon_node(step) != nullptr) load_muon_host(step);
    PhaseRecorder recorder(origin());
    for (int rep = 0; rep < count; ++rep) {
      launch_hold(origin(), hold_ms);
      enqueue(step, &recorder);
      recorder.end_step();
    }
    return recorder.medians();
  }

 private:
  void check_range(uint64_t offset, uint64_t bytes) const {
    if (offset > bytes_ || bytes > bytes_ - offset) {
      throw Error(ErrorKind::kBackend, "cuda backend: copy of " + std::to_string(bytes) + " bytes at offset " +
                                           std::to_string(offset) + " is outside the arena");
    }
  }

  // No throwing here: release what exists and ignore failures (the context may be gone).
  void release_all() noexcept {
    release_graph();
    if (arena_ != nullptr) (void)cudaFree(arena_);
    if (check_scratch_ != nullptr) (void)cudaFree(check_scratch_);
    if (muon_host_.scratch != nullptr) (void)cudaFree(muon_host_.scratch);
    if (fork_ != nullptr) (void)cudaEventDestroy(fork_);
    if (launch_in_ != nullptr) (void)cudaEventDestroy(launch_in_);
    if (launch_out_ != nullptr) (void)cudaEventDestroy(launch_out_);
    for (auto event : join_) {
      if (event != nullptr) (void)cudaEventDestroy(event);
    }
    for (auto stream : streams_) {
      if (stream != nullptr) (void)cudaStreamDestroy(stream);
    }
  }

  // The step's first node that `is` accepts, or nullptr.
  template <class Pred>
  static const GraphNode* first_node(const CompiledStep& step, Pred is) {
    for (const auto& graph : step.graphs) {
      for (const GraphNode& node : graph) {
        if (is(node)) return &node;
      }
    }
    return nullptr;
  }
  // The step's MUON_ORTHOGONALIZE node, or nullptr.
  static const GraphNode* muon_node(const CompiledStep& step) {
    return first_node(step, [](const GraphNode& n) {
      return n.kind == NodeKind::kCompute && n.compute_op == ComputeOp::MUON_ORTHOGONALIZE;
    });
  }
  // The step's UPDATE_MUON node, or nullptr.
  static const GraphNode* update_muon_node(const CompiledStep& step) {
    return first_node(step, [](const GraphNode& n) {
      return n.kind == NodeKind::kRange && n.range_op == RangeOp::UPDATE_MUON;
    });
  }

  // Copies what MUON_ORTHOGONALIZE's launches are sized by from the arena (after every copy
  // queued before): the matrix table, each tensor's scalar block, each block's ns_steps; and
  // allocates a Newton–Schulz scratch when the plan's is smaller than the device needs. Records
  // where the ns_steps slots are, for watch_ns_steps.
  void load_muon_host(const CompiledStep& step) {
    muon_program_ = step.id.value();
    ns_steps_changed_ = false;
    ns_steps_watch_.clear();
    const GraphNode* node = muon_node(step);
    MuonHost& h = muon_host_;
    h.matrices.clear();
    h.blocks.clear();
    h.steps.clear();
    h.classes.clear();
    h.update_fused = false;
    h.matrices_offset = 0;
    if (node == nullptr) return;
    h.matrices_offset = node->muon.matrices.offset;
    h.matrices.resize(node->muon.matrices.count);
    if (!h.matrices.empty()) download(node->muon.matrices.offset, h.matrices.data(), h.matrices.size() * sizeof(MuonMatrix));
    h.blocks.resize(node->work.tensor_blocks.count);
    if (!h.blocks.empty()) download(node->work.tensor_blocks.offset, h.blocks.data(), h.blocks.size() * sizeof(int32_t));
    int32_t num_blocks = 1;
    for (int32_t b : h.blocks) num_blocks = std::max(num_blocks, b + 1);
    for (int32_t b = 0; b < num_blocks; ++b) {
      const uint64_t at = step.scalars_f32.offset + (static_cast<uint64_t>(b) * kNumScalarF32 + kNsSteps) * sizeof(float);
      float value = 0.0f;
      download(at, &value, sizeof(value));
      if (!(value >= 1.0f && value <= 100.0f) || value != static_cast<float>(static_cast<int>(value))) {
        throw Error(ErrorKind::kBackend, "cuda backend: ns_steps of scalar block " + std::to_string(b) + " is " +
                                             std::to_string(value) + ", not a whole number in [1, 100]");
      }
      h.steps.push_back(static_cast<int>(value));
      ns_steps_watch_.push_back({at, value});
    }
    // The shape classes: (min side, max side, block), in the order of each class's first matrix.
    const NewtonSchulzMode mode = node->muon.mode == 1 ? NewtonSchulzMode::kFast : NewtonSchulzMode::kExact;
    std::vector<std::pair<std::array<int64_t, 3>, std::vector<NewtonSchulzEntry>>> groups;
    for (size_t t = 0; t < h.matrices.size(); ++t) {
      const MuonMatrix& m = h.matrices[t];
      if (m.rows <= 0 || m.cols <= 0) continue;
      const std::array<int64_t, 3> key{std::min(m.rows, m.cols), std::max(m.rows, m.cols),
                                       h.blocks.empty() ? 0 : h.blocks[t]};
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
      if (it == groups.end()) it = groups.insert(groups.end(), {key, {}});
      it->second.push_back({m.start, m.rows > m.cols ? 1 : 0, static_cast<int32_t>(t)});
    }
    h.classes.clear();
    size_t need = 0;
    for (auto& g : groups) {
      MuonClass cls;
      cls.block = static_cast<int32_t>(g.first[2]);
      cls.steps = h.steps[static_cast<size_t>(cls.block)];
      cls.batch = std::make_unique<NewtonSchulzBatch>(static_cast<size_t>(g.first[0]), static_cast<size_t>(g.first[1]),
                                                      std::move(g.second), mode, options_.cuda_muon_batches);
      need = std::max(need, cls.batch->scratch_bytes());
      h.classes.push_back(std::move(cls));
    }
    const GraphNode* update = update_muon_node(step);
    h.update_fused = update != nullptr && !h.classes.empty() &&
                     std::all_of(h.classes.begin(), h.classes.end(), [](const MuonClass& c) { return c.batch->batched(); });
    if (h.update_fused) h.update = *update;
    if (need > node->muon.scratch.count * sizeof(float) && need > h.scratch_bytes) {
      if (h.scratch != nullptr) RN_CUDA_CHECK(cudaFree(h.scratch));
      h.scratch = nullptr;
      h.scratch_bytes = 0;
      RN_CUDA_CHECK(cudaMalloc(&h.scratch, need));
      h.scratch_bytes = need;
    }
  }

  // Until the next load: no host tables are current and no slot is watched.
  void forget_muon_host() {
    muon_program_ = 0;
    ns_steps_watch_.clear();
    ns_steps_changed_ = false;
  }

  // A host copy into the arena that gives an ns_steps slot another value than the one the
  // enqueued launches were made for: the graphs are captured again before the next step.
  void watch_ns_steps(uint64_t offset, const void* src, uint64_t bytes) {
    for (const auto& w : ns_steps_watch_) {
      if (w.first < offset || w.first + sizeof(float) > offset + bytes) continue;
      float value;
      std::memcpy(&value, static_cast<const char*>(src) + (w.first - offset), sizeof(value));
      if (value != w.second) ns_steps_changed_ = true;
    }
  }

  // An ns_steps slot changed: the host tables are loaded again, and with CUDA graphs the program
  // being run is captured again (its launches were made for the old counts). The other captured
  // program is dropped: it runs enqueued until its owner prepares it again.
  void refresh_for_ns_steps(const CompiledStep& step) {
    forget_muon_host();
    if (!options_.cuda_graph) return;
    if (main_.runs(step)) {
      prepare(step);
    } else if (alternate_.runs(step)) {
      main_.release();
      graph_nodes_ = 0;
      alternate_.release();
      prepare_alternate(step);
    }
  }

  // Both programs' graphs (the alternate is kept only until the next prepare()).
  void release_graph() {
    main_.release();
    graph_nodes_ = 0;
    alternate_.release();
  }

  // Makes `step` the program `into` names by its ProgramId (with its node count, which execute
  // checks) and, with CUDA graphs on, captures it into into->graph / exec; a failed capture
  // leaves no program prepared.
  void prepare_program(const CompiledStep& step, Captured* into) {
    into->id = step.id.value();
    into->nodes = step.node_count();
    if (!options_.cuda_graph) return;
    try {
      capture(step, &into->graph, &into->exec);
    } catch (...) {
      into->id = 0;
      throw;
    }
  }

  // Captures every node of `step` into *graph, instantiated and uploaded into *exec.
  void capture(const CompiledStep& step, cudaGraph_t* graph, cudaGraphExec_t* exec) {
    if (muon_node(step) != nullptr) load_muon_host(step);  // reads the device: not once the capture has begun
    RN_CUDA_CHECK(cudaStreamBeginCapture(origin(), cudaStreamCaptureModeThreadLocal));
    try {
      enqueue(step);
    } catch (...) {
      // End the broken capture so the stream is usable again, then report the first error.
      cudaGraph_t broken = nullptr;
      if (cudaStreamEndCapture(origin(), &broken) == cudaSuccess && broken != nullptr) (void)cudaGraphDestroy(broken);
      (void)cudaGetLastError();
      throw;
    }
    RN_CUDA_CHECK(cudaStreamEndCapture(origin(), graph));
    RN_CUDA_CHECK(cudaGraphInstantiate(exec, *graph, 0));
    RN_CUDA_CHECK(cudaGraphUpload(*exec, origin()));
  }

  // Enqueues every node of the step. The named graphs run one after another; inside one, nodes
  // on the same StreamKind run in order and nodes on different kinds (the two update groups,
  // which touch disjoint memory) run concurrently: each graph forks the streams it uses from
  // the origin stream and joins them back, which capture turns into graph dependencies. With
  // `profile` (phase_times, never during a capture) every node runs on the origin stream, in
  // order, each after a mark.
  void enqueue(const CompiledStep& step, PhaseRecorder* profile = nullptr) {
    if (arena_ == nullptr) throw Error(ErrorKind::kBackend, "cuda backend: execute() before allocate_arena()");
    CudaContext ctx;
    ctx.arena = arena_;
    ctx.launch = launch_;
    ctx.check_scratch = check_scratch_;
    ctx.muon = &muon_host_;
    ctx.scalars = step.scalars_in(arena_);
    ctx.phases = profile;
    // With a gradient table: this step's chunk addresses first (grad_chunks.cu), one launch on the
    // origin stream, which every graph below forks from.
    if (profile != nullptr) profile->mark("gradient chunk table");
    launch_grad_chunks(arena_, grad_chunk_jobs(step), launch_, origin());
    for (const auto& graph : step.graphs) {
      if (profile != nullptr) {
        ctx.stream = origin();
        for (const GraphNode& node : graph) {
          profile->mark(phase_label(node));
          run_node(ctx, node);
        }
        continue;
      }
      bool used[kNumStreamKinds] = {};
      for (const GraphNode& node : graph) used[static_cast<int>(node.stream)] = true;
      bool forked = false;
      for (int s = 1; s < kNumStreamKinds; ++s) {
        if (!used[s]) continue;
        if (!forked) RN_CUDA_CHECK(cudaEventRecord(fork_, origin()));
        forked = true;
        RN_CUDA_CHECK(cudaStreamWaitEvent(streams_[s], fork_, 0));
      }
      for (const GraphNode& node : graph) {
        ctx.stream = streams_[static_cast<int>(node.stream)];
        run_node(ctx, node);
      }
      for (int s = 1; s < kNumStreamKinds; ++s) {
        if (!used[s]) continue;
        RN_CUDA_CHECK(cudaEventRecord(join_[s], streams_[s]));
        RN_CUDA_CHECK(cudaStreamWaitEvent(origin(), join_[s], 0));
      }
    }
  }

  BackendOptions options_;
  LaunchConfig launch_;
  int device_ = 0;
  std::string description_;
  char* arena_ = nullptr;
  uint64_t bytes_ = 0;
  unsigned* check_scratch_ = nullptr;
  cudaStream_t streams_[kNumStreamKinds] = {};
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_[kNumStreamKinds] = {};
  cudaStream_t launch_stream_ = nullptr;  // set_launch_stream: the caller's, not owned
  cudaEvent_t launch_in_ = nullptr;
  cudaEvent_t launch_out_ = nullptr;
  // The prepared program and prepare_alternate's (released by prepare()), with their graphs.
  Captured main_, alternate_;
  int graph_nodes_ = 0;  // nodes of main_'s graph (launches_per_step)
  // Muon: the host tables of the program they were loaded for (its ProgramId; 0: none), the
  // ns_steps slots they were made with (arena offset, value), and whether an upload has changed
  // one since.
  MuonHost muon_host_;
  uint64_t muon_program_ = 0;
  std::vector<std::pair<uint64_t, float>> ns_steps_watch_;
  bool ns_steps_changed_ = false;
};

}  // namespace

bool device_available() { return probe().available; }

std::vector<PhaseTime> phase_times(Backend& backend, const CompiledStep& step, int count, double hold_ms) {
  CudaBackend* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) throw_invalid("phase_times needs the CUDA backend, got " + backend.describe());
  return cuda->profile_phases(step, count, hold_ms);
}

std::string unavailable_reason() { return probe().reason; }

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  if (options.cuda_block != 0 && (options.cuda_block < 32 || options.cuda_block > 1024 || options.cuda_block % 32 != 0)) {
    throw_invalid("cuda_block must be 0 (the backend's choice) or a multiple of 32 in [32, 1024], got " +
                  std::to_string(options.cuda_block));
  }
  if (options.cuda_grid < 0) {
    throw_invalid("cuda_grid must be >= 0 (0: the backend's choice), got " + std::to_string(options.cuda_grid));
  }
  if (!device_available()) throw Error(ErrorKind::kBackend, "backend cuda is not available: " + unavailable_reason());
  return std::make_unique<CudaBackend>(options);
}

}  // namespace cuda
}  // namespace renaissance
