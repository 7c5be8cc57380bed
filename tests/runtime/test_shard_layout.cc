// The partition of a sharded step (renaissance/shard.h, docs/distributed.md): for every kind,
// world sizes 1..6, the test layout and resnet50, the slices tile the family in rank order, every
// grad-norm tile and every norm tile has exactly one owner holding all of it, and the partition
// actually shards; every cut and every span a rank's sub-steps hand the backend lies on a
// multiple of 4 elements (the CUDA kernels' 16-byte vectors). Plus the world of one
// (LocalCommunicator): a sharded step equals Task::step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/kinds.h"
#include "renaissance/layout.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"
#include "support/optimizer_cases.h"
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
  // Work items (hyperparameter groups, tensor_mask): no cut lies strictly inside one, so each
  // item has one owner that walks all of it (ShardedStep cuts the items' table, not the items).
  const uint64_t family = plan.region_range(W_BN_BIAS, W_DEEP_CONV).offset;
  for (Group group : {Group::kBiasLike, Group::kWeight}) {
    const uint64_t first = (plan.group_span(Family::kW, group).offset - family) / 4;
    const Span span = plan.hyper_item_span(group);
    const HyperItem* items = plan.hyper_items().data() + (group == Group::kWeight ? plan.hyper_item_span(Group::kBiasLike).count : 0);
    for (uint64_t i = 0; i < span.count; ++i) {
      const uint64_t b = first + static_cast<uint64_t>(items[i].start), e = b + static_cast<uint64_t>(items[i].count);
      for (int r = 1; r < K; ++r) EXPECT_FALSE(a.ranks[r].begin > b && a.ranks[r].begin < e) << "cut " << r << " splits item " << i;
    }
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
    // The test layout really shards: at K = 2 and 4 every rank updates something (Muon at K = 2:
    // its layer1 matrix is over a quarter of the family, so at K = 4 the rule leaves a rank
    // without elements; MuonMatricesHaveOneOwnerEach checks what it gets).
    for (int K : {2, 4}) {
      if (info.kind == OptimizerKind::kMuon && K == 4) continue;
      for (const RankShard& s : make_shard_layout(plan, K).ranks) EXPECT_LT(s.begin, s.end) << info.name << " K=" << K;
    }
  }
}

// Muon's partition (docs/distributed.md, rule M): the extents of the non-empty matrices (from a
// matrix's first element to the next one's, or to the weight group's end), taken from the plan's
// tensors; every cut is rule 1's grad-tile cut, or, where that falls strictly inside an extent,
// the nearer end of that extent (its start on a tie); each matrix is owned by exactly one rank,
// the one whose slice holds all of its elements, in plan order.
void expect_whole_matrices(const MemoryPlan& plan, int K, const std::string& what, bool exact_cuts) {
  SCOPED_TRACE(what + " K=" + std::to_string(K));
  const ShardLayout a = make_shard_layout(plan, K);
  const ShardLayout b = make_shard_layout(plan, K);
  const uint64_t F = plan.region_range(G_BN_BIAS, G_DEEP_CONV).count;
  const uint64_t family = plan.region_range(W_BN_BIAS, W_DEEP_CONV).offset;
  // The weight-group tensors in index_in_group order: (first family element, elements).
  std::vector<std::pair<uint64_t, uint64_t>> tensors(plan.muon_matrices().size());
  for (size_t id = 0; id < plan.num_params(); ++id) {
    const TensorInfo& t = plan.tensor(id);
    if (group_of(t.spec.role) != Group::kWeight) continue;
    tensors.at(static_cast<size_t>(t.index_in_group)) = {t.offset_in_family, static_cast<uint64_t>(t.numel)};
  }
  const Span weight = plan.group_span(Family::kW, Group::kWeight);
  const uint64_t weight_end = (weight.offset - family) / 4 + weight.count;
  // [start, next start) of each non-empty one, for the cuts that split no matrix; and the extents
  // rule M moves a cut within: from one aligned start of a non-empty matrix to the next (a matrix
  // that starts off a multiple of 4 elements goes with the one before it).
  std::vector<std::pair<uint64_t, uint64_t>> extents, aligned;
  std::vector<uint64_t> starts;
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].second == 0) continue;
    uint64_t next = weight_end;
    for (size_t u = t + 1; u < tensors.size(); ++u) {
      if (tensors[u].second > 0) {
        next = tensors[u].first;
        break;
      }
    }
    extents.emplace_back(tensors[t].first, next);
    if (tensors[t].first % 4 == 0) starts.push_back(tensors[t].first);
  }
  for (size_t i = 0; i < starts.size(); ++i) aligned.emplace_back(starts[i], i + 1 < starts.size() ? starts[i + 1] : weight_end);
  const uint64_t tile = static_cast<uint64_t>(math::kGradNormTile);
  const uint64_t T = static_cast<uint64_t>(math::grad_norm_tile_count(F));
  int64_t next_matrix = 0;
  int owners = 0;
  for (int r = 0; r < K; ++r) {
    const RankShard& s = a.ranks[r];
    EXPECT_EQ(s.muon_matrix_begin, b.ranks[r].muon_matrix_begin) << "a pure function of (plan, K)";
    EXPECT_EQ(s.muon_matrix_end, b.ranks[r].muon_matrix_end);
    EXPECT_EQ(s.muon_matrix_begin, next_matrix) << "matrices are owned once, in order";
    EXPECT_LE(s.muon_matrix_begin, s.muon_matrix_end);
    for (int64_t t = s.muon_matrix_begin; t < s.muon_matrix_end; ++t) {
      const auto& m = tensors.at(static_cast<size_t>(t));
      if (m.second == 0) continue;
      EXPECT_TRUE(m.first >= s.begin && m.first + m.second <= s.end) << "matrix " << t << " lies inside its owner's slice";
    }
    owners += s.muon_matrix_end > s.muon_matrix_begin ? 1 : 0;
    next_matrix = s.muon_matrix_end;
    if (r == 0) continue;
    for (const auto& e : extents) EXPECT_FALSE(s.begin > e.first && s.begin < e.second) << "cut " << r << " splits a matrix";
    if (!exact_cuts) continue;
    uint64_t want = std::min(F, T * static_cast<uint64_t>(r) / static_cast<uint64_t>(K) * tile);
    for (const auto& e : aligned) {
      if (want > e.first && want < e.second) want = want - e.first <= e.second - want ? e.first : e.second;
    }
    EXPECT_EQ(s.begin, want) << "cut " << r << ": rule 1's cut, moved to the nearer aligned end of the matrices holding it";
  }
  EXPECT_EQ(next_matrix, static_cast<int64_t>(tensors.size())) << "every matrix has an owner";
  if (K > 1 && extents.size() > 1) {
    EXPECT_GT(owners, 1) << "the matrices are spread over the ranks";
  }
}

TEST(ShardLayout, MuonMatricesHaveOneOwnerEach) {
  for (const char* name : {"shard", "resnet50", "gpt2_small"}) {
    const Layout layout = std::string(name) == "shard" ? load_layout_file(kShardLayout) : builtin_layout(name);
    for (bool mask : {false, true}) {
      PlanConfig config = plan_config_from_optimizer(OptimizerKind::kMuon);
      config.tensor_mask = mask;
      const MemoryPlan plan(layout.params, config);
      ASSERT_FALSE(plan.muon_matrices().empty());
      // (With the mask, rule 3 may move a cut in the bias-like group further down: no exact cuts.)
      for (int K = 1; K <= 8; ++K) expect_whole_matrices(plan, K, std::string(name) + (mask ? " mask" : ""), !mask);
    }
  }
  // The other kinds own no matrices.
  const MemoryPlan adamw(load_layout_file(kShardLayout).params, plan_config_from_optimizer(OptimizerKind::kAdamW));
  for (const RankShard& s : make_shard_layout(adamw, 3).ranks) EXPECT_EQ(s.muon_matrix_end, 0);
}

// The test layout at K = 2 and 3 (rule 1's cuts at tiles 3 and 2, 4 of 7): the cuts the rule
// gives, worked out by hand from its tensors (bias-like group 448 elements; fc.weight from 448,
// conv1 from 5632, layer1.conv from 15040, layer2.conv from 70336, small from 107373).
TEST(ShardLayout, MuonCutsOfTheTestLayout) {
  const MemoryPlan plan(load_layout_file(kShardLayout).params, plan_config_from_optimizer(OptimizerKind::kMuon));
  const ShardLayout two = make_shard_layout(plan, 2);
  EXPECT_EQ(two.ranks[1].begin, 70336u);  // 49152 inside layer1.conv [15040, 70336): nearer its end
  const ShardLayout three = make_shard_layout(plan, 3);
  EXPECT_EQ(three.ranks[1].begin, 15040u);  // 32768: 17728 past layer1's start, 37568 before its end
  EXPECT_EQ(three.ranks[2].begin, 70336u);  // 65536: nearer layer1's end
  // small.weight starts at 107373, off a multiple of 4: it goes with layer2.conv, whose extent
  // for rule M runs from 70336 to the weight group's end 107456 (rule A).
  const ShardLayout seven = make_shard_layout(plan, 7);
  EXPECT_EQ(seven.ranks[6].begin, 107456u);  // 98304: 27968 past layer2's start, 9152 before the end
  EXPECT_EQ(seven.ranks[5].muon_matrix_end, 6);    // rank 5 owns small.weight (matrix 5) with layer2.conv
  EXPECT_EQ(seven.ranks[6].muon_matrix_begin, 6);  // and the last rank no matrix
  const ShardLayout eight = make_shard_layout(plan, 8);
  EXPECT_EQ(eight.ranks[7].begin, 107456u);  // rule 1's 98304 again (tile 6 of 7)
  EXPECT_EQ(eight.ranks[6].begin, 70336u);   // 81920: nearer layer2's start
}

std::vector<ParamSpec> two_group_params(std::vector<ParamSpec> params, bool aux);  // below

// A layout whose large weight tensor starts off a multiple of 4 elements (after a 5-element one):
// every norm tile of b.weight starts off the alignment, and so does b.weight as a Muon matrix.
std::vector<ParamSpec> odd_start_params() {
  return {{"bn.bias", {3}, Role::kBnBias}, {"a.weight", {1, 5}, Role::kDeepConv}, {"b.weight", {300, 300}, Role::kDeepConv}};
}

// Rule A where rule 2 alone gives a cut off the alignment (LARS, LAMB on odd_start_params: rule
// 1's 49152 lies in the norm tile of b.weight from 45125): the cut moves down tile by tile to
// a.weight's start 64, the largest aligned cut at or below that splits no norm tile; Muon's only
// aligned matrix start is a.weight's, so b.weight goes with it and the cut moves to the end.
TEST(ShardLayout, AlignedCutsWhereTensorsStartOffTheAlignment) {
  for (OptimizerKind kind : {OptimizerKind::kLars, OptimizerKind::kLamb, OptimizerKind::kMuon}) {
    const MemoryPlan plan(odd_start_params(), plan_config_from_optimizer(kind));
    ASSERT_EQ(plan.region_range(G_BN_BIAS, G_DEEP_CONV).count, 90112u);
    const ShardLayout two = make_shard_layout(plan, 2);
    EXPECT_EQ(two.ranks[1].begin, kind == OptimizerKind::kMuon ? 90112u : 64u) << optimizer_kind_name(kind);
  }
}

// Rule A (docs/distributed.md): for every kind, every shipped layout and the test layout,
// without and with hyperparameter groups and with the per-tensor mask, at K = 1..8, every cut is
// a multiple of 4 elements: the CUDA kernels read each span of a slice in 16-byte vectors from
// its first element. The partition stays valid (one owner per tile, item and matrix).
TEST(ShardLayout, CutsAreAlignedForEveryLayoutKindAndWorldSize) {
  std::vector<std::pair<std::string, Layout>> layouts{{"shard", load_layout_file(kShardLayout)}};
  layouts.emplace_back("odd_start", Layout{});
  layouts.back().second.params = odd_start_params();
  for (const std::string& name : builtin_layout_names()) layouts.emplace_back(name, builtin_layout(name));
  ASSERT_GE(layouts.size(), 7u);
  for (const auto& [name, layout] : layouts) {
    for (const KindInfo& info : kKindTable) {
      const bool muon = info.kind == OptimizerKind::kMuon;
      for (const char* variant : {"plain", "H=2", "mask"}) {
        PlanConfig config = plan_config_from_optimizer(info.kind);
        std::vector<ParamSpec> params = layout.params;
        if (std::string(variant) == "H=2") {
          config.hyper_groups = 2;
          params = two_group_params(params, muon);
        }
        config.tensor_mask = std::string(variant) == "mask";
        const MemoryPlan plan(params, config);
        for (int K = 1; K <= 8; ++K) {
          const ShardLayout a = make_shard_layout(plan, K);
          for (int r = 0; r < K; ++r) {
            EXPECT_EQ(a.ranks[r].begin % kShardCutAlign, 0u)
                << name << " " << info.name << " " << variant << " K=" << K << " rank " << r << " starts at "
                << a.ranks[r].begin;
          }
          if (name == "shard" || name == "odd_start" || K <= 2) {
            expect_valid_partition(plan, K, name + " " + info.name + " " + variant);
            // (odd_start's two matrices may well go to one rank: no spread to expect.)
            if (muon && name != "odd_start") expect_whole_matrices(plan, K, name + " " + variant, false);
          }
        }
      }
    }
  }
}

// The parameters of `layout` in two hyperparameter groups (alternating in declaration order, so
// that each role has runs of both); with `aux`, fc.weight marked for Muon's auxiliary AdamW
// (a weight-role tensor in the bias-like group, with the aux lr of its group).
std::vector<ParamSpec> two_group_params(std::vector<ParamSpec> params, bool aux) {
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].hyper_group = static_cast<int>(i % 2);
    if (aux && params[i].name == "fc.weight") params[i].optimizer = ParamOptimizer::kAdamW;
  }
  return params;
}

// Hyperparameter groups (H = 2): the items of a group's run may start inside a norm tile or a
// Muon matrix (a run holds several tensors); the cut still splits no item, no tile and no matrix,
// and the test layout's partition still shards.
TEST(ShardLayout, HyperGroupPlansSplitNoItem) {
  const Layout shard = load_layout_file(kShardLayout);
  const Layout resnet = builtin_layout("resnet50");
  for (const KindInfo& info : kKindTable) {
    const bool muon = info.kind == OptimizerKind::kMuon;
    PlanConfig config = plan_config_from_optimizer(info.kind);
    config.hyper_groups = 2;
    const MemoryPlan plan(two_group_params(shard.params, muon), config);
    const MemoryPlan big(two_group_params(resnet.params, muon), config);
    ASSERT_FALSE(plan.hyper_items().empty());
    for (int K = 1; K <= 6; ++K) {
      expect_valid_partition(plan, K, std::string(info.name) + " shard H=2");
      expect_valid_partition(big, K, std::string(info.name) + " resnet50 H=2");
      if (muon) {
        expect_whole_matrices(plan, K, "shard H=2", false);
        expect_whole_matrices(big, K, "resnet50 H=2", false);
      }
    }
    int updating = 0;
    for (const RankShard& s : make_shard_layout(plan, 2).ranks) updating += s.begin < s.end ? 1 : 0;
    EXPECT_EQ(updating, 2) << info.name << " K=2";
  }
}

// Muon with hyperparameter groups (H = 2) cuts as Muon without: each matrix is its own run of
// work items, so rule M's cut at a matrix start is an item start and rule 3 leaves it there.
// Two splits that keep the matrices' order: all matrices in group 0 and the bias-like tensors in
// group 1 (MuonWithAuxAdam's shape: one run of every matrix of a role), and the first half of
// the tensors in group 0. At K = 2..6 a rank owns a matrix wherever the plan without groups gives
// it one, and its count and elements of matrices are within one matrix of that plan's.
TEST(ShardLayout, MuonWithHyperGroupsBalancesAsWithout) {
  for (const char* name : {"shard", "resnet50", "gpt2_small"}) {
    const Layout layout = std::string(name) == "shard" ? load_layout_file(kShardLayout) : builtin_layout(name);
    const MemoryPlan one(layout.params, plan_config_from_optimizer(OptimizerKind::kMuon));
    PlanConfig config = plan_config_from_optimizer(OptimizerKind::kMuon);
    config.hyper_groups = 2;
    for (const char* split : {"matrices apart", "halves"}) {
      std::vector<ParamSpec> params = layout.params;
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].hyper_group = std::string(split) == "halves" ? (2 * i < params.size() ? 0 : 1)
                                                                : (group_of(params[i].role) == Group::kWeight ? 0 : 1);
      }
      const MemoryPlan two(params, config);
      ASSERT_EQ(two.muon_matrices().size(), one.muon_matrices().size());
      // The same matrices in the same order, so that rank r's run of matrices compares directly.
      std::vector<uint64_t> numel(one.muon_matrices().size());
      uint64_t largest = 0;
      for (size_t id = 0; id < one.num_params(); ++id) {
        if (group_of(one.tensor(id).spec.role) != Group::kWeight) continue;
        ASSERT_EQ(two.tensor(id).index_in_group, one.tensor(id).index_in_group) << name << " " << split;
        numel[static_cast<size_t>(one.tensor(id).index_in_group)] = static_cast<uint64_t>(one.tensor(id).numel);
        largest = std::max(largest, static_cast<uint64_t>(one.tensor(id).numel));
      }
      auto elements = [&](const RankShard& s) {
        uint64_t n = 0;
        for (int64_t t = s.muon_matrix_begin; t < s.muon_matrix_end; ++t) n += numel[static_cast<size_t>(t)];
        return n;
      };
      for (int K = 2; K <= 6; ++K) {
        SCOPED_TRACE(std::string(name) + " " + split + " K=" + std::to_string(K));
        expect_whole_matrices(two, K, "H=2", false);
        const ShardLayout a = make_shard_layout(one, K), b = make_shard_layout(two, K);
        for (int r = 0; r < K; ++r) {
          const int64_t want = a.ranks[r].muon_matrix_end - a.ranks[r].muon_matrix_begin;
          const int64_t got = b.ranks[r].muon_matrix_end - b.ranks[r].muon_matrix_begin;
          if (want > 0) {
            EXPECT_GT(got, 0) << "rank " << r << " owns no matrix (without groups: " << want << ")";
          }
          EXPECT_LE(std::abs(got - want), 1) << "rank " << r << " owns " << got << " matrices, without groups " << want;
          const uint64_t e1 = elements(a.ranks[r]), e2 = elements(b.ranks[r]);
          EXPECT_LE(std::max(e1, e2) - std::min(e1, e2), largest)
              << "rank " << r << " owns " << e2 << " matrix elements, without groups " << e1;
        }
      }
    }
  }
}

TEST(ShardLayout, RefusesAnEmptyWorld) {
  const MemoryPlan plan(load_layout_file(kShardLayout).params, plan_config_from_optimizer(OptimizerKind::kAdamW));
  EXPECT_THROW(make_shard_layout(plan, 0), Error);
}

// A world of one, Task::step against the sharded step over the local communicator, for `kind`
// with clipping: the fingerprints of three steps bit for bit and, with compare_n, every tensor's
// N (its first element: the adjusted lr of a Muon matrix, which the sharded step gathers from
// its owner).
// With groups = 2: two hyperparameter groups (two_group_params) with different lr, weight decay,
// betas, eps, momentum, trust coefficient and (Muon) aux lr and aux weight decay, in one Task.
void expect_world_of_one_equals_task_step(OptimizerKind kind, bool compare_n, int groups = 1) {
  const Layout shard = load_layout_file(kShardLayout);
  const std::vector<ParamSpec> params =
      groups == 1 ? shard.params : two_group_params(shard.params, kind == OptimizerKind::kMuon);
  for (GradReduce mode : {GradReduce::kReplicated, GradReduce::kOrdered, GradReduce::kFast}) {
    std::string fp[2];
    std::vector<float> n[2];
    for (int sharded = 0; sharded < 2; ++sharded) {
      TaskOptions options;
      options.backend = BackendKind::kCpu;
      options.backend_options.threads = 1;
      Task task(params, options);
      OptimizerConfig config = reference_config(kind);
      config.max_grad_norm = 0.05;
      if (groups == 1) {
        task.optimizer(config);
      } else {
        std::vector<OptimizerConfig> configs;
        for (int h = 0; h < groups; ++h) {
          OptimizerConfig c = testing_util::shifted_group_config(config, h);
          if (kind == OptimizerKind::kMuon) {  // the aux AdamW's own rows: muon's only
            c.aux_lr = config.aux_lr * (1.0 + 0.5 * h);
            c.aux_weight_decay = 0.01 * h;
          }
          configs.push_back(c);
        }
        task.optimizer_groups(configs);
      }
      task.compile();
      fp[sharded] = testing_util::three_steps_fingerprint(task, mode, sharded != 0);
      if (!compare_n) continue;
      for (size_t id = 0; id < task.num_params(); ++id) {
        float x = 0.0f;
        task.read(Family::kN, id, &x);
        n[sharded].push_back(x);
      }
    }
    EXPECT_EQ(fp[0], fp[1]) << grad_reduce_name(mode);
    if (compare_n) {
      ASSERT_EQ(n[0].size(), n[1].size());
      ASSERT_FALSE(n[0].empty());
      EXPECT_EQ(0, std::memcmp(n[0].data(), n[1].data(), n[0].size() * sizeof(float))) << grad_reduce_name(mode);
    }
  }
}

// Reduce (ordered: g/1), check, partials, update and gathers give the bits of Task::step, for a
// norm kind with clipping.
TEST(ShardedStep, WorldOfOneEqualsTaskStep) { expect_world_of_one_equals_task_step(OptimizerKind::kLamb, false); }

// The same for Muon: the Newton–Schulz node cut to the owned matrices (all of them in a world of
// one) and the gather of N give Task::step's bits, N included.
TEST(ShardedStep, WorldOfOneEqualsTaskStepMuon) {
  expect_world_of_one_equals_task_step(OptimizerKind::kMuon, true);
}

// Two hyperparameter groups in one Task (the per-run work items, each tensor's scalar block in
// the tile-wise nodes and Newton–Schulz, the clip coefficient written into both blocks): the
// sharded step gives Task::step's bits for an element-wise, a tile-wise and Muon's kind (its
// aux AdamW in the same Task).
TEST(ShardedStep, WorldOfOneEqualsTaskStepWithHyperGroups) {
  expect_world_of_one_equals_task_step(OptimizerKind::kAdamW, false, 2);
  expect_world_of_one_equals_task_step(OptimizerKind::kLamb, false, 2);
  expect_world_of_one_equals_task_step(OptimizerKind::kMuon, true, 2);
}

// A communicator that only names rank `rank` of a world of `size`: enough to build that rank's
// ShardedStep (its constructor cuts the sub-steps and checks their spans) without running one.
class NamedRank final : public Communicator {
 public:
  NamedRank(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return "named rank"; }
  void all_gather_v(void*, const std::vector<uint64_t>&, const std::vector<uint64_t>&) override { ADD_FAILURE(); }
  void all_to_all_v(const void*, const std::vector<uint64_t>&, const std::vector<uint64_t>&, void*,
                    const std::vector<uint64_t>&, const std::vector<uint64_t>&) override {
    ADD_FAILURE();
  }
  void reduce_scatter_sum_f32(const float*, float*, const std::vector<uint64_t>&) override { ADD_FAILURE(); }
  void all_reduce_max_i32(int32_t*, uint64_t) override { ADD_FAILURE(); }
  void barrier() override { ADD_FAILURE(); }
  bool order_on_stream(void* stream) override {
    if (stream == nullptr) ++releases;
    return Communicator::order_on_stream(stream);
  }
  int releases = 0;  // order_on_stream(nullptr) calls: the step let go of a backend's stream

 private:
  int rank_, size_;
};

// A compiled CPU task of the test layout for `kind`: "clip" (gradient-norm clipping: the check
// fused into the grad-norm partials), "plain" (the non-finite check over the slice), "H=2" (two
// hyperparameter groups), "bf16" (a bf16 model copy with bf16 gradients in G: 2-byte G spans),
// "mask" (TaskOptions::tensor_mask).
std::unique_ptr<Task> compiled_shard_task(OptimizerKind kind, const std::string& variant,
                                          const std::vector<ParamSpec>& params = load_layout_file(kShardLayout).params) {
  const bool groups = variant == "H=2";
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  options.backend_options.threads = 1;
  options.tensor_mask = variant == "mask";
  if (variant == "bf16") {
    options.precision.precision = Precision::kBf16;
    options.precision.model_dtype_gradients = true;
  }
  auto task = std::make_unique<Task>(groups ? two_group_params(params, kind == OptimizerKind::kMuon) : params, options);
  OptimizerConfig config = reference_config(kind);
  if (variant == "clip") config.max_grad_norm = 0.05;
  if (groups) {
    task->optimizer_groups({testing_util::shifted_group_config(config, 0), testing_util::shifted_group_config(config, 1)});
  } else {
    task->optimizer(config);
  }
  task->compile();
  return task;
}

// A communicator outlives the steps it serves (a rank program runs many Tasks over one NCCL
// communicator): a step that goes takes it off its backend's stream, or the next step's binding
// would wait on the stream of a destroyed backend (a crash in cuStreamSynchronize on CUDA ranks).
TEST(ShardedStep, ReleasesTheCommunicatorWhenItGoes) {
  NamedRank comm(0, 1);
  for (int run = 1; run <= 2; ++run) {
    const std::unique_ptr<Task> task = compiled_shard_task(OptimizerKind::kAdamW, "plain");
    {
      ShardedStep step(*task, comm, GradReduce::kReplicated);
      EXPECT_EQ(comm.releases, run - 1);
    }
    EXPECT_EQ(comm.releases, run);
  }
}

// What a GPU rank runs (docs/distributed.md, rule A): at every rank of K = 1..8, for every kind
// and variant, ShardedStep's sub-steps hand the backend only spans that start on a multiple of 4
// elements and hold a multiple of 4 (the constructor refuses any other with unaligned_span's
// words). On the test layout Muon at K = 7 and 8 cuts at a matrix that would start off the
// alignment (small.weight); on odd_start_params LARS and LAMB at a norm tile that would.
TEST(ShardedStep, EveryRanksSubStepSpansAreAligned) {
  for (const KindInfo& info : kKindTable) {
    for (const char* variant : {"plain", "clip", "H=2", "bf16", "mask", "odd_start"}) {
      SCOPED_TRACE(std::string(info.name) + " " + variant);
      const std::string v = variant;
      const std::unique_ptr<Task> task = v == "odd_start" ? compiled_shard_task(info.kind, "plain", odd_start_params())
                                                          : compiled_shard_task(info.kind, variant);
      EXPECT_EQ(unaligned_span(task->compiled_step(), task->plan()), "");
      for (int K = 1; K <= 8; ++K) {
        for (int r = 0; r < K; ++r) {
          NamedRank comm(r, K);
          try {
            ShardedStep step(*task, comm, GradReduce::kReplicated);
            EXPECT_EQ(step.shard().begin % kShardCutAlign, 0u);
          } catch (const Error& e) {
            ADD_FAILURE() << "K=" << K << " rank " << r << ": " << e.what();
          }
        }
      }
    }
  }
}

// The refusal's predicate: a span moved off the 4-element alignment, or cut to a length that is
// not a multiple of 4, of W (4-byte elements), of G held in bf16 (2-byte elements: 4 of them
// are 8 bytes) and of Muon's U, is named; a move by whole vectors is not.
TEST(ShardedStep, UnalignedSpanNamesTheSpan) {
  const std::unique_ptr<Task> muon = compiled_shard_task(OptimizerKind::kMuon, "bf16");
  const CompiledStep& whole = muon->compiled_step();
  ASSERT_EQ(unaligned_span(whole, muon->plan()), "");
  auto moved = [&](auto edit) {
    CompiledStep step = whole;
    for (auto& graph : step.graphs) {
      for (GraphNode& node : graph) {
        if (node.kind == NodeKind::kRange && node.range_op == RangeOp::MUON_MOMENTUM) edit(node);
      }
    }
    return unaligned_span(step, muon->plan());
  };
  auto shift = [](Span& span, uint64_t elements, uint64_t elem) {
    span.offset += elements * elem;
    span.count -= (elements + 3) / 4 * 4;  // still a whole number of vectors long
  };
  EXPECT_EQ(moved([&](GraphNode& n) { shift(n.span(Family::kW), 4, 4); }), "");
  EXPECT_NE(moved([&](GraphNode& n) { shift(n.span(Family::kW), 1, 4); }).find("MUON_MOMENTUM reads W"), std::string::npos);
  EXPECT_NE(moved([&](GraphNode& n) { n.span(Family::kW).count -= 2; }).find("reads W"), std::string::npos);
  EXPECT_EQ(moved([&](GraphNode& n) { shift(n.span(Family::kG), 4, 2); }), "");
  EXPECT_NE(moved([&](GraphNode& n) { shift(n.span(Family::kG), 2, 2); }).find("reads G"), std::string::npos);
  EXPECT_NE(moved([&](GraphNode& n) { shift(n.span(Family::kM), 3, 4); }).find("reads M"), std::string::npos);
  EXPECT_EQ(moved([&](GraphNode& n) { shift(n.muon.update, 8, 4); }), "");
  EXPECT_NE(moved([&](GraphNode& n) { shift(n.muon.update, 2, 4); }).find("reads U"), std::string::npos);
}

}  // namespace
}  // namespace renaissance
