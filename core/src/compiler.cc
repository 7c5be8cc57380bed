// The compiler: turns (MemoryPlan, optimizer config) into the step graphs of DESIGN.md §2.
// A step is: the non-finite check over the whole G family, the step counter (and Adam bias
// corrections), the LARS norms and trust ratios when the kind needs them, then one update node
// per non-empty group. The node count depends on the kind, never on the number of tensors.
#include "renaissance/error.h"
#include "renaissance/graph.h"

namespace renaissance {

namespace {

RangeOp update_op(OptimizerKind kind, Group group) {
  switch (kind) {
    case OptimizerKind::kSgd: return RangeOp::UPDATE_SGD;
    case OptimizerKind::kSgdMomentum: return RangeOp::UPDATE_SGD_MOMENTUM;
    case OptimizerKind::kSgdNesterov: return RangeOp::UPDATE_SGD_NESTEROV;
    case OptimizerKind::kAdam: return RangeOp::UPDATE_ADAM;
    case OptimizerKind::kAdamW: return RangeOp::UPDATE_ADAMW;
    // LARS adapts only the weight group; bias-like parameters get plain momentum with wd = 0.
    case OptimizerKind::kLars:
      return group == Group::kWeight ? RangeOp::UPDATE_LARS : RangeOp::UPDATE_SGD_MOMENTUM;
    case OptimizerKind::kLarsNesterov:
      return group == Group::kWeight ? RangeOp::UPDATE_LARS_NESTEROV : RangeOp::UPDATE_SGD_NESTEROV;
  }
  throw_invalid("unknown optimizer kind");
}

Span region_span(const MemoryPlan& plan, Region r) {
  const RegionInfo& info = plan.region(r);
  return Span{info.offset, info.count};
}

}  // namespace

CompiledStep compile_step(const MemoryPlan& plan, const OptimizerConfig& config, bool check_finite) {
  config.validate();
  const PlanConfig need = plan_config_from_optimizer(config.kind);
  if (need.has_m != plan.config().has_m || need.has_v != plan.config().has_v ||
      need.has_n != plan.config().has_n) {
    throw_invalid(std::string("the memory plan was not made for ") + optimizer_kind_name(config.kind));
  }

  CompiledStep step;
  step.check_finite = check_finite;
  step.scalars_f32 = region_span(plan, S_SCALAR_FP32);
  step.scalars_i32 = region_span(plan, S_SCALAR_INT32);
  step.scalars_f64 = region_span(plan, S_SCALAR_FP64);
  const bool lars = need.has_n;
  if (lars) {
    step.lars_partials = region_span(plan, T_TEMP_FP64);
    step.lars_tiles = region_span(plan, T_LARS_TILES);
    step.lars_tensors = region_span(plan, T_LARS_TENSORS);
  }
  step.weight_group_count = plan.group_span(Family::kW, Group::kWeight).count;

  auto& pre = step.graphs[static_cast<int>(GraphId::kPreStep)];
  if (check_finite) {
    GraphNode check;
    check.kind = NodeKind::kRange;
    check.range_op = RangeOp::CHECK_FINITE;
    check.g = plan.region_range(G_BN_BIAS, G_DEEP_CONV);
    pre.push_back(check);
  }
  GraphNode advance;
  advance.kind = NodeKind::kCompute;
  advance.compute_op = ComputeOp::ADVANCE_STEP;
  advance.bias_correction = config.kind == OptimizerKind::kAdam || config.kind == OptimizerKind::kAdamW;
  pre.push_back(advance);

  auto group_node = [&](Group group) {
    GraphNode node;
    node.group = group;
    node.weight_decay_mode = config.weight_decay_mode;
    node.w = plan.group_span(Family::kW, group);
    node.g = plan.group_span(Family::kG, group);
    if (need.has_m) node.m = plan.group_span(Family::kM, group);
    if (need.has_v) node.v = plan.group_span(Family::kV, group);
    if (need.has_n) node.n = plan.group_span(Family::kN, group);
    return node;
  };

  const bool has_weight_tiles = lars && !plan.lars_tiles().empty();
  if (has_weight_tiles) {
    auto& norms = step.graphs[static_cast<int>(GraphId::kLarsNorms)];
    GraphNode tile_norms = group_node(Group::kWeight);
    tile_norms.range_op = RangeOp::LARS_TILE_NORMS;
    norms.push_back(tile_norms);
    GraphNode ratio = group_node(Group::kWeight);
    ratio.kind = NodeKind::kCompute;
    ratio.compute_op = ComputeOp::LARS_TRUST_RATIO;
    norms.push_back(ratio);
  }

  auto& opt = step.graphs[static_cast<int>(GraphId::kOptimizer)];
  for (Group group : {Group::kWeight, Group::kBiasLike}) {
    GraphNode node = group_node(group);
    if (node.w.count == 0) continue;
    // A LARS weight group with only zero-size tensors has no tiles and nothing to update.
    if (lars && group == Group::kWeight && !has_weight_tiles) continue;
    node.range_op = update_op(config.kind, group);
    // The two groups touch disjoint memory: the CUDA backend may run them concurrently.
    node.stream = group == Group::kWeight ? StreamKind::kUpdate : StreamKind::kComp1;
    opt.push_back(node);
  }
  return step;
}

}  // namespace renaissance
