// MemoryPlan: families allocated per optimizer kind, alignment, contiguity and zero padding.
#include <gtest/gtest.h>

#include <vector>

#include "renaissance/error.h"
#include "renaissance/plan.h"
#include "renaissance/task.h"
#include "support/test_util.h"
#include "support/kind_columns.h"

namespace renaissance {
namespace {

std::vector<ParamSpec> odd_params() {
  return {{"a", {3, 5}, Role::kDeepConv}, {"b", {7}, Role::kBnBias},   {"c", {0}, Role::kFcWeight},
          {"d", {17}, Role::kBnWeight},   {"e", {1}, Role::kFcBias},   {"f", {4097}, Role::kFirstConv},
          {"g", {1023}, Role::kDeepConv}};
}

TEST(MemoryPlan, AllocatesOnlyTheFamiliesTheKindNeeds) {
  struct Want { OptimizerKind kind; bool m, v, n; };
  const Want wants[] = {{OptimizerKind::kSgd, false, false, false},
                        {OptimizerKind::kSgdMomentum, true, false, false},
                        {OptimizerKind::kSgdNesterov, true, false, false},
                        {OptimizerKind::kAdam, true, true, false},
                        {OptimizerKind::kAdamW, true, true, false},
                        {OptimizerKind::kLars, true, false, true},
                        {OptimizerKind::kLarsNesterov, true, false, true}};
  for (const Want& w : wants) {
    MemoryPlan plan(odd_params(), plan_config_from_optimizer(w.kind));
    SCOPED_TRACE(optimizer_kind_name(w.kind));
    EXPECT_TRUE(plan.has_family(Family::kW));
    EXPECT_TRUE(plan.has_family(Family::kG));
    EXPECT_EQ(plan.has_family(Family::kM), w.m);
    EXPECT_EQ(plan.has_family(Family::kV), w.v);
    EXPECT_EQ(plan.has_family(Family::kN), w.n);
    EXPECT_EQ(plan.region(T_NORM_TILES).allocated, w.n);
  }
}

TEST(MemoryPlan, FamiliesAreAlignedAndTensorsPaired) {
  MemoryPlan plan(odd_params(), plan_config_from_optimizer(OptimizerKind::kAdam));
  for (int r = 0; r < kNumRegions; ++r) {
    const RegionInfo& info = plan.region(static_cast<Region>(r));
    if (!info.allocated || family_of(static_cast<Region>(r)) == Family::kN) continue;
    EXPECT_EQ(info.offset % kRegionAlignBytes, 0u) << region_name(static_cast<Region>(r));
  }
  // Tensor i sits at the same relative position in W, G, M and V.
  for (size_t id = 0; id < plan.num_params(); ++id) {
    const uint64_t w = plan.tensor_offset(Family::kW, id) - plan.region(W_BN_BIAS).offset;
    EXPECT_EQ(plan.tensor_offset(Family::kG, id) - plan.region(G_BN_BIAS).offset, w);
    EXPECT_EQ(plan.tensor_offset(Family::kM, id) - plan.region(M_BN_BIAS).offset, w);
    EXPECT_EQ(plan.tensor_offset(Family::kV, id) - plan.region(V_BN_BIAS).offset, w);
  }
  // Each group is one contiguous span made of its three regions.
  const Span bias = plan.region_range(W_BN_BIAS, W_FC_BIAS);
  EXPECT_EQ(bias.offset, plan.region(W_BN_BIAS).offset);
  EXPECT_EQ(bias.count, plan.region(W_BN_BIAS).count + plan.region(W_BN_WEIGHT).count + plan.region(W_FC_BIAS).count);
  EXPECT_EQ(plan.region_range(W_FC_WEIGHT, W_DEEP_CONV).offset, plan.region(W_FC_WEIGHT).offset);
  EXPECT_THROW(plan.region_range(W_BN_BIAS, G_BN_BIAS), Error);
  EXPECT_EQ(plan.get_ids_by_region(W_DEEP_CONV), (std::vector<size_t>{0, 6}));
  EXPECT_EQ(plan.get_ids_by_region(M_DEEP_CONV), (std::vector<size_t>{0, 6}));
  EXPECT_EQ(MemoryPlan::paired(W_FIRST_CONV, Family::kV), V_FIRST_CONV);
}

class PaddingTest : public ::testing::TestWithParam<OptimizerKind> {};

TEST_P(PaddingTest, PaddingStaysZeroUnderUpdates) {
  TaskOptions options;
  options.backend = BackendKind::kCpu;
  Task task(odd_params(), options);
  OptimizerConfig c;
  c.kind = GetParam();
  c.momentum = 0.9;
  c.weight_decay = 0.01;
  task.optimizer(testing_util::unread_columns_at_defaults(c));
  task.compile();
  for (size_t id = 0; id < task.num_params(); ++id) {
    std::vector<float> w(static_cast<size_t>(task.param(id).numel()), 0.75f);
    task.set_weight(id, w.data());
  }
  for (int s = 0; s < 3; ++s) {
    task.synthesize_gradients(7, static_cast<uint64_t>(s), 0.5f);
    task.step();
  }
  const MemoryPlan& plan = task.plan();
  std::vector<char> covered(plan.arena_bytes() / sizeof(float), 0);
  for (Family f : {Family::kW, Family::kG, Family::kM, Family::kV}) {
    if (!plan.has_family(f)) continue;
    for (size_t id = 0; id < plan.num_params(); ++id) {
      const uint64_t first = plan.tensor_offset(f, id) / sizeof(float);
      for (int64_t i = 0; i < plan.tensor(id).numel; ++i) covered[first + static_cast<uint64_t>(i)] = 1;
    }
  }
  const float* arena = static_cast<const float*>(task.backend().arena());
  for (Family f : {Family::kW, Family::kG, Family::kM, Family::kV}) {
    if (!plan.has_family(f)) continue;
    const Span span = plan.region_range(family_region(f, Role::kBnBias), family_region(f, Role::kDeepConv));
    for (uint64_t i = span.offset / sizeof(float); i < span.offset / sizeof(float) + span.count; ++i) {
      if (!covered[i]) {
        ASSERT_EQ(testing_util::float_bits(arena[i]), 0u) << family_name(f) << " padding at " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, PaddingTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kSgdMomentum,
                                           OptimizerKind::kSgdNesterov, OptimizerKind::kAdam,
                                           OptimizerKind::kAdamW, OptimizerKind::kLars,
                                           OptimizerKind::kLarsNesterov),
                         [](const ::testing::TestParamInfo<OptimizerKind>& info) {
                           return std::string(optimizer_kind_name(info.param));
                         });

}  // namespace
}  // namespace renaissance
