// CPU ops of LAMB's updates. UPDATE_LAMB is phase 2 of the weight group: the tile walker
// (tile_walker-inl.h) with the LAMB rule, each tile with its tensor's r from N (written by
// NORM_TRUST_RATIO after phase 1, ops_norm.cc, updated m and v): u is recomputed from m, v, w by
// rules::lamb_direction, the function phase 1 used, and w = w - (lr*r)*u. UPDATE_LAMB_BIAS is
// the bias-like group in one element-wise pass (r = 1).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_lamb.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"
#include "backend_cpu/tile_walker-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// w from m, v with the tile's lr*r (rules::lamb_apply); reads no G, states M and V read only.
struct LambRule {
  static std::tuple<InOut, In, In> operands(const TileArgs& a) { return {InOut{a.w}, In{a.state[0]}, In{a.state[1]}}; }
  static float factor(float lr, float r) { return rules::lamb_lr_ratio(lr, r); }
  template <class P, class V>
  static HWY_INLINE void apply(V& w, V m, V v, V lr_r, const rules::Coeffs<V>& c) {
    rules::lamb_apply<P>(w, m, v, lr_r, c);
  }
};

void LambTilesUpdate(const TileArgs& a) { UpdateTiles<LambRule>(a); }

void LambBias(float* w, const float* g, float* m, float* v, size_t n, const float* s, CoeffSet set,
              bool) {
  const auto cv = vector_coeffs(s, set);
  const auto cs = scalar_coeffs(s, set);
  for_each_element<true, true>(
      w, g, m, v, n,
      [&](FloatVec& wv, FloatVec gv, FloatVec& mv, FloatVec& vv) { rules::lamb_unit_ratio<VectorPolicy>(wv, gv, mv, vv, cv); },
      [&](float& wv, float gv, float& mv, float& vv) { rules::lamb_unit_ratio<rules::ScalarPolicy>(wv, gv, mv, vv, cs); });
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "backend_cpu/cpu_ops.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(LambTilesUpdate);
HWY_EXPORT(LambBias);

// TileArgs::state = {M, V}, as LambRule::operands reads them.
void run_UPDATE_LAMB(const CpuContext& ctx, const GraphNode& node) {
  run_tiles(ctx, node, &HWY_DYNAMIC_DISPATCH(LambTilesUpdate), TileGrad::kNone, node.span(Family::kM), node.span(Family::kV));
}

// The bias-like group only (the compiler never gives it a weight-group node): r = 1, wd = 0.
void run_UPDATE_LAMB_BIAS(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(LambBias));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
