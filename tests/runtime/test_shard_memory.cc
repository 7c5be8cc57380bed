// The memory a rank of a sharded step saves (docs/distributed.md "Memory per rank"):
// a task compiled with TaskOptions::state_shard holds W and G whole and M, V only for its slice.
// The expected arena is computed here from the parameters' sizes and the partition, not with the
// plan's own arithmetic; the held slices must not overlap anything else in the arena; the
// operations that would read M or V outside the slice refuse; a load keeps each rank's slice.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/kinds.h"
#include "renaissance/layout.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

const std::string kShardLayout = std::string(RENAISSANCE_SOURCE_DIR) + "/tests/comm/shard_layout.json";

uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

// Elements of one family: each role's tensors back to back, padded to 64 elements (design.md).
uint64_t family_elements(const std::vector<ParamSpec>& params) {
  uint64_t total = 0;
  for (int role = 0; role < kNumRoles; ++role) {
    uint64_t n = 0;
    for (const ParamSpec& p : params) n += p.role == static_cast<Role>(role) ? static_cast<uint64_t>(p.numel()) : 0;
    total += round_up(n, 64);
  }
  return total;
}

std::unique_ptr<Task> compiled_task(const std::vector<ParamSpec>& params, OptimizerKind kind, StateShard shard) {
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  options.backend_options.threads = 1;
  options.state_shard = shard;
  auto task = std::make_unique<Task>(params, options);
  task->optimizer(reference_config(kind));
  task->compile();
  return task;
}

// Rank r of K: the arena is the whole one less the M and V it does not hold. A held slice keeps
// the elements' 256-byte alignment, so it starts at the 64-element boundary at or below its
// first element and ends padded to 64 elements.
TEST(ShardMemory, ArenaPerRankIsWAndGWholePlusTheSliceOfMAndV) {
  const Layout resnet = builtin_layout("resnet50");
  const Layout shard = load_layout_file(kShardLayout);
  for (const Layout* layout : {&resnet, &shard}) {
    const uint64_t F = family_elements(layout->params);
    // (Muon: M and V sliced at its whole-matrix cuts; U, its table and scratch stay whole.)
    for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgdMomentum, OptimizerKind::kLamb,
                               OptimizerKind::kMuon}) {
      const KindInfo& info = kind_info(kind);
      const uint64_t state_families = (info.has_m ? 1 : 0) + (info.has_v ? 1 : 0);
      const MemoryPlan whole(layout->params, plan_config_from_optimizer(kind));
      ASSERT_EQ(whole.region_range(G_BN_BIAS, G_DEEP_CONV).count, F);
      for (int K = 1; K <= 4; ++K) {
        const ShardLayout parts = make_shard_layout(whole, K);
        for (int r = 0; r < K; ++r) {
          SCOPED_TRACE(layout->name + " " + info.name + " rank " + std::to_string(r) + " of " + std::to_string(K));
          const RankShard& s = parts.ranks[static_cast<size_t>(r)];
          const uint64_t first = s.begin / 64 * 64;
          const uint64_t held = round_up(s.end - first, 64);
          const uint64_t expected = whole.arena_bytes() - state_families * 4 * (F - held);
          const MemoryPlan plan(layout->params, slice_plan_config(whole, {r, K}));
          EXPECT_EQ(plan.arena_bytes(), expected);
          EXPECT_EQ(plan.state_begin(), s.begin);
          EXPECT_EQ(plan.state_end(), s.end);
          if (K == 2 && kind == OptimizerKind::kAdamW && layout == &resnet) {
            // The figure docs/distributed.md quotes: about half of M + V saved (2 of 4 families).
            EXPECT_NEAR(static_cast<double>(whole.arena_bytes() - plan.arena_bytes()), 4.0 * F, 4.0 * 2 * 16384);
          }
        }
      }
    }
  }
  // The backend allocates the plan's bytes: the last byte can be written, the one after cannot.
  const std::unique_ptr<Task> owned = compiled_task(shard.params, OptimizerKind::kAdamW, {1, 2});
  Task& task = *owned;
  const uint64_t bytes = task.plan().arena_bytes();
  const MemoryPlan whole(shard.params, plan_config_from_optimizer(OptimizerKind::kAdamW));
  ASSERT_LT(bytes, whole.arena_bytes());
  const char zero = 0;
  EXPECT_NO_THROW(task.backend().upload(bytes - 1, &zero, 1));
  EXPECT_THROW(task.backend().upload(bytes, &zero, 1), Error);
}

// Every element of the held slices (addressed as the kernels do: region offset + 4 * element)
// lies inside the arena, 256-byte congruent with the whole plan, and overlaps no other region.
TEST(ShardMemory, HeldSlicesOverlapNothingElse) {
  const Layout shard = load_layout_file(kShardLayout);
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kLamb}) {
    const MemoryPlan whole(shard.params, plan_config_from_optimizer(kind));
    for (int K = 2; K <= 4; ++K) {
      for (int r = 0; r < K; ++r) {
        SCOPED_TRACE(std::string(kind_info(kind).name) + " rank " + std::to_string(r) + " of " + std::to_string(K));
        const MemoryPlan plan(shard.params, slice_plan_config(whole, {r, K}));
        ASSERT_TRUE(plan.state_sliced());
        const uint64_t b = plan.state_begin(), e = plan.state_end();
        ASSERT_LT(b, e);
        std::vector<std::pair<uint64_t, uint64_t>> held, others;
        for (Family f : {Family::kM, Family::kV}) {
          const uint64_t base = plan.region(family_region(f, Role::kBnBias)).offset;
          const uint64_t whole_base = whole.region(family_region(f, Role::kBnBias)).offset;
          EXPECT_EQ((base + 4 * b) % 256, (whole_base + 4 * b) % 256) << "alignment kept";
          held.push_back({base + 4 * b, base + 4 * e});
          EXPECT_LE(base + 4 * e, plan.arena_bytes());
        }
        for (int reg = 0; reg < kNumRegions; ++reg) {
          const RegionInfo& info = plan.region(static_cast<Region>(reg));
          if (!info.allocated || info.count == 0) continue;
          if (is_family_region(static_cast<Region>(reg)) &&
              (family_of(static_cast<Region>(reg)) == Family::kM || family_of(static_cast<Region>(reg)) == Family::kV)) {
            continue;
          }
          others.push_back({info.offset, info.offset + info.count * info.elem_size});
        }
        auto overlap = [](std::pair<uint64_t, uint64_t> x, std::pair<uint64_t, uint64_t> y) {
          return x.first < y.second && y.first < x.second;
        };
        EXPECT_FALSE(overlap(held[0], held[1])) << "M and V slices overlap";
        for (const auto& h : held) {
          for (const auto& o : others) EXPECT_FALSE(overlap(h, o)) << "[" << h.first << ", " << h.second << ") vs [" << o.first << ", " << o.second << ")";
        }
      }
    }
  }
}

// Slices the partition may not produce today (cuts inside 64-element blocks, a one-element
// slice, one ending inside padding): the storage starts at the 64-element boundary below the
// slice, so every held element keeps the byte alignment it has in the whole plan, the arena
// shrinks by what is not held, and the held elements overlap nothing else.
TEST(ShardMemory, OddSlicesKeepAlignment) {
  const Layout shard = load_layout_file(kShardLayout);
  const PlanConfig base = plan_config_from_optimizer(OptimizerKind::kAdamW);
  const MemoryPlan whole(shard.params, base);
  const uint64_t F = family_elements(shard.params);
  for (const auto& slice : std::vector<std::pair<uint64_t, uint64_t>>{{1001, 50001}, {63, 64}, {65, F - 1}, {0, 129}}) {
    SCOPED_TRACE("[" + std::to_string(slice.first) + ", " + std::to_string(slice.second) + ")");
    PlanConfig config = base;
    config.state_begin = slice.first;
    config.state_end = slice.second;
    const MemoryPlan plan(shard.params, config);
    const uint64_t held = round_up(slice.second - slice.first / 64 * 64, 64);
    EXPECT_EQ(plan.arena_bytes(), whole.arena_bytes() - 2 * 4 * (F - held));
    for (Family f : {Family::kM, Family::kV}) {
      const Region r = family_region(f, Role::kBnBias);
      for (uint64_t e : {slice.first, slice.second - 1}) {
        EXPECT_EQ((plan.region(r).offset + 4 * e) % 256, (whole.region(r).offset + 4 * e) % 256) << "element " << e;
      }
      // The held bytes end inside the arena and after W and G (nothing before them is M/V).
      EXPECT_LE(plan.region(r).offset + 4 * slice.second, plan.arena_bytes());
      const Span g = plan.region_range(G_BN_BIAS, G_DEEP_CONV);
      EXPECT_GE(plan.region(r).offset + 4 * slice.first, g.offset + 4 * g.count);
    }
  }
  PlanConfig bad = base;
  bad.state_begin = 10;
  bad.state_end = F + 1;
  EXPECT_THROW(MemoryPlan(shard.params, bad), Error);
  bad.state_begin = 11;
  bad.state_end = 10;
  EXPECT_THROW(MemoryPlan(shard.params, bad), Error);
}

// A rank holding a slice refuses what needs M or V whole, and says where to go instead.
TEST(ShardMemory, WholeStateOperationsRefuseOnASlicedRank) {
  const Layout shard = load_layout_file(kShardLayout);
  const std::unique_ptr<Task> owned = compiled_task(shard.params, OptimizerKind::kAdamW, {1, 2});
  Task& task = *owned;
  ASSERT_TRUE(task.plan().state_sliced());
  auto expect_refused = [](auto&& call, const char* what) {
    try {
      call();
      ADD_FAILURE() << what << " did not refuse";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("ShardedStep"), std::string::npos) << what << ": " << e.what();
    }
  };
  expect_refused([&] { task.step(); }, "step()");
  expect_refused([&] { task.timed_steps(1); }, "timed_steps()");
  expect_refused([&] { task.fingerprint(); }, "fingerprint()");
  expect_refused([&] { task.save(std::string(RENAISSANCE_SOURCE_DIR) + "/never-written.ckpt"); }, "save()");
  // bn1.bias is the first tensor of the family: rank 1 of 2 does not hold it.
  const size_t outside = task.find("bn1.bias");
  std::vector<float> buffer(64);
  expect_refused([&] { task.read(Family::kM, outside, buffer.data()); }, "read(M) outside the slice");
  expect_refused([&] { task.read(Family::kV, outside, buffer.data()); }, "read(V) outside the slice");
  // A tensor inside the slice reads back what was written.
  const MemoryPlan& plan = task.plan();
  bool found = false;
  for (size_t id = 0; id < task.num_params(); ++id) {
    const uint64_t n = static_cast<uint64_t>(plan.tensor(id).numel);
    if (n == 0 || !plan.holds_state(plan.tensor(id).offset_in_family, n)) continue;
    found = true;
    std::vector<float> in(n), out(n);
    for (uint64_t i = 0; i < n; ++i) in[i] = static_cast<float>(i) * 0.5f + 1.0f;
    task.write(Family::kV, id, in.data());
    task.read(Family::kV, id, out.data());
    EXPECT_EQ(in, out) << shard.params[id].name;
  }
  EXPECT_TRUE(found) << "rank 1 of 2 holds some whole tensor";
}

// Every rank loads the one checkpoint and keeps its slice: what it holds equals the saved state.
TEST(ShardMemory, LoadKeepsEachRanksSlice) {
  const Layout shard = load_layout_file(kShardLayout);
  const std::unique_ptr<Task> owned = compiled_task(shard.params, OptimizerKind::kAdamW, {});
  Task& whole = *owned;
  whole.synthesize_weights(11, 0, 0.05f);
  for (uint64_t t = 0; t < 3; ++t) {
    whole.synthesize_gradients(5, t, 0.01f);
    whole.step();
  }
  const std::string path = testing_util::unique_temp_path("shard_memory_load.ckpt");
  whole.save(path);
  for (int K : {2, 3}) {
    for (int r = 0; r < K; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(K));
      const std::unique_ptr<Task> rank_owned = compiled_task(shard.params, OptimizerKind::kAdamW, {r, K});
      Task& rank = *rank_owned;
      rank.load(path);
      const MemoryPlan& plan = rank.plan();
      for (size_t id = 0; id < rank.num_params(); ++id) {
        const uint64_t n = static_cast<uint64_t>(plan.tensor(id).numel);
        std::vector<float> a(n), b(n);
        whole.read(Family::kW, id, a.data());
        rank.read(Family::kW, id, b.data());
        EXPECT_EQ(a, b) << "W of " << shard.params[id].name;
      }
      // The held elements, addressed as the kernels address them (region + 4 * element): a
      // slice may hold no whole tensor.
      const uint64_t b = plan.state_begin(), e = plan.state_end();
      ASSERT_LT(b, e);
      for (Family f : {Family::kM, Family::kV}) {
        const Region first = family_region(f, Role::kBnBias);
        std::vector<float> want(e - b), got(e - b);
        whole.backend().download(whole.plan().region(first).offset + 4 * b, want.data(), 4 * (e - b));
        rank.backend().download(plan.region(first).offset + 4 * b, got.data(), 4 * (e - b));
        EXPECT_EQ(want, got) << family_name(f) << " of the slice";
        EXPECT_NE(want, std::vector<float>(e - b, 0.0f)) << "the state was not trivial";
      }
      EXPECT_EQ(rank.step_count(), 3);
    }
  }
  std::remove(path.c_str());
}

// A world of one with state_shard {0, 1} holds the whole state and steps as Task::step does.
TEST(ShardMemory, WorldOfOneHoldsEverything) {
  const Layout shard = load_layout_file(kShardLayout);
  const std::unique_ptr<Task> plain_owned = compiled_task(shard.params, OptimizerKind::kAdamW, {});
  const std::unique_ptr<Task> one_owned = compiled_task(shard.params, OptimizerKind::kAdamW, {0, 1});
  Task& plain = *plain_owned;
  Task& one = *one_owned;
  EXPECT_FALSE(one.plan().state_sliced());
  EXPECT_EQ(one.plan().arena_bytes(), plain.plan().arena_bytes());
  auto comm = make_local_communicator();
  ShardedStep step(one, *comm, GradReduce::kOrdered);
  for (Task* t : {&plain, &one}) t->synthesize_weights(3, 0, 0.05f);
  for (uint64_t t = 0; t < 3; ++t) {
    plain.synthesize_gradients(8, t, 0.01f);
    one.synthesize_gradients(8, t, 0.01f);
    plain.step();
    step.step();
  }
  EXPECT_EQ(step.fingerprint(), plain.fingerprint());
  EXPECT_EQ(one.fingerprint(), plain.fingerprint());
}

TEST(ShardMemory, RefusesARankOutsideItsWorld) {
  const Layout shard = load_layout_file(kShardLayout);
  EXPECT_THROW(compiled_task(shard.params, OptimizerKind::kAdamW, {2, 2}), Error);
  EXPECT_THROW(compiled_task(shard.params, OptimizerKind::kAdamW, {-1, 2}), Error);
}

// Hyperparameter groups (H = 2) in a world of one with state_shard {0, 1}: the sharded step
// steps as Task::step does, and its fingerprint of one group's tensors (ShardedStep::
// fingerprint(ids), read through the collective state reads) is Task::fingerprint(ids).
TEST(ShardMemory, WorldOfOneWithHyperparameterGroups) {
  Layout shard = load_layout_file(kShardLayout);
  std::vector<size_t> group_ids[2];
  for (size_t i = 0; i < shard.params.size(); ++i) {
    shard.params[i].hyper_group = static_cast<int>(i % 2);
    group_ids[i % 2].push_back(i);
  }
  auto grouped = [&](StateShard state_shard) {
    TaskOptions options;
    options.backend = BackendKind::kCpu;
    options.backend_options.threads = 1;
    options.state_shard = state_shard;
    auto task = std::make_unique<Task>(shard.params, options);
    task->optimizer_groups({AdamW().lr(1e-3).config(), AdamW().lr(2e-3).weight_decay(0.1).config()});
    task->compile();
    task->synthesize_weights(3, 0, 0.05f);
    return task;
  };
  const std::unique_ptr<Task> plain = grouped({});
  const std::unique_ptr<Task> one = grouped({0, 1});
  auto comm = make_local_communicator();
  ShardedStep step(*one, *comm, GradReduce::kOrdered);
  for (uint64_t t = 0; t < 3; ++t) {
    plain->synthesize_gradients(8, t, 0.01f);
    one->synthesize_gradients(8, t, 0.01f);
    plain->step();
    step.step();
  }
  EXPECT_EQ(step.fingerprint(), plain->fingerprint());
  for (const std::vector<size_t>& ids : group_ids) {
    EXPECT_EQ(step.fingerprint(ids), plain->fingerprint(ids));
    EXPECT_NE(step.fingerprint(ids), plain->fingerprint()) << "a group's fingerprint covers its tensors only";
  }
  EXPECT_EQ(one->step_count(), 3);
}

}  // namespace
}  // namespace renaissance
