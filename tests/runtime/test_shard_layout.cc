// The partition of a sharded step (renaissance/shard.h, docs/distributed.md): for every kind,
// world sizes 1..6, the test layout and resnet50, the slices tile the family in rank order, every
// grad-norm tile and every norm tile has exactly one owner holding all of it, and the partition
// actually shards. Plus the world of one (LocalCommunicator): a sharded step equals Task::step.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/kinds.h"
#include "renaissance/layout.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"
#include "support/shard_test_util.h"

namespace renaissance {
namespace {

const std::string kShardLayout = std::string(RENAISSANCE_SOURCE_DIR) + "/tests/comm/shard_layout.json";

void expect_valid_partition(const MemoryPlan& plan, int K, const std::string& what) {
  SCOPED_TRACE(what + " K=" + std::to_string(K));
  const ShardLayout a = make_shard_layout(plan, K);
  const ShardLayout b = make_shard_layout(plan, K);
  const uint64_t F = plan.region_range(G_BN_BIAS, G_DEEP_CONV).count;
  ASSERT_EQ(a.family_count, F);
  ASSERT_EQ(a.ranks.size(), static_cast<size_t>(K));
  const uint64_t tile = static_cast<uint64_t>(math::kGradNormTile);
  const int64_t grad_tiles = math::grad_norm_tile_count(F);
  const uint64_t weight_start =
      (plan.group_span(Family::kG, Group::kWeight).offset - plan.region_range(G_BN_BIAS, G_DEEP_CONV).offset) / 4;
  int64_t next_grad = 0, next_norm = 0;
  for (int r = 0; r < K; ++r) {
    const RankShard& s = a.ranks[r];
    EXPECT_EQ(s.begin, r == 0 ? 0 : a.ranks[r - 1].end) << "slices follow each other";
    EXPECT_LE(s.begin, s.end);
    EXPECT_GE(s.grad_end, s.end);
    EXPECT_EQ(s.begin, b.ranks[r].begin) << "a pure function of (plan, K)";
    EXPECT_EQ(s.end, b.ranks[r].end);
    EXPECT_EQ(s.grad_tile_begin, next_grad) << "grad-norm tiles are owned once, in order";
    EXPECT_EQ(s.norm_tile_begin, next_norm) << "norm tiles are owned once, in order";
    for (int64_t t = s.grad_tile_begin; t < s.grad_tile_end; ++t) {
      const uint64_t start = static_cast<uint64_t>(t) * tile;
      EXPECT_TRUE(start >= s.begin && start < s.end) << "tile " << t << " starts in its owner's slice";
      EXPECT_LE(std::min(F, start + tile), s.grad_end) << "the owner has the reduced G of all of tile " << t;
    }
    for (int64_t t = s.norm_tile_begin; t < s.norm_tile_end; ++t) {
      const NormTile& nt = plan.norm_tiles()[static_cast<size_t>(t)];
      const uint64_t start = weight_start + static_cast<uint64_t>(nt.start);
      EXPECT_TRUE(start >= s.begin && start + static_cast<uint64_t>(nt.length) <= s.end)
          << "norm tile " << t << " lies inside its owner's slice";
    }
    next_grad = s.grad_tile_end;
    next_norm = s.norm_tile_end;
  }
  EXPECT_EQ(a.ranks.back().end, F);
  EXPECT_EQ(next_grad, grad_tiles);
  EXPECT_EQ(next_norm, static_cast<int64_t>(plan.norm_tiles().size()));
}

TEST(ShardLayout, EveryTileHasOneOwnerForEveryKindAndWorldSize) {
  const Layout shard = load_layout_file(kShardLayout);
  const Layout resnet = builtin_layout("resnet50");
  for (const KindInfo& info : kKindTable) {
    const MemoryPlan plan(shard.params, plan_config_from_optimizer(info.kind));
    const MemoryPlan big(resnet.params, plan_config_from_optimizer(info.kind));
    for (int K = 1; K <= 6; ++K) {
      expect_valid_partition(plan, K, std::string(info.name) + " shard");
      expect_valid_partition(big, K, std::string(info.name) + " resnet50");
    }
    // The test layout really shards: at K = 2 and 4 every rank updates something.
    for (int K : {2, 4}) {
      for (const RankShard& s : make_shard_layout(plan, K).ranks) EXPECT_LT(s.begin, s.end) << info.name << " K=" << K;
    }
  }
}

TEST(ShardLayout, RefusesAnEmptyWorld) {
  const MemoryPlan plan(load_layout_file(kShardLayout).params, plan_config_from_optimizer(OptimizerKind::kAdamW));
  EXPECT_THROW(make_shard_layout(plan, 0), Error);
}

// A world of one: reduce (ordered: g/1), check, partials, update and gathers over the local
// communicator give the bits of Task::step, for a norm kind with clipping.
TEST(ShardedStep, WorldOfOneEqualsTaskStep) {
  const Layout shard = load_layout_file(kShardLayout);
  for (GradReduce mode : {GradReduce::kReplicated, GradReduce::kOrdered, GradReduce::kFast}) {
    std::string fp[2];
    for (int sharded = 0; sharded < 2; ++sharded) {
      TaskOptions options;
      options.backend = BackendKind::kCpu;
      options.backend_options.threads = 1;
      Task task(shard.params, options);
      OptimizerConfig config = reference_config(OptimizerKind::kLamb);
      config.max_grad_norm = 0.05;
      task.optimizer(config);
      task.compile();
      fp[sharded] = testing_util::three_steps_fingerprint(task, mode, sharded != 0);
    }
    EXPECT_EQ(fp[0], fp[1]) << grad_reduce_name(mode);
  }
}

}  // namespace
}  // namespace renaissance
