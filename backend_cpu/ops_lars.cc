// CPU ops of the LARS update: the tile walker (tile_walker-inl.h) over the weight group with the
// LARS rule, each tile with its tensor's trust ratio from N (written by the norm pass,
// ops_norm.cc). The bias-like group uses the SGD ops (kKindTable).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_lars.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"
#include "backend_cpu/tile_walker-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// w and m from ĝ with the tile's lr*η (rules::lars); reads G, state M.
template <bool kNesterov>
struct LarsRule {
  static std::tuple<InOut, In, InOut> operands(const TileArgs& a) { return {InOut{a.w}, In{a.g}, InOut{a.state[0]}}; }
  static float factor(float lr, float eta) { return rules::lars_lr_eta(lr, eta); }
  template <class P, class V>
  static HWY_INLINE void apply(V& w, V g, V& m, V lr_eta, const rules::Coeffs<V>& c) {
    rules::lars<P, kNesterov>(w, g, m, lr_eta, c);
  }
};

void LarsUpdate(const TileArgs& a) { UpdateTiles<LarsRule<false>>(a); }
void LarsNesterovUpdate(const TileArgs& a) { UpdateTiles<LarsRule<true>>(a); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backend_cpu/cpu_ops.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(LarsUpdate);
HWY_EXPORT(LarsNesterovUpdate);

// TileArgs::state = {M}, as LarsRule::operands reads it; the node's flag picks the Nesterov form.
void run_UPDATE_LARS(const CpuContext& ctx, const GraphNode& node) {
  const TileFn update =
      node.flags.nesterov ? &HWY_DYNAMIC_DISPATCH(LarsNesterovUpdate) : &HWY_DYNAMIC_DISPATCH(LarsUpdate);
  run_tiles(ctx, node, update, TileGrad::kRead, node.span(Family::kM));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
