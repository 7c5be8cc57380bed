// The compiler: turns (MemoryPlan, optimizer config) into the step graphs (docs/design.md).
// A step is: the non-finite check over the whole G family (fused with the tile partials of the
// global gradient norm and followed by the clip coefficient when max_grad_norm > 0), the step
// counter (and Adam bias corrections), the kind's norm pass when kKindTable asks for one, then one update node per
// non-empty group. The node count depends on the kind, never on the number of tensors.
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/graph.h"

namespace renaissance {

namespace {

Span region_span(const MemoryPlan& plan, Region r) {
  const RegionInfo& info = plan.region(r);
  return Span{info.offset, info.count};
}

// TaskOptions::gradient_table: the node reads G span node.g (the span of `view`) through
// S_GRAD_TABLE, with the plan's tensor table and chunk addresses of that view (graph.h).
void attach_grad_table(const MemoryPlan& plan, GraphNode& node, TableView view) {
  if (!plan.config().gradient_table) return;
  node.grad.table = region_span(plan, S_GRAD_TABLE);
  node.grad.tensors = plan.tensor_table(view);
  node.grad.chunk_addresses = plan.grad_chunk_addresses(view);
}

// read_mask false: compile_unmasked_step (graph.h), the program of a tensor_mask plan while no
// tensor is masked: the check and the updates do not read the mask (H = 1: no items either).
CompiledStep compile(const MemoryPlan& plan, const OptimizerConfig& config, bool check_finite,
                     const PrecisionOptions& precision, bool read_mask) {
  config.validate();
  if (precision.precision != plan.config().precision) {
    throw_invalid(std::string("the memory plan was not made for precision ") + precision_name(precision.precision));
  }
  if (precision.model_dtype_gradients != plan.config().model_dtype_gradients) {
    throw_invalid("the memory plan's gradient dtype differs from the precision options' model_dtype_gradients");
  }
  // Every node that reads G carries its encoding.
  const Precision grad_dtype = gradient_precision(precision);
  if (!precision_combination_valid(grad_dtype, precision.precision, precision.rounding)) {
    throw_invalid(std::string("no step has gradients in ") + precision_name(grad_dtype) + " with model copy " +
                  precision_name(precision.precision) + " rounded " + rounding_name(precision.rounding) +
                  " (stochastic rounding needs a bf16 or fp16 model copy)");
  }
  const PlanConfig need = plan_config_from_optimizer(config);
  for (const FamilyInfo& f : kFamilyTable) {
    if (need.has(f.family) == plan.config().has(f.family)) continue;
    if (f.need != FamilyNeed::kAmsgrad) {
      throw_invalid(std::string("the memory plan was not made for ") + optimizer_kind_name(config.kind));
    }
    throw_invalid(std::string("the memory plan was made ") + (plan.config().has(f.family) ? "with" : "without") +
                  " the " + f.name + " family, the configuration has amsgrad " + (config.amsgrad ? "on" : "off"));
  }
  if (need.muon_mode != plan.config().muon_mode) {
    throw_invalid("the memory plan was made for muon_mode " + std::to_string(plan.config().muon_mode) +
                  ", the configuration has muon_mode " + std::to_string(need.muon_mode));
  }

  const bool mask = plan.config().tensor_mask;
  const Span tensor_state = mask ? region_span(plan, S_TENSOR_INT32) : Span{};
  // What the check and the updates read: the mask, and (H = 1) the per-tensor items it needs.
  const Span update_state = read_mask ? tensor_state : Span{};
  const bool items = plan.config().hyper_groups > 1 || (mask && read_mask);
  const int blocks = plan.scalar_blocks();

  CompiledStep step;
  step.check_finite = check_finite;
  step.scalars_f32 = region_span(plan, S_SCALAR_FP32);
  step.scalars_i32 = region_span(plan, S_SCALAR_INT32);
  step.scalars_f64 = region_span(plan, S_SCALAR_FP64);
  const KindInfo& kind = kind_info(config.kind);
  // The norm pass covers the weight group; its tables travel in every node that reads them.
  NormDesc norm_tables;
  if (kind.norm != NormPass::kNone) {
    norm_tables.tiles = region_span(plan, T_NORM_TILES);
    norm_tables.tensors = region_span(plan, T_NORM_TENSORS);
    norm_tables.partials = region_span(plan, T_NORM_PARTIALS);
  }

  // A pre-step node over the whole G family: the non-finite check, or the clip norm's partials
  // (fused with the check). With tensor_mask (and read_mask) it walks each group's items over that
  // group's G span and skips the masked tensors: the partials read their elements as +0.0 (torch's
  // clip_grad_norm_ sees only the parameters that have a .grad) and keep their canonical tile
  // order, so the bits are those of the same step with that G zeroed.
  auto g_family_node = [&](RangeOp op) {
    GraphNode node;
    node.kind = NodeKind::kRange;
    node.range_op = op;
    node.span(Family::kG) = plan.region_range(G_BN_BIAS, G_DEEP_CONV);
    node.grad.encoding = grad_dtype;
    if (mask && read_mask) {
      node.work.tensor_state = tensor_state;
      for (Group group : {Group::kBiasLike, Group::kWeight}) {
        node.work.group_g[static_cast<int>(group)] = plan.group_span(Family::kG, group);
        node.work.group_items[static_cast<int>(group)] = plan.hyper_item_span(group);
      }
    }
    attach_grad_table(plan, node, TableView::kFamily);
    return node;
  };
  auto& pre = step.graphs[static_cast<int>(GraphId::kPreStep)];
  step.clip = config.max_grad_norm > 0.0;
  if (step.clip) {
    // One read of G for both the check and the norm (docs/math.md, "Gradient-norm clipping").
    GraphNode partials = g_family_node(RangeOp::GRAD_NORM_PARTIALS);
    partials.norm.partials = region_span(plan, T_GRAD_NORM_PARTIALS);
    partials.flags.check_finite = check_finite;
    pre.push_back(partials);
    partials.grad.table = Span{};  // the coefficient reads no G
    partials.grad.tensors = TensorTable{};
    partials.grad.chunk_addresses = Span{};
    // The coefficient's node also advances the step (as ADVANCE_STEP would): one launch less,
    // so clipping adds no launch to the step.
    partials.work.hyper_groups = blocks;
    GraphNode coefficient = partials;
    coefficient.kind = NodeKind::kCompute;
    coefficient.compute_op = ComputeOp::CLIP_COEFFICIENT;
    coefficient.flags.bias_correction = kind.bias_correction;
    // tensor_mask: the per-tensor counts advance as ADVANCE_STEP advances them, in both programs.
    coefficient.work.tensor_state = tensor_state;
    pre.push_back(coefficient);
  } else {
    if (check_finite) {
      GraphNode check = g_family_node(RangeOp::CHECK_FINITE);
      pre.push_back(check);
    }
    GraphNode advance;
    advance.kind = NodeKind::kCompute;
    advance.compute_op = ComputeOp::ADVANCE_STEP;
    advance.flags.bias_correction = kind.bias_correction;
    advance.work.hyper_groups = blocks;
    advance.work.tensor_state = tensor_state;
    pre.push_back(advance);
  }

  auto group_node = [&](Group group) {
    GraphNode node;
    node.group = group;
    node.flags.weight_decay_mode = config.weight_decay_mode;
    for (const FamilyInfo& f : kFamilyTable) {
      if (need.has(f.family)) node.span(f.family) = plan.group_span(f.family, group);
    }
    node.grad.encoding = grad_dtype;
    node.work.hyper_groups = blocks;
    node.work.tensor_state = update_state;
    if (items) {
      node.work.hyper_items = plan.hyper_item_span(group);
      if (group == Group::kWeight) node.work.tensor_blocks = region_span(plan, T_TENSOR_BLOCKS);
    }
    attach_grad_table(plan, node, table_view(group));
    return node;
  };

  const bool normed = kind.norm != NormPass::kNone;
  const bool has_weight_tiles = normed && !plan.norm_tiles().empty();
  // Muon's tiles only drive its update (UPDATE_MUON): its pass over the matrices is
  // MUON_ORTHOGONALIZE in the optimizer graph, not a norm graph.
  const bool muon = kind.norm == NormPass::kMuonOrthogonalize;
  if (muon != plan.config().muon) throw_invalid(std::string("the memory plan was not made for ") + kind.name);
  if (has_weight_tiles && !muon) {
    auto& norms = step.graphs[static_cast<int>(GraphId::kNorms)];
    GraphNode partials = group_node(Group::kWeight);
    partials.range_op = RangeOp::NORM_TILE_PARTIALS;
    partials.norm = norm_tables;
    partials.norm.inputs = kind.norm == NormPass::kLambTrustRatio ? NormInputs::kLambMoments
                                                                    : NormInputs::kWeightAndGradient;
    norms.push_back(partials);
    GraphNode ratio = group_node(Group::kWeight);
    ratio.kind = NodeKind::kCompute;
    ratio.compute_op = ComputeOp::NORM_TRUST_RATIO;
    ratio.norm = norm_tables;
    ratio.norm.ratio = kind.norm == NormPass::kLambTrustRatio ? NormRatio::kLamb : NormRatio::kLars;
    norms.push_back(ratio);
  }

  auto& opt = step.graphs[static_cast<int>(GraphId::kOptimizer)];
  for (Group group : {Group::kWeight, Group::kBiasLike}) {
    GraphNode node = group_node(group);
    if (node.span(Family::kW).count == 0) continue;
    // A normed weight group with only zero-size tensors has no tiles and nothing to update.
    if (normed && group == Group::kWeight && !has_weight_tiles) continue;
    node.range_op = group == Group::kWeight ? kind.weight_update : kind.bias_update;
    node.flags.nesterov = kind.nesterov;
    // Every update op of the table writes the model copy when the plan has one (no op per
    // precision): the backends round the new master of each element into C as they store it.
    if (plan.has_model_copy()) {
      node.copy.precision = precision.precision;
      node.copy.rounding = precision.rounding;
      node.copy.seed = precision.seed;
      node.copy.c = plan.model_copy_group_span(group);
      node.copy.tensors = plan.tensor_table(table_view(group));
    }
    // The weight group's update walks the norm tiles to find each tensor's ratio.
    if (normed && group == Group::kWeight) node.norm = norm_tables;
    // The two groups touch disjoint memory: the CUDA backend may run them concurrently.
    node.stream = group == Group::kWeight ? StreamKind::kUpdate : StreamKind::kSecond;
    if (muon && group == Group::kWeight) {
      // Muon (docs/math.md): momentum into U over the weight group span, Newton–Schulz on each
      // matrix of U (writing each tensor's adjusted lr into N), then the tile-wise update from U
      // and N. V is the auxiliary AdamW's: the weight-group nodes read none.
      node.span(Family::kV) = Span{};
      node.muon.update = region_span(plan, T_MUON_UPDATE);
      node.muon.matrices = region_span(plan, T_MUON_MATRICES);
      node.muon.scratch = region_span(plan, T_MUON_SCRATCH);
      GraphNode momentum = node;
      momentum.range_op = RangeOp::MUON_MOMENTUM;
      momentum.copy = ModelCopy{};
      momentum.norm = NormDesc{};
      momentum.span(Family::kN) = Span{};
      opt.push_back(momentum);
      GraphNode orthogonalize = node;
      orthogonalize.kind = NodeKind::kCompute;
      orthogonalize.compute_op = ComputeOp::MUON_ORTHOGONALIZE;
      orthogonalize.copy = ModelCopy{};
      orthogonalize.norm = NormDesc{};
      orthogonalize.span(Family::kG) = Span{};
      orthogonalize.span(Family::kM) = Span{};
      orthogonalize.grad = GradAccess{};
      orthogonalize.work.hyper_items = Span{};
      orthogonalize.muon.mode = plan.config().muon_mode;
      opt.push_back(orthogonalize);
      node.span(Family::kG) = Span{};
      node.span(Family::kM) = Span{};
      node.grad = GradAccess{};
    }
    // A muon step's bias-like group is its auxiliary AdamW, with its own lr and weight decay.
    if (muon && group == Group::kBiasLike) node.flags.aux = true;
    opt.push_back(node);
  }
  return step;
}

}  // namespace

CompiledStep compile_step(const MemoryPlan& plan, const OptimizerConfig& config, bool check_finite,
                          const PrecisionOptions& precision) {
  return compile(plan, config, check_finite, precision, true);
}

CompiledStep compile_unmasked_step(const MemoryPlan& plan, const OptimizerConfig& config, bool check_finite,
                                   const PrecisionOptions& precision) {
  if (!plan.config().tensor_mask) throw_invalid("compile_unmasked_step: the plan has no tensor_mask");
  return compile(plan, config, check_finite, precision, false);
}

}  // namespace renaissance
