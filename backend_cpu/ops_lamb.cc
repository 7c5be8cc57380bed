// CPU ops of LAMB's updates. UPDATE_LAMB is phase 2 of the weight group: tile by tile, each tile
// with its tensor's r from N (written by NORM_TRUST_RATIO after phase 1, ops_norm.cc, updated m
// and v): u is recomputed from m, v, w by rules::lamb_direction, the function phase 1 used, and
// w = w - (lr*r)*u. UPDATE_LAMB_BIAS is the bias-like group in one element-wise pass (r = 1).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_lamb.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

void LambTilesUpdate(float* w, const float*, float* m, float* v, const NormTile* tiles, size_t tile_begin,
                     size_t tile_end, const float* ratio, const float* s) {
  const FloatTag d;
  const size_t lanes = hn::Lanes(d);
  const auto cv = vector_coeffs(s, true);
  const auto cs = scalar_coeffs(s, true);
  for (size_t t = tile_begin; t < tile_end; ++t) {
    const NormTile& tile = tiles[t];
    const float lr_r = rules::lamb_lr_ratio(s[kLr], ratio[tile.tensor]);
    const FloatVec lr_r_v = hn::Set(d, lr_r);
    float* tw = w + tile.start;
    const float* tm = m + tile.start;
    const float* tv = v + tile.start;
    const size_t n = static_cast<size_t>(tile.length);
    size_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      FloatVec wv = hn::LoadU(d, tw + i);
      rules::lamb_apply<VectorPolicy>(wv, hn::LoadU(d, tm + i), hn::LoadU(d, tv + i), lr_r_v, cv);
      hn::StoreU(wv, d, tw + i);
    }
    for (; i < n; ++i) rules::lamb_apply<rules::ScalarPolicy>(tw[i], tm[i], tv[i], lr_r, cs);
  }
}

void LambBias(float* w, const float* g, float* m, float* v, size_t n, const float* s, bool, bool) {
  const auto cv = vector_coeffs(s, false);
  const auto cs = scalar_coeffs(s, false);
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
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(LambTilesUpdate);
HWY_EXPORT(LambBias);

void run_UPDATE_LAMB(const CpuContext& ctx, const GraphNode& node) {
  run_tiles(ctx, node, &HWY_DYNAMIC_DISPATCH(LambTilesUpdate));
}

// The bias-like group only (the compiler never gives it a weight-group node): r = 1, wd = 0.
void run_UPDATE_LAMB_BIAS(const CpuContext& ctx, const GraphNode& node) {
  run_elementwise(ctx, node, &HWY_DYNAMIC_DISPATCH(LambBias));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
