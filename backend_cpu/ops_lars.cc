// CPU ops of the LARS update: tile by tile over the weight group, each tile with its tensor's
// trust ratio from N (written by the norm pass, ops_norm.cc). The bias-like group uses the SGD
// ops (kKindTable).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_lars.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// The LARS update of the weight-group elements of tiles [tile_begin, tile_end).
template <bool kNesterov>
void LarsTilesUpdate(float* w, const float* g, float* m, const NormTile* tiles, size_t tile_begin,
                     size_t tile_end, const float* eta, const float* s) {
  const FloatTag d;
  const auto cv = vector_coeffs(s, true);
  const auto cs = scalar_coeffs(s, true);
  for (size_t t = tile_begin; t < tile_end; ++t) {
    const NormTile& tile = tiles[t];
    const float lr_eta = rules::lars_lr_eta(s[kLr], eta[tile.tensor]);
    const FloatVec lr_eta_v = hn::Set(d, lr_eta);
    for_each_element<true, false>(
        w + tile.start, g + tile.start, m + tile.start, nullptr, static_cast<size_t>(tile.length),
        [&](FloatVec& wv, FloatVec gv, FloatVec& mv, FloatVec&) {
          rules::lars<VectorPolicy, kNesterov>(wv, gv, mv, lr_eta_v, cv);
        },
        [&](float& wv, float gv, float& mv, float&) {
          rules::lars<rules::ScalarPolicy, kNesterov>(wv, gv, mv, lr_eta, cs);
        });
  }
}

void LarsUpdate(float* w, const float* g, float* m, float*, const NormTile* tiles, size_t b, size_t e,
                const float* eta, const float* s) {
  LarsTilesUpdate<false>(w, g, m, tiles, b, e, eta, s);
}
void LarsNesterovUpdate(float* w, const float* g, float* m, float*, const NormTile* tiles, size_t b, size_t e,
                        const float* eta, const float* s) {
  LarsTilesUpdate<true>(w, g, m, tiles, b, e, eta, s);
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

HWY_EXPORT(LarsUpdate);
HWY_EXPORT(LarsNesterovUpdate);

void run_UPDATE_LARS(const CpuContext& ctx, const GraphNode& node) {
  run_tiles(ctx, node, &HWY_DYNAMIC_DISPATCH(LarsUpdate));
}
void run_UPDATE_LARS_NESTEROV(const CpuContext& ctx, const GraphNode& node) {
  run_tiles(ctx, node, &HWY_DYNAMIC_DISPATCH(LarsNesterovUpdate));
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
