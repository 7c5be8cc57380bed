// The CUDA backend against the CPU backend, bit for bit (docs/reproducibility.md): every optimizer kind on
// odd sizes (zero-size tensors included), hundreds of tiny tensors, the resnet50 layout and one
// tensor of more than 2^31 elements; launch shapes that must not change a bit; graph replay with
// lr / loss-scale changes and injected NaN/Inf against direct execution; synthetic gradients.
// Everything goes through the Task API. Without a CUDA device every test skips with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "renaissance/backend.h"
#include "renaissance/error.h"
#include "renaissance/graph.h"
#include "renaissance/math/synthetic_gradient.h"
#include "renaissance/task.h"
#include "support/test_util.h"
#include "cuda/cuda_scenario.h"
#if RENAISSANCE_WITH_CUDA
#include "backend_cuda/cuda_backend.h"
#endif

namespace renaissance {
namespace {

using namespace cuda_scenario;
using testing_util::same_bits;

// ---- configurations: every kind, weight decay on, both SGD weight-decay modes ----

struct NamedConfig {
  std::string name;
  OptimizerConfig config;
};

// Every kind of the kind table with its reference hyperparameters, the L2 mode where the kind
// has one, and clipping (active: the tests' gradients have norms far above 0.01) on the two kinds
// whose norm passes read the clipped gradient.
std::vector<NamedConfig> all_configs() {
  std::vector<NamedConfig> configs;
  for (const KindInfo& info : kKindTable) {
    OptimizerConfig c = reference_config(info.kind);
    configs.push_back({info.name, c});
    if (info.allows_l2) {
      c.weight_decay_mode = WeightDecayMode::kL2;
      configs.push_back({std::string(info.name) + "_l2", c});
    }
  }
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb, OptimizerKind::kAdamW}) {
    OptimizerConfig c = reference_config(kind);
    c.max_grad_norm = 0.01;
    configs.push_back({std::string(optimizer_kind_name(kind)) + "_clip", c});
  }
  return configs;
}

// ---- parameter sets ----

std::vector<ParamSpec> tiny_params(int count) {
  std::vector<ParamSpec> params;
  for (int i = 0; i < count; ++i) {
    const int64_t n = (i * 7) % 37;  // 0..36 elements, zero-size ones included
    params.push_back({"t" + std::to_string(i), {n}, static_cast<Role>(i % kNumRoles)});
  }
  return params;
}

std::vector<ParamSpec> load_layout(const std::string& name) {
  const std::string path = testing_util::source_dir() + "/data/layouts/" + name + ".json";
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::kIo, "cannot open " + path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<ParamSpec> params;
  for (const auto& p : doc.at("params")) {
    ParamSpec spec;
    spec.name = p.at("name").get<std::string>();
    spec.shape = p.at("shape").get<std::vector<int64_t>>();
    const std::string role = p.at("role").get<std::string>();
    if (!parse_role(role.c_str(), &spec.role)) throw Error(ErrorKind::kFormat, "unknown role " + role);
    params.push_back(spec);
  }
  return params;
}

// lr and loss scale change between steps; step 2 has a NaN and step 4 an Inf in one gradient.
StepHook schedule_hook() {
  return [](Task& task, int step) {
    if (step == 1) task.set_lr(task.lr() * 0.5);
    if (step == 2 || step == 4) {
      // Poison one element of the last non-empty tensor (so the check must scan to the end).
      for (size_t id = task.num_params(); id-- > 0;) {
        const int64_t n = task.param(id).numel();
        if (n == 0) continue;
        const float bad = step == 2 ? std::numeric_limits<float>::quiet_NaN() : -std::numeric_limits<float>::infinity();
        task.backend().upload(task.plan().tensor_offset(Family::kG, id) + static_cast<uint64_t>(n - 1) * sizeof(float),
                              &bad, sizeof(bad));
        break;
      }
    }
    if (step == 3) task.set_loss_scale(256.0);
    if (step == 5) task.set_lr(task.lr() * 3.0);
  };
}

// ---- tests ----

TEST(CudaBackend, AvailabilityIsReportedWithAReason) {
#if RENAISSANCE_WITH_CUDA
  if (!backend_available(BackendKind::kCuda)) {
    EXPECT_FALSE(cuda::unavailable_reason().empty());
    EXPECT_THROW(create_backend(BackendKind::kCuda, {}), Error);
    GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  }
  EXPECT_TRUE(cuda::unavailable_reason().empty());
  auto backend = create_backend(BackendKind::kCuda, {});
  EXPECT_EQ(backend->describe().rfind("cuda (", 0), 0u) << backend->describe();
  EXPECT_EQ(resolve_backend(BackendKind::kAuto), BackendKind::kCuda);
#else
  EXPECT_FALSE(backend_available(BackendKind::kCuda));
  GTEST_SKIP() << "this build has no CUDA backend";
#endif
}

TEST(CudaBackend, RejectsBadLaunchShapes) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  BackendOptions options;
  options.cuda_block = 100;
  EXPECT_THROW(create_backend(BackendKind::kCuda, options), Error);
  options.cuda_block = 0;
  options.cuda_grid = -1;
  EXPECT_THROW(create_backend(BackendKind::kCuda, options), Error);
}

TEST(CudaBackend, UploadDownloadRoundTripAndZeroArena) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  auto backend = create_backend(BackendKind::kCuda, {});
  backend->allocate_arena(4096 + 12);
  std::vector<uint8_t> zeros(4108, 0xff);
  backend->download(0, zeros.data(), zeros.size());
  for (uint8_t b : zeros) ASSERT_EQ(b, 0);
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 37 + 1);
  backend->upload(1001, data.data(), data.size());
  std::vector<uint8_t> back(data.size());
  backend->download(1001, back.data(), back.size());
  EXPECT_EQ(data, back);
  EXPECT_THROW(backend->upload(4100, data.data(), 100), Error);
  // A 1 KiB pass takes about a launch's time, so its rate says nothing about the memory system:
  // only that the measurement runs and yields a positive, finite rate.
  const double rate = backend->same_traffic_gbps({TrafficPass{256, {0}, {1024}}}, 3);
  EXPECT_TRUE(std::isfinite(rate) && rate > 0.0) << rate;
}

TEST(CudaBackend, SyntheticGradientsMatchCpu) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  auto params = odd_params();
  params.push_back({"big", {1 << 20}, Role::kDeepConv});
  std::vector<std::vector<float>> grads[2];
  int b = 0;
  for (BackendKind kind : {BackendKind::kCpu, BackendKind::kCuda}) {
    Task task(params, backend_task_options(kind));
    task.optimizer(reference_config(OptimizerKind::kAdamW));
    task.compile();
    task.synthesize_gradients(77, 5, 3.5f);
    for (size_t id = 0; id < task.num_params(); ++id) {
      std::vector<float> g(static_cast<size_t>(task.param(id).numel()));
      task.read(Family::kG, id, g.data());
      grads[b].push_back(g);
    }
    ++b;
  }
  for (size_t id = 0; id < params.size(); ++id) {
    EXPECT_TRUE(same_bits(grads[0][id], grads[1][id])) << params[id].name;
    std::vector<float> host(grads[0][id].size());
    for (size_t i = 0; i < host.size(); ++i) host[i] = math::synthetic_gradient(77, 5, id, i, 3.5f);
    EXPECT_TRUE(same_bits(grads[0][id], host)) << params[id].name;
  }
}

class CudaMatchesCpu : public ::testing::TestWithParam<NamedConfig> {};

TEST_P(CudaMatchesCpu, OddSizesWithScheduleAndNonFiniteSteps) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  Scenario sc;
  sc.params = odd_params();
  sc.config = GetParam().config;
  sc.steps = 7;
  sc.hook = schedule_hook();
  const Snapshot cpu = run(BackendKind::kCpu, sc);
  const Snapshot gpu = run(BackendKind::kCuda, sc);
  EXPECT_EQ(cpu.steps, 5);
  EXPECT_EQ(cpu.skipped, 2);
  expect_same(cpu, gpu);
}

TEST_P(CudaMatchesCpu, HundredsOfTinyTensors) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  Scenario sc;
  sc.params = tiny_params(400);
  sc.config = GetParam().config;
  sc.steps = 3;
  sc.loss_scale = 8.0;
  expect_same(run(BackendKind::kCpu, sc), run(BackendKind::kCuda, sc));
}

TEST_P(CudaMatchesCpu, WithoutTheNonFiniteCheck) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  Scenario sc;
  sc.params = odd_params();
  sc.config = GetParam().config;
  sc.check_finite = false;
  sc.steps = 2;
  expect_same(run(BackendKind::kCpu, sc), run(BackendKind::kCuda, sc));
}

TEST_P(CudaMatchesCpu, Resnet50Layout) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  Scenario sc;
  sc.params = load_layout("resnet50");
  sc.config = GetParam().config;
  sc.steps = 2;
  sc.loss_scale = 65536.0;
  expect_same(run(BackendKind::kCpu, sc), run(BackendKind::kCuda, sc));
}

INSTANTIATE_TEST_SUITE_P(AllKinds, CudaMatchesCpu, ::testing::ValuesIn(all_configs()),
                         [](const ::testing::TestParamInfo<NamedConfig>& info) { return info.param.name; });

// Results never depend on the launch shape: tiny blocks, a grid of one block, odd grids.
TEST(CudaBackend, LaunchShapesGiveTheSameBits) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  auto params = odd_params();
  params.push_back({"wide", {3, 100003}, Role::kDeepConv});
  params.push_back({"wide_bias", {70001}, Role::kBnBias});
  const std::pair<int, int> shapes[] = {{32, 1}, {64, 3}, {1024, 0}, {96, 7}, {512, 1000}};
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgdNesterov, OptimizerKind::kLars,
                             OptimizerKind::kLarsNesterov, OptimizerKind::kLion, OptimizerKind::kLamb}) {
    SCOPED_TRACE(optimizer_kind_name(kind));
    Scenario sc;
    sc.params = params;
    sc.config = reference_config(kind);
    sc.config.max_grad_norm = kind == OptimizerKind::kLamb ? 0.01 : 0.0;  // the clip kernels too
    sc.steps = 3;
    sc.hook = [](Task& task, int step) {
      if (step == 1) task.set_loss_scale(4096.0);
    };
    const Snapshot reference = run(BackendKind::kCuda, sc);
    expect_same(run(BackendKind::kCpu, sc), reference);
    for (const auto& shape : shapes) {
      SCOPED_TRACE("block " + std::to_string(shape.first) + " grid " + std::to_string(shape.second));
      BackendOptions options;
      options.cuda_block = shape.first;
      options.cuda_grid = shape.second;
      expect_same(reference, run(BackendKind::kCuda, sc, options));
    }
  }
}

// Graph replay (lr and loss scale changed between replays, NaN and Inf injected) equals the same
// sequence run node by node without a graph, after every step.
TEST(CudaBackend, GraphReplayEqualsDirectExecution) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kAdam, OptimizerKind::kSgdMomentum,
                             OptimizerKind::kLars}) {
    SCOPED_TRACE(optimizer_kind_name(kind));
    auto params = odd_params();
    params.push_back({"wide", {257, 1001}, Role::kFcWeight});
    std::vector<Snapshot> per_step[2];
    for (int graph = 0; graph < 2; ++graph) {
      TaskOptions options;
      options.backend = BackendKind::kCuda;
      options.backend_options.cuda_graph = graph == 1;
      Task task(params, options);
      task.optimizer(reference_config(kind));
      task.set_loss_scale(1024.0);
      task.compile();
      init_weights(task);
      const StepHook hook = schedule_hook();
      for (int step = 0; step < 7; ++step) {
        task.synthesize_gradients(31, static_cast<uint64_t>(step), static_cast<float>(0.05 * task.loss_scale()));
        hook(task, step);
        task.step();
        per_step[graph].push_back(snapshot(task));
        EXPECT_EQ(task.last_step_skipped(), step == 2 || step == 4) << "step " << step;
      }
    }
    for (size_t s = 0; s < per_step[0].size(); ++s) {
      SCOPED_TRACE("after step " + std::to_string(s));
      expect_same(per_step[0][s], per_step[1][s]);
    }
    EXPECT_EQ(per_step[1].back().steps, 5);
    EXPECT_EQ(per_step[1].back().skipped, 2);
  }
}

// AdamW with its reference hyperparameters, compiled, with weights and one set of gradients.
void start_adamw(Task& task) {
  task.optimizer(reference_config(OptimizerKind::kAdamW));
  task.compile();
  init_weights(task);
  task.synthesize_gradients(5, 0, 0.1f);
}

// Steps launched back to back, with host-side set_lr in between and no synchronization, give
// the same result as the CPU: the copies are ordered with the replays on the device.
TEST(CudaBackend, BackToBackReplaysWithLrChanges) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  Snapshot result[2];
  int b = 0;
  for (BackendKind kind : {BackendKind::kCpu, BackendKind::kCuda}) {
    Task task(odd_params(), backend_task_options(kind));
    start_adamw(task);
    for (int step = 0; step < 20; ++step) {
      task.set_lr(1e-3 * (1.0 + step));
      task.set_loss_scale(step % 2 == 0 ? 1.0 : 2.0);
      task.step();
    }
    result[b++] = snapshot(task);
  }
  expect_same(result[0], result[1]);
}

// The captured step has the same number of nodes for 13, 400 and resnet50's 161 tensors. With a
// gradient table exactly one more: the kernel that fills the chunk addresses (grad_chunks.cu).
// Muon is left out: its Newton–Schulz is launched per matrix (MuonLaunchesGrowWithTheMatrices in
// test_cuda_muon.cc).
TEST(CudaBackend, LaunchCountDoesNotGrowWithTensorCount) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  for (const NamedConfig& nc : all_configs()) {
    if (nc.config.kind == OptimizerKind::kMuon) continue;
    SCOPED_TRACE(nc.name);
    std::vector<int> launches[2];
    for (bool table : {false, true}) {
      for (const auto& params : {odd_params(), tiny_params(400), load_layout("resnet50")}) {
        TaskOptions options;
        options.backend = BackendKind::kCuda;
        options.gradient_table = table;
        Task task(params, options);
        task.optimizer(nc.config);
        task.compile();
        launches[table].push_back(task.backend().launches_per_step());
      }
    }
    EXPECT_GT(launches[0][0], 0);
    EXPECT_LE(launches[0][0], 6);
    for (bool table : {false, true}) {
      EXPECT_EQ(launches[table][0], launches[table][1]) << "table " << table;
      EXPECT_EQ(launches[table][0], launches[table][2]) << "table " << table;
    }
    EXPECT_EQ(launches[1][0], launches[0][0] + 1);
  }
}

// The update kernels exist only for the (G encoding, copy format, rounding) combinations a step
// can have (backend_cuda/access.cuh): a node made by hand with another one (fp16 gradients beside
// a bf16 copy) is refused with an Error when it is enqueued, and nothing is launched for it.
TEST(CudaBackend, RefusesAnAccessCombinationOutsideItsTable) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  PlanConfig plan_config = plan_config_from_optimizer(OptimizerKind::kAdamW);
  plan_config.precision = Precision::kBf16;
  plan_config.model_dtype_gradients = true;
  const MemoryPlan plan(odd_params(), plan_config);
  PrecisionOptions precision{Precision::kBf16, Rounding::kNearest, 0};
  precision.model_dtype_gradients = true;
  CompiledStep step = compile_step(plan, default_config(OptimizerKind::kAdamW), true, precision);
  BackendOptions options;
  options.cuda_graph = false;
  auto backend = create_backend(BackendKind::kCuda, options);
  backend->allocate_arena(plan.arena_bytes());
  backend->prepare(step);
  backend->execute(step);  // the step as compiled runs
  backend->synchronize();
  for (GraphNode& node : step.graphs[static_cast<int>(GraphId::kOptimizer)]) node.grad.encoding = Precision::kFp16;
  backend->prepare(step);
  try {
    backend->execute(step);
    FAIL() << "an fp16-gradient node with a bf16 copy was launched";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("not a combination a step can have"), std::string::npos) << e.what();
  }
  backend->synchronize();
}

// One tensor of more than 2^31 elements: every index of every kernel must be 64-bit.
TEST(CudaBackend, TensorOfMoreThan2To31Elements) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  const int64_t huge = (int64_t{1} << 31) + 4099;
  const std::vector<ParamSpec> params = {
      {"small", {1000}, Role::kDeepConv}, {"bias", {33}, Role::kBnBias}, {"huge", {huge}, Role::kFcWeight}};
  std::vector<float> w[2];
  int64_t skipped[2] = {0, 0};
  int b = 0;
  for (BackendKind kind : {BackendKind::kCpu, BackendKind::kCuda}) {
    Task task(params, backend_task_options(kind));
    task.optimizer(reference_config(OptimizerKind::kSgd));
    try {
      task.compile();
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kBackend) GTEST_SKIP() << "not enough memory for the test: " << e.what();
      throw;
    }
    const size_t id = task.find("huge");
    const uint64_t last = task.plan().tensor_offset(Family::kG, id) + static_cast<uint64_t>(huge - 1) * sizeof(float);
    for (int step = 0; step < 3; ++step) {
      task.synthesize_gradients(8, static_cast<uint64_t>(step), 1.0f);
      if (step == 1) {
        // Only the very last element is bad: a 32-bit index would never reach it.
        const float nan = std::numeric_limits<float>::quiet_NaN();
        task.backend().upload(last, &nan, sizeof(nan));
      }
      task.step();
    }
    skipped[b] = task.skipped_steps();
    w[b].resize(static_cast<size_t>(huge));
    task.read(Family::kW, id, w[b].data());
    ++b;
  }
  EXPECT_EQ(skipped[0], 1);
  EXPECT_EQ(skipped[1], 1);
  EXPECT_TRUE(same_bits(w[0], w[1]));
  // The elements past 2^31 were updated (w starts at 0, so they cannot all still be zero).
  size_t nonzero_tail = 0;
  for (size_t i = size_t{1} << 31; i < w[1].size(); ++i) nonzero_tail += w[1][i] != 0.0f;
  EXPECT_GT(nonzero_tail, 4000u);
}

// A program built where a prepared one was destroyed (the same address, the same node count)
// runs itself, not the graph captured for the one before: the backend keys its graphs by
// ProgramId. Adam after AdamW in one std::optional's storage, on the CPU (which keeps nothing per
// program) and on CUDA with graphs on; AdamW twice on the CPU shows the two programs differ.
TEST(CudaBackend, NewProgramAtAPreparedProgramsAddressGetsItsOwnGraph) {
  const auto run_two = [](BackendKind kind, OptimizerKind second) {
    Task task(odd_params(), backend_task_options(kind));
    start_adamw(task);
    std::optional<CompiledStep> program;
    program.emplace(compile_step(task.plan(), reference_config(OptimizerKind::kAdamW), true));
    task.backend().prepare(*program);
    task.backend().execute(*program);
    const CompiledStep* first = &*program;
    const size_t first_nodes = program->node_count();
    program.reset();
    program.emplace(compile_step(task.plan(), reference_config(second), true));
    EXPECT_EQ(&*program, first);
    EXPECT_EQ(program->node_count(), first_nodes);
    task.backend().execute(*program);
    return snapshot(task);
  };
  const Snapshot cpu = run_two(BackendKind::kCpu, OptimizerKind::kAdam);
  const Snapshot cpu_adamw_twice = run_two(BackendKind::kCpu, OptimizerKind::kAdamW);
  EXPECT_FALSE(same_bits(cpu.w, cpu_adamw_twice.w)) << "Adam and AdamW gave the same weights: the test shows nothing";
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);  // the CPU half above checks the premises anywhere
  expect_same(cpu, run_two(BackendKind::kCuda, OptimizerKind::kAdam));
}

}  // namespace
}  // namespace renaissance
