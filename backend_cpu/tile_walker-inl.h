// The tile walker of the norm kinds (LARS, LAMB and any later trust-ratio kind): the loops over
// the weight group's norm tiles that every norm pass and tile-wise update shares, so that a kind
// is reduced to its per-element rule. A rule names its operands (Rule::operands: W, G and the
// state arrays of TileArgs, each read or read and written) and what it computes on them; the
// walker owns the tiles, the coefficients, the vector/scalar split and, for the norm pass, the
// canonical reduction order. The number of state arrays is the rule's: the walker takes any pack.
// Included once per Highway target (Highway's -inl.h convention), after simd_policy-inl.h.

#if defined(RENAISSANCE_TILE_WALKER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RENAISSANCE_TILE_WALKER_INL_H_
#undef RENAISSANCE_TILE_WALKER_INL_H_
#else
#define RENAISSANCE_TILE_WALKER_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <tuple>

#include <hwy/highway.h>

#include "backend_cpu/cpu_ops.h"
#include "backend_cpu/simd_policy-inl.h"
#include "renaissance/math/norm_reduction.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// The operands a rule names: an array of the group span that the rule reads (In) or reads and
// writes (InOut), at the span's first element, or the walker's tile buffer, written only (Out).
// at(k): the operand at element k of the span (a tile's start; the tile buffer stays put).
struct In {
  static constexpr bool kLoad = true, kStore = false;
  const float* p;
  In at(size_t k) const { return In{p + k}; }
};
struct InOut {
  static constexpr bool kLoad = true, kStore = true;
  float* p;
  InOut at(size_t k) const { return InOut{p + k}; }
};
struct Out {
  static constexpr bool kLoad = false, kStore = true;
  float* p;
  Out at(size_t) const { return *this; }
};

// f(x...) with one vector per operand at element i, in the operands' order: each loaded (Out:
// zero, the rule sets it) before f, each written one stored after it.
template <class F>
HWY_INLINE void WithVectors(size_t, const F& f) {
  f();
}
template <class F, class Op, class... Ops>
HWY_INLINE void WithVectors(size_t i, const F& f, const Op& op, const Ops&... ops) {
  const FloatTag d;
  FloatVec x = Op::kLoad ? hn::LoadU(d, op.p + i) : hn::Zero(d);
  WithVectors(i, [&](auto&... xs) { f(x, xs...); }, ops...);
  if constexpr (Op::kStore) hn::StoreU(x, d, op.p + i);
}

// Elements [0, n) of the operands: full vectors through vector_rule first, the remainder one by
// one through scalar_rule (on the elements themselves). Both compute the same IEEE operations,
// so the split point never changes a bit.
template <class VectorRule, class ScalarRule, class... Ops>
HWY_INLINE void ForEachLane(size_t n, const VectorRule& vector_rule, const ScalarRule& scalar_rule,
                            const Ops&... ops) {
  const FloatTag d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) WithVectors(i, vector_rule, ops...);
  for (; i < n; ++i) scalar_rule(ops.p[i]...);
}

// The tile-wise update of the tiles [a.begin, a.end): per tile the rule's factor from the
// learning rate and the tile's tensor's ratio in N (Rule::factor), then per element
// `Rule::apply<P>(operands..., factor, coeffs)` over Rule::operands(a).
template <class Rule>
HWY_INLINE void UpdateTiles(const TileArgs& a) {
  const FloatTag d;
  const auto cv = vector_coeffs(a.s, CoeffSet::kWeight);
  const auto cs = scalar_coeffs(a.s, CoeffSet::kWeight);
  const auto operands = Rule::operands(a);
  for (size_t t = a.begin; t < a.end; ++t) {
    const NormTile& tile = a.tiles[t];
    const float f = Rule::factor(a.s[kLr], a.ratio[tile.tensor]);
    const FloatVec fv = hn::Set(d, f);
    const size_t start = static_cast<size_t>(tile.start);
    std::apply(
        [&](const auto&... op) {
          ForEachLane(
              static_cast<size_t>(tile.length),
              [&](auto&... x) { Rule::template apply<VectorPolicy>(x..., fv, cv); },
              [&](auto&... x) { Rule::template apply<rules::ScalarPolicy>(x..., f, cs); }, op.at(start)...);
        },
        operands);
  }
}

// The partials of tile t from its two squared arrays a and b (n elements each): lanes from 0 in
// the quad order, then the fixed tree (math::norm_lane_tree), as math/norm_reduction.h defines.
HWY_INLINE void StoreTilePartials(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, size_t n, size_t t,
                                  double* HWY_RESTRICT partials) {
  HWY_ALIGN double a_lanes[math::kNormLanes];
  HWY_ALIGN double b_lanes[math::kNormLanes];
  std::fill(a_lanes, a_lanes + math::kNormLanes, 0.0);
  std::fill(b_lanes, b_lanes + math::kNormLanes, 0.0);
  AddSquaresByLane<math::kNormQuad>(a, n, a_lanes);
  AddSquaresByLane<math::kNormQuad>(b, n, b_lanes);
  math::norm_lane_tree(a_lanes);
  math::norm_lane_tree(b_lanes);
  partials[math::kNormComponents * t] = a_lanes[0];
  partials[math::kNormComponents * t + 1] = b_lanes[0];
}

// The norm pass of the tiles [a.begin, a.end): per element `Rule::apply<P>(x, operands...,
// coeffs)` forms the tile's second squared array x (and updates whatever state the rule writes)
// into a tile buffer, then the tile's partials of ‖w‖² and ‖x‖² (StoreTilePartials).
template <class Rule>
HWY_INLINE void PartialsTiles(const TileArgs& a) {
  const auto cv = vector_coeffs(a.s, CoeffSet::kWeight);
  const auto cs = scalar_coeffs(a.s, CoeffSet::kWeight);
  const auto operands = Rule::operands(a);
  HWY_ALIGN float x[math::kNormTile];
  for (size_t t = a.begin; t < a.end; ++t) {
    const NormTile& tile = a.tiles[t];
    const size_t start = static_cast<size_t>(tile.start);
    const size_t n = static_cast<size_t>(tile.length);
    std::apply(
        [&](const auto&... op) {
          ForEachLane(
              n, [&](auto&... v) { Rule::template apply<VectorPolicy>(v..., cv); },
              [&](auto&... v) { Rule::template apply<rules::ScalarPolicy>(v..., cs); }, Out{x}, op.at(start)...);
        },
        operands);
    StoreTilePartials(a.w + start, x, n, t, a.partials);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#endif  // RENAISSANCE_TILE_WALKER_INL_H_
