// Sharded steps and their one-process simulation with model-dtype gradients
// (PrecisionOptions::model_dtype_gradients; docs/distributed.md, "Model-dtype gradients"):
//  - the partition of a 2-byte-G plan is the fp32 one (make_shard_layout);
//  - synthesize_rank_sum (--simulate-ranks K) leaves in G, for every element, the rank-order fp32
//    sum of the K ranks' bf16/fp16 values widened exactly, divided by K, rounded to nearest even
//    into the model dtype: checked element by element against that formula spelled out here;
//  - a world of one (LocalCommunicator) equals Task::step for every gradient mode.
// The multi-rank equalities (replicated == one device, ordered == simulation) run under mpirun
// in tests/comm/sharded_runs.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "renaissance/kinds.h"
#include "renaissance/layout.h"
#include "renaissance/math/precision.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"
#include "support/shard_test_util.h"

namespace renaissance {
namespace {

const std::string kShardLayout = std::string(RENAISSANCE_SOURCE_DIR) + "/tests/comm/shard_layout.json";

std::unique_ptr<Task> make_task(const Layout& layout, Precision precision) {
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  options.backend_options.threads = 1;
  options.precision = {precision, Rounding::kNearest, 11, true};
  auto task = std::make_unique<Task>(layout.params, options);
  OptimizerConfig config = reference_config(OptimizerKind::kAdamW);
  config.max_grad_norm = 0.05;
  task->optimizer(config);
  task->compile();
  return task;
}

float widen(Precision p, uint16_t h) {
  if (p == Precision::kBf16) {  // the upper half of a float32
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  }
  return math::f16_to_f32(h);
}

// The partition is a function of the tensors, not of G's encoding: a model-dtype plan (2-byte G)
// is cut where the fp32 one is, so norm tiles keep one owner (counting the weight group's start
// in G's bytes as if they were floats put the norm tiles of LARS/LAMB in the wrong ranks).
TEST(ShardModelGrads, PartitionDoesNotDependOnTheGradientDtype) {
  const Layout layout = load_layout_file(kShardLayout);
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb}) {
    Task* tasks[2];
    std::unique_ptr<Task> owned[2];
    for (int model = 0; model < 2; ++model) {
      TaskOptions options;
      options.backend = BackendKind::kCpu;
      options.precision = {Precision::kBf16, Rounding::kNearest, 0, model == 1};
      owned[model] = std::make_unique<Task>(layout.params, options);
      owned[model]->optimizer(reference_config(kind));
      owned[model]->compile();
      tasks[model] = owned[model].get();
    }
    for (int K = 2; K <= 4; ++K) {
      const ShardLayout a = make_shard_layout(tasks[0]->plan(), K), b = make_shard_layout(tasks[1]->plan(), K);
      for (int r = 0; r < K; ++r) {
        SCOPED_TRACE(std::string(optimizer_kind_name(kind)) + " K=" + std::to_string(K) + " rank " + std::to_string(r));
        EXPECT_EQ(a.ranks[r].begin, b.ranks[r].begin);
        EXPECT_EQ(a.ranks[r].end, b.ranks[r].end);
        EXPECT_EQ(a.ranks[r].grad_end, b.ranks[r].grad_end);
        EXPECT_EQ(a.ranks[r].norm_tile_begin, b.ranks[r].norm_tile_begin);
        EXPECT_EQ(a.ranks[r].norm_tile_end, b.ranks[r].norm_tile_end);
      }
    }
  }
}

TEST(ShardModelGrads, SimulatedRankSumWidensSumsInRankOrderAndRoundsOnce) {
  const Layout layout = load_layout_file(kShardLayout);
  constexpr int K = 3;
  constexpr uint64_t seed = 5, step = 2;
  constexpr float amplitude = 300.0f;  // fp16 gradients of loss-scaled size: normal numbers
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    SCOPED_TRACE(precision_name(p));
    std::unique_ptr<Task> owned = make_task(layout, p);
    Task& task = *owned;
    // Each rank's encoded gradient, as the rank-r stream writes it.
    std::vector<std::vector<std::vector<uint16_t>>> rank_g(K);
    for (int r = 0; r < K; ++r) {
      task.synthesize_gradients(rank_gradient_seed(seed, r), step, amplitude);
      for (size_t id = 0; id < task.num_params(); ++id) {
        rank_g[r].emplace_back(static_cast<size_t>(task.param(id).numel()));
        task.read_grad_encoded(id, rank_g[r].back().data());
      }
    }
    synthesize_rank_sum(task, seed, step, amplitude, K);
    int64_t checked = 0, differs_from_rank0 = 0;
    for (size_t id = 0; id < task.num_params(); ++id) {
      std::vector<uint16_t> got(static_cast<size_t>(task.param(id).numel()));
      task.read_grad_encoded(id, got.data());
      for (size_t i = 0; i < got.size(); ++i) {
        float sum = widen(p, rank_g[0][id][i]);
        for (int r = 1; r < K; ++r) sum = sum + widen(p, rank_g[r][id][i]);
        const float mean = sum / static_cast<float>(K);
        const uint16_t want = p == Precision::kBf16 ? math::f32_to_bf16_rne(mean) : math::f32_to_f16_rne(mean);
        ASSERT_EQ(got[i], want) << task.param(id).name << "[" << i << "]";
        ++checked;
        differs_from_rank0 += got[i] != rank_g[0][id][i];
      }
    }
    EXPECT_GT(checked, 100000);
    EXPECT_GT(differs_from_rank0, checked / 2) << "the ranks' streams differ, so the sum is not rank 0's gradient";
  }
}

TEST(ShardModelGrads, WorldOfOneEqualsTaskStep) {
  const Layout layout = load_layout_file(kShardLayout);
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    for (GradReduce mode : {GradReduce::kReplicated, GradReduce::kOrdered, GradReduce::kFast}) {
      std::string fp[2];
      for (int sharded = 0; sharded < 2; ++sharded) {
        std::unique_ptr<Task> owned = make_task(layout, p);
        fp[sharded] = testing_util::three_steps_fingerprint(*owned, mode, sharded != 0);
      }
      EXPECT_EQ(fp[0], fp[1]) << precision_name(p) << " " << grad_reduce_name(mode);
    }
  }
}

}  // namespace
}  // namespace renaissance
