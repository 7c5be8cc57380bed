// Pins the canonical per-tensor norm order (docs/reproducibility.md, math/norm_reduction.h) on
// the CPU backend: after one LARS (or LAMB) step, every tile partial in the arena's scratch must
// equal, bit for bit, a sum written here from the definition alone (element e of a tile goes to
// lane (e mod 1024) / 4, each lane adds its squares in increasing element order, then the halving
// tree), and every trust ratio must come from the tensor sums of the two-level combination (sum-
// lane k adds tiles k, k+256, ...; the same tree). Values span many binades, so any other order
// changes low bits of the doubles. Threads and Highway targets must not matter; with a GPU, the
// CUDA backend's partials and ratios must equal the CPU's (CudaPartialsEqualCpuBitForBit).
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "renaissance/math/norm_reduction.h"
#include "renaissance/math/update_rules.h"
#include "renaissance/task.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

// Weight tensors of awkward sizes: "odd" (3 elements) shifts the next tensor off a 16-byte
// boundary; 300 tiles make sum-lanes of two partials; short last tiles; a tensor under one round.
std::vector<ParamSpec> layout() {
  return {{"bias", {5}, Role::kBnBias},
          {"odd", {3}, Role::kFcWeight},
          {"big", {4096 * 300 + 777}, Role::kFcWeight},
          {"whole", {4096 * 2}, Role::kFirstConv},
          {"small", {1000}, Role::kDeepConv},
          {"mid", {4096 + 2049}, Role::kDeepConv}};
}

// Floats over ~40 binades with both signs: reordering double sums of their squares moves low bits.
std::vector<float> wide_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::vector<float> v(n);
  for (float& x : v) x = std::ldexp(mant(rng), expo(rng)) * ((rng() & 1) ? 1.0f : -1.0f);
  return v;
}

uint64_t bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

// The tile partial from the definition: no vectors, no rows, one loop over the elements.
double reference_tile(const float* x, int n) {
  std::vector<double> lanes(256, 0.0);
  for (int e = 0; e < n; ++e) {
    const double d = static_cast<double>(x[e]);
    lanes[(e % 1024) / 4] += d * d;
  }
  for (int s = 128; s > 0; s /= 2) {
    for (int j = 0; j < s; ++j) lanes[j] += lanes[j + s];
  }
  return lanes[0];
}

// A tensor's sum from its tile partials (one component), from the definition.
double reference_combination(const std::vector<double>& tile_partials) {
  std::vector<double> lanes(256, 0.0);
  for (size_t t = 0; t < tile_partials.size(); ++t) lanes[t % 256] += tile_partials[t];
  for (int s = 128; s > 0; s /= 2) {
    for (int j = 0; j < s; ++j) lanes[j] += lanes[j + s];
  }
  return lanes[0];
}

TaskOptions cpu_options(int threads, BackendKind backend = BackendKind::kCpu) {
  TaskOptions options;
  options.backend = backend;
  options.backend_options.threads = threads;
  return options;
}

struct Step {
  std::vector<double> partials;  // the arena's scratch after the step
  std::vector<float> ratios;     // the weight group's N
  std::vector<double> f64;       // the double scalar slots
};

// One step of `config` with w and g from wide_values; returns the scratch the norm pass left.
Step run_step(const OptimizerConfig& config, int threads, const std::vector<std::vector<float>>& w,
              const std::vector<std::vector<float>>& g, BackendKind backend = BackendKind::kCpu) {
  Task task(layout(), cpu_options(threads, backend));
  task.optimizer(config);
  task.compile();
  for (size_t id = 0; id < task.num_params(); ++id) {
    task.set_weight(id, w[id].data());
    task.set_grad(id, g[id].data());
  }
  task.step();
  EXPECT_FALSE(task.last_step_skipped());
  const MemoryPlan& plan = task.plan();
  Step out;
  const RegionInfo& p = plan.region(T_NORM_PARTIALS);
  out.partials.resize(p.count);
  task.backend().download(p.offset, out.partials.data(), p.count * sizeof(double));
  const Span n = plan.group_span(Family::kN, Group::kWeight);
  out.ratios.resize(n.count);
  task.backend().download(n.offset, out.ratios.data(), n.count * sizeof(float));
  const RegionInfo& f = plan.region(S_SCALAR_FP64);
  out.f64.resize(f.count);
  task.backend().download(f.offset, out.f64.data(), f.count * sizeof(double));
  return out;
}

// Checks the scratch and the ratios against the definition. `other` gives the second component
// of each tile (ĝ for LARS), or nothing (LAMB's u is not recomputed here: only ‖w‖² is pinned).
void expect_canonical(const Task& task_shape, const Step& step, const std::vector<std::vector<float>>& w,
                      const std::vector<std::vector<float>>* other, bool lamb) {
  const MemoryPlan& plan = task_shape.plan();
  // Group-relative copies of w and the second input, so tiles index them as the kernels do.
  const Span wg = plan.group_span(Family::kW, Group::kWeight);
  std::vector<float> wgroup(wg.count, 0.0f), ogroup(wg.count, 0.0f);
  for (size_t id = 0; id < plan.num_params(); ++id) {
    const TensorInfo& t = plan.tensor(id);
    if (group_of(t.spec.role) != Group::kWeight) continue;
    std::copy(w[id].begin(), w[id].end(), wgroup.begin() + static_cast<int64_t>(t.offset_in_group));
    if (other != nullptr) {
      std::copy((*other)[id].begin(), (*other)[id].end(), ogroup.begin() + static_cast<int64_t>(t.offset_in_group));
    }
  }
  const std::vector<NormTile>& tiles = plan.norm_tiles();
  ASSERT_EQ(step.partials.size(), math::kNormComponents * tiles.size());
  int mismatches = 0;
  for (size_t t = 0; t < tiles.size(); ++t) {
    const double want_w = reference_tile(wgroup.data() + tiles[t].start, tiles[t].length);
    if (bits(step.partials[2 * t]) != bits(want_w) && mismatches++ < 5) {
      ADD_FAILURE() << "tile " << t << " (start " << tiles[t].start << ", length " << tiles[t].length
                    << "): |w|^2 partial " << step.partials[2 * t] << " != " << want_w;
    }
    if (other == nullptr) continue;
    const double want_o = reference_tile(ogroup.data() + tiles[t].start, tiles[t].length);
    if (bits(step.partials[2 * t + 1]) != bits(want_o) && mismatches++ < 5) {
      ADD_FAILURE() << "tile " << t << ": second partial " << step.partials[2 * t + 1] << " != " << want_o;
    }
  }
  EXPECT_EQ(mismatches, 0);
  const std::vector<NormTensor>& tensors = plan.norm_tensors();
  for (size_t k = 0; k < tensors.size(); ++k) {
    std::vector<double> pw, po;
    for (int64_t t = tensors[k].first_tile; t < tensors[k].first_tile + tensors[k].tile_count; ++t) {
      pw.push_back(step.partials[2 * t]);
      po.push_back(step.partials[2 * t + 1]);
    }
    const float want = math::trust_ratio(lamb, reference_combination(pw), reference_combination(po), step.f64.data());
    EXPECT_EQ(step.ratios[k], want) << "tensor " << k << " of the weight group";
  }
}

std::vector<std::vector<float>> inputs(uint32_t seed) {
  std::vector<std::vector<float>> v;
  for (const ParamSpec& p : layout()) v.push_back(wide_values(static_cast<size_t>(p.numel()), seed++));
  return v;
}

TEST(NormOrder, LarsPartialsAndRatiosFollowTheQuadOrder) {
  const auto w = inputs(1), g = inputs(100);
  const OptimizerConfig config = LARS().lr(0.1).weight_decay(1e-4).config();
  Task shape(layout(), cpu_options(1));
  shape.optimizer(config);
  shape.compile();
  for (int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    expect_canonical(shape, run_step(config, threads, w, g), w, &g, false);
  }
}

TEST(NormOrder, LambWeightPartialsAndRatiosFollowTheQuadOrder) {
  const auto w = inputs(7), g = inputs(70);
  const OptimizerConfig config = LAMB().lr(1e-3).config();
  Task shape(layout(), cpu_options(1));
  shape.optimizer(config);
  shape.compile();
  expect_canonical(shape, run_step(config, 2, w, g), w, nullptr, true);
}

// Every Highway target compiled in and supported here leaves the same scratch bits.
TEST(NormOrder, EveryHighwayTargetFollowsTheQuadOrder) {
  struct Reset {
    ~Reset() { hwy::SetSupportedTargetsForTest(0); }
  } reset;
  const auto w = inputs(3), g = inputs(30);
  const OptimizerConfig config = LARS().lr(0.1).config();
  Task shape(layout(), cpu_options(1));
  shape.optimizer(config);
  shape.compile();
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    expect_canonical(shape, run_step(config, 2, w, g), w, &g, false);
  }
}

// The CUDA backend's tile partials (float4 quads on aligned whole tiles, element loads on the
// others, the shared-memory and shuffle tree) and ratios equal the CPU's bit for bit, for LARS
// (w, ĝ) and LAMB (w, u). The arena comparison of the other CUDA tests leaves the scratch out,
// and a ratio rounded to float hides most order changes: the partials do not.
TEST(NormOrder, CudaPartialsEqualCpuBitForBit) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  const auto w = inputs(11), g = inputs(110);
  for (const OptimizerConfig& config : {LARS().lr(0.1).weight_decay(1e-4).config(), LAMB().lr(1e-3).config()}) {
    SCOPED_TRACE(optimizer_kind_name(config.kind));
    const Step cpu = run_step(config, 2, w, g, BackendKind::kCpu);
    const Step gpu = run_step(config, 0, w, g, BackendKind::kCuda);
    ASSERT_EQ(cpu.partials.size(), gpu.partials.size());
    int mismatches = 0;
    for (size_t i = 0; i < cpu.partials.size(); ++i) {
      if (bits(cpu.partials[i]) != bits(gpu.partials[i]) && mismatches++ < 5) {
        ADD_FAILURE() << "tile " << i / 2 << " component " << i % 2 << ": cpu " << cpu.partials[i] << " cuda "
                      << gpu.partials[i];
      }
    }
    EXPECT_EQ(mismatches, 0);
    for (size_t k = 0; k < cpu.ratios.size(); ++k) EXPECT_EQ(cpu.ratios[k], gpu.ratios[k]) << "tensor " << k;
  }
}

// The host combination (math::combine_tile_partials, used by the CPU's NORM_TRUST_RATIO) is the
// two-level order, checked directly on partials of mixed magnitude for counts around 256.
TEST(NormOrder, CombinationIsSumLanesThenTree) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> expo(-30, 30);
  for (int64_t count : {1, 2, 255, 256, 257, 700, 9424}) {
    std::vector<double> p(2 * static_cast<size_t>(count));
    for (double& x : p) x = std::ldexp(mant(rng), expo(rng));
    std::vector<double> c0, c1;
    for (int64_t t = 0; t < count; ++t) {
      c0.push_back(p[2 * t]);
      c1.push_back(p[2 * t + 1]);
    }
    double sums[math::kNormComponents];
    math::combine_tile_partials(p.data(), count, sums);
    EXPECT_EQ(bits(sums[0]), bits(reference_combination(c0))) << count << " tiles";
    EXPECT_EQ(bits(sums[1]), bits(reference_combination(c1))) << count << " tiles";
  }
}

}  // namespace
}  // namespace renaissance
