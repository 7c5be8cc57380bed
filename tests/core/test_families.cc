// The family table (region.h): each row's facts as the checkpoint format, torch and the memory
// plan fix them (written out here, not read from the table), and the plan's placement in its order;
// the kind table's torch_m column (kinds.h) and the torch state keys both tables give each kind.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/kinds.h"
#include "renaissance/plan.h"
#include "renaissance/region.h"

namespace renaissance {
namespace {

std::string text(const char* s) { return s == nullptr ? "-" : s; }

TEST(FamilyTable, RowsMatchTheCheckpointFormatAndTorch) {
  struct Want {
    Family family;
    const char* name;
    const char* tag;  // docs/checkpoint-format.md
    const char* torch;
    const char* torch_momentum;
    bool state, per_tensor;
  };
  const Want wants[] = {
      {Family::kW, "W", "FAMW", nullptr, nullptr, false, false},
      {Family::kG, "G", nullptr, nullptr, nullptr, false, false},
      {Family::kM, "M", "FAMM", "exp_avg", "momentum_buffer", true, false},
      {Family::kV, "V", "FAMV", "exp_avg_sq", nullptr, true, false},
      {Family::kN, "N", "FAMN", nullptr, nullptr, false, true},
      {Family::kVmax, "VMAX", "FAMX", "max_exp_avg_sq", nullptr, true, false},
  };
  ASSERT_EQ(sizeof(wants) / sizeof(wants[0]), static_cast<size_t>(kNumFamilies));
  for (const Want& w : wants) {
    const FamilyInfo& f = family_info(w.family);
    SCOPED_TRACE(w.name);
    EXPECT_EQ(text(f.name), w.name);
    EXPECT_EQ(text(family_name(w.family)), w.name);
    EXPECT_EQ(text(f.checkpoint_tag), text(w.tag));
    EXPECT_EQ(text(f.torch_state), text(w.torch));
    EXPECT_EQ(text(f.torch_state_momentum), text(w.torch_momentum));
    EXPECT_EQ(f.optimizer_state, w.state);
    EXPECT_EQ(f.extent == FamilyExtent::kPerTensor, w.per_tensor);
    EXPECT_EQ(f.elem_bytes, 4u);
    Family parsed = Family::kG;
    ASSERT_TRUE(parse_family(w.name, &parsed));
    EXPECT_EQ(parsed, w.family);
  }
  Family unused;
  EXPECT_FALSE(parse_family("C", &unused));
  EXPECT_FALSE(parse_family("m", &unused));
}

// The order of the families in a file and in the fingerprint: W, M, V, VMAX, N (G in neither),
// the order every checkpoint and golden fingerprint was written in.
TEST(FamilyTable, OrderIsTheFileAndFingerprintOrder) {
  std::vector<std::string> file, hashed;
  for (Family f : kFamiliesInOrder) {
    if (family_info(f).checkpoint_tag != nullptr) file.push_back(family_info(f).checkpoint_tag);
    if (family_info(f).step_state) hashed.push_back(family_name(f));
  }
  EXPECT_EQ(file, (std::vector<std::string>{"FAMW", "FAMM", "FAMV", "FAMX", "FAMN"}));
  EXPECT_EQ(hashed, (std::vector<std::string>{"W", "M", "V", "VMAX"}));
}

// The arena: W, G, then M, V, VMAX one after another (VMAX right after V), region names by family.
TEST(FamilyTable, PlanPlacesVmaxRightAfterV) {
  const std::vector<ParamSpec> params = {{"a", {3, 5}, Role::kDeepConv}, {"b", {7}, Role::kBnBias},
                                         {"f", {4097}, Role::kFirstConv}};
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdam;
  config.amsgrad = true;
  const MemoryPlan plan(params, plan_config_from_optimizer(config));
  ASSERT_TRUE(plan.has_family(Family::kVmax));
  const Span w = plan.region_range(W_BN_BIAS, W_DEEP_CONV), g = plan.region_range(G_BN_BIAS, G_DEEP_CONV);
  const Span m = plan.region_range(M_BN_BIAS, M_DEEP_CONV), v = plan.region_range(V_BN_BIAS, V_DEEP_CONV);
  const Span x = plan.region_range(VMAX_BN_BIAS, VMAX_DEEP_CONV);
  EXPECT_EQ(w.offset, 0u);
  EXPECT_EQ(g.offset, w.offset + w.count * 4);
  EXPECT_EQ(m.offset, g.offset + g.count * 4);
  EXPECT_EQ(v.offset, m.offset + m.count * 4);
  EXPECT_EQ(x.offset, v.offset + v.count * 4);
  EXPECT_EQ(x.count, v.count);
  EXPECT_STREQ(region_name(VMAX_FC_WEIGHT), "VMAX_FC_WEIGHT");
  EXPECT_STREQ(region_name(N_DEEP_CONV), "N_DEEP_CONV");
  EXPECT_STREQ(region_name(S_SCALAR_FP32), "S_SCALAR_FP32");
}

// What torch calls each kind's M (torch.optim.SGD, Muon: momentum_buffer; Adam, AdamW: exp_avg;
// LARS, Lion, LAMB follow their torch-style counterparts), written out per kind.
TEST(KindTable, TorchMOfEveryKind) {
  const std::pair<const char*, TorchM> wants[] = {
      {"sgd", TorchM::kMomentumBuffer},
      {"sgd_momentum", TorchM::kMomentumBuffer},
      {"sgd_nesterov", TorchM::kMomentumBuffer},
      {"adam", TorchM::kExpAvg},
      {"adamw", TorchM::kExpAvg},
      {"lars", TorchM::kMomentumBuffer},
      {"lars_nesterov", TorchM::kMomentumBuffer},
      {"lion", TorchM::kExpAvg},
      {"lamb", TorchM::kExpAvg},
      {"muon", TorchM::kMomentumBufferInWeightGroup},
  };
  ASSERT_EQ(sizeof(wants) / sizeof(wants[0]), static_cast<size_t>(kNumOptimizerKinds));
  for (size_t i = 0; i < sizeof(wants) / sizeof(wants[0]); ++i) {
    SCOPED_TRACE(wants[i].first);
    EXPECT_EQ(text(kKindTable[i].name), wants[i].first);
    EXPECT_EQ(static_cast<int>(kKindTable[i].torch_m), static_cast<int>(wants[i].second));
  }
}

// torch's state keys of each kind's groups (torch.optim's names; "step" is no family), written out.
TEST(KindTable, TorchStateKeysOfEveryKindAndGroup) {
  auto keys = [](OptimizerKind kind, Group group, bool amsgrad) {
    std::vector<std::string> out;
    for (const TorchStateKey& k : torch_state_keys(kind, group, amsgrad)) {
      out.push_back(std::string(family_name(k.family)) + "=" + k.key);
    }
    return out;
  };
  using V = std::vector<std::string>;
  const V momentum = {"M=momentum_buffer"}, adam = {"M=exp_avg", "V=exp_avg_sq"};
  const V amsgrad = {"M=exp_avg", "V=exp_avg_sq", "VMAX=max_exp_avg_sq"};
  const struct {
    OptimizerKind kind;
    V weight, bias_like;
  } wants[] = {
      {OptimizerKind::kSgd, {}, {}},
      {OptimizerKind::kSgdMomentum, momentum, momentum},
      {OptimizerKind::kSgdNesterov, momentum, momentum},
      {OptimizerKind::kAdam, adam, adam},
      {OptimizerKind::kAdamW, adam, adam},
      {OptimizerKind::kLars, momentum, momentum},
      {OptimizerKind::kLarsNesterov, momentum, momentum},
      {OptimizerKind::kLion, {"M=exp_avg"}, {"M=exp_avg"}},
      {OptimizerKind::kLamb, adam, adam},
      // torch.optim.Muon keeps the momentum buffer alone; the aux AdamW its two moments.
      {OptimizerKind::kMuon, momentum, adam},
  };
  ASSERT_EQ(sizeof(wants) / sizeof(wants[0]), static_cast<size_t>(kNumOptimizerKinds));
  for (const auto& w : wants) {
    SCOPED_TRACE(kind_info(w.kind).name);
    EXPECT_EQ(keys(w.kind, Group::kWeight, false), w.weight);
    EXPECT_EQ(keys(w.kind, Group::kBiasLike, false), w.bias_like);
  }
  for (OptimizerKind k : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    EXPECT_EQ(keys(k, Group::kWeight, true), amsgrad);
    EXPECT_EQ(keys(k, Group::kBiasLike, true), amsgrad);
  }
  // amsgrad is Adam's and AdamW's only (the hyperparameter table's rule).
  for (OptimizerKind k : {OptimizerKind::kSgdMomentum, OptimizerKind::kLamb, OptimizerKind::kMuon}) {
    EXPECT_THROW(torch_state_keys(k, Group::kWeight, true), Error);
  }
}

}  // namespace
}  // namespace renaissance
