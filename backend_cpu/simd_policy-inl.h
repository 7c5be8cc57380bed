// Per-target SIMD support for the CPU op files: the Highway arithmetic policy, a per-target copy
// of the shared update rules, and the loop that applies a rule to every element of a chunk.
// Included once per Highway target from inside HWY_BEFORE_NAMESPACE (Highway's -inl.h
// convention), so everything here is compiled with that target's instruction set.

#if defined(RENAISSANCE_SIMD_POLICY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef RENAISSANCE_SIMD_POLICY_INL_H_
#undef RENAISSANCE_SIMD_POLICY_INL_H_
#else
#define RENAISSANCE_SIMD_POLICY_INL_H_
#endif

#include <cmath>
#include <cstdint>

#include <hwy/highway.h>

#include "renaissance/math/host_device.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/scalars.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The shared rules, compiled for this target (see update_rules.inc).
namespace rules {
#include "renaissance/math/update_rules.inc"
}  // namespace rules

using FloatTag = hn::ScalableTag<float>;
using FloatVec = hn::Vec<FloatTag>;

// IEEE-exact vector operations; with -ffp-contract=off the compiler keeps mul and add apart.
struct VectorPolicy {
  using V = FloatVec;
  static HWY_INLINE V add(V a, V b) { return hn::Add(a, b); }
  static HWY_INLINE V sub(V a, V b) { return hn::Sub(a, b); }
  static HWY_INLINE V mul(V a, V b) { return hn::Mul(a, b); }
  static HWY_INLINE V div(V a, V b) { return hn::Div(a, b); }
  static HWY_INLINE V sqrt(V a) { return hn::Sqrt(a); }
  // Exact comparisons, as ScalarPolicy::sign: +1, -1, +0 for ±0, NaN stays NaN.
  static HWY_INLINE V sign(V a) {
    const FloatTag d;
    const V zero = hn::Zero(d);
    V r = hn::IfThenElse(hn::Gt(a, zero), hn::Set(d, 1.0f), zero);
    r = hn::IfThenElse(hn::Lt(a, zero), hn::Set(d, -1.0f), r);
    return hn::IfThenElse(hn::Eq(a, a), r, a);
  }
  // As ScalarPolicy::max: a if a is NaN, else b if b is NaN, else b where a < b, else a.
  static HWY_INLINE V max(V a, V b) {
    V r = hn::IfThenElse(hn::Lt(a, b), b, a);
    r = hn::IfThenElse(hn::Eq(b, b), r, b);
    return hn::IfThenElse(hn::Eq(a, a), r, a);
  }
};

// The Coeffs of coefficient set `set` (scalars.h) from the scalar block s, in vectors and scalars.
HWY_INLINE rules::Coeffs<FloatVec> vector_coeffs(const float* s, CoeffSet set) {
  const FloatTag d;
  return rules::make_coeffs<FloatVec>(s, set, [&](float x) { return hn::Set(d, x); });
}

HWY_INLINE rules::Coeffs<float> scalar_coeffs(const float* s, CoeffSet set) {
  return rules::make_coeffs<float>(s, set, [](float x) { return x; });
}

// Applies `rule(w, g, m, v)` to elements [0, n) of the four arrays, full vectors first and
// the remainder with the scalar policy; both compute the same IEEE operations, so the split
// point never changes a bit. m (v) is read and written only when kHasM (kHasV).
// kHasX: a fifth array x (the VMAX family) is read and written too, and the rules take it as a
// fifth argument `rule(w, g, m, v, x)`.
template <bool kHasM, bool kHasV, bool kHasX = false, class VectorRule, class ScalarRule>
HWY_INLINE void for_each_element(float* HWY_RESTRICT w, const float* HWY_RESTRICT g,
                                 float* HWY_RESTRICT m, float* HWY_RESTRICT v, size_t n,
                                 VectorRule vector_rule, ScalarRule scalar_rule, float* HWY_RESTRICT x = nullptr) {
  const FloatTag d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    FloatVec vw = hn::LoadU(d, w + i);
    const FloatVec vg = hn::LoadU(d, g + i);
    FloatVec vm = kHasM ? hn::LoadU(d, m + i) : hn::Zero(d);
    FloatVec vv = kHasV ? hn::LoadU(d, v + i) : hn::Zero(d);
    if constexpr (kHasX) {
      FloatVec vx = hn::LoadU(d, x + i);
      vector_rule(vw, vg, vm, vv, vx);
      hn::StoreU(vx, d, x + i);
    } else {
      vector_rule(vw, vg, vm, vv);
    }
    hn::StoreU(vw, d, w + i);
    if (kHasM) hn::StoreU(vm, d, m + i);
    if (kHasV) hn::StoreU(vv, d, v + i);
  }
  for (; i < n; ++i) {
    float sm = kHasM ? m[i] : 0.0f;
    float sv = kHasV ? v[i] : 0.0f;
    if constexpr (kHasX) {
      scalar_rule(w[i], g[i], sm, sv, x[i]);
    } else {
      scalar_rule(w[i], g[i], sm, sv);
    }
    if (kHasM) m[i] = sm;
    if (kHasV) v[i] = sv;
  }
}

// The element-wise update of a kind over one chunk (an ElementwiseFn's body): Rule is a struct
// with kHasM, kHasV and `template <class P, class V> static void apply(V& w, V g, V& m, V& v,
// const rules::Coeffs<V>& c)`, a call into update_rules.inc (m, v are zero and ignored where the
// kind has none). The same Rule drives the fused update-and-copy loop (fused_update-inl.h), so a
// kind's math is named once per backend and written once, in update_rules.inc.
template <class Rule>
HWY_INLINE void RuleChunk(float* w, const float* g, float* m, float* v, size_t n, const float* s, CoeffSet set) {
  const auto cv = vector_coeffs(s, set);
  const auto cs = scalar_coeffs(s, set);
  for_each_element<Rule::kHasM, Rule::kHasV>(
      w, g, m, v, n,
      [&](FloatVec& wv, FloatVec gv, FloatVec& mv, FloatVec& vv) {
        Rule::template apply<VectorPolicy>(wv, gv, mv, vv, cv);
      },
      [&](float& wv, float gv, float& mv, float& vv) { Rule::template apply<rules::ScalarPolicy>(wv, gv, mv, vv, cs); });
}

// RuleChunk with the fifth array x (VMAX, amsgrad): Rule also has `template <class P, class V>
// static void apply_x(V& w, V g, V& m, V& v, V& x, const rules::Coeffs<V>& c)`.
template <class Rule>
HWY_INLINE void RuleChunkX(float* w, const float* g, float* m, float* v, float* x, size_t n, const float* s,
                           CoeffSet set) {
  const auto cv = vector_coeffs(s, set);
  const auto cs = scalar_coeffs(s, set);
  for_each_element<Rule::kHasM, Rule::kHasV, true>(
      w, g, m, v, n,
      [&](FloatVec& wv, FloatVec gv, FloatVec& mv, FloatVec& vv, FloatVec& xv) {
        Rule::template apply_x<VectorPolicy>(wv, gv, mv, vv, xv, cv);
      },
      [&](float& wv, float gv, float& mv, float& vv, float& xv) {
        Rule::template apply_x<rules::ScalarPolicy>(wv, gv, mv, vv, xv, cs);
      },
      x);
}

// out[i] = ĝ = (g[i]*(1/scale))*clip for i < n (rules::unscale, vector and scalar paths), or
// g[i]*(1/scale) alone (rules::loss_unscale) when kClip is false.
template <bool kClip = true>
HWY_INLINE void UnscaleInto(const float* HWY_RESTRICT g, size_t n, const rules::Coeffs<FloatVec>& cv,
                            const rules::Coeffs<float>& cs, float* HWY_RESTRICT out) {
  const FloatTag d;
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const FloatVec gv = hn::LoadU(d, g + i);
    hn::StoreU(kClip ? rules::unscale<VectorPolicy>(gv, cv) : rules::loss_unscale<VectorPolicy>(gv, cv), d, out + i);
  }
  for (; i < n; ++i) {
    out[i] = kClip ? rules::unscale<rules::ScalarPolicy>(g[i], cs) : rules::loss_unscale<rules::ScalarPolicy>(g[i], cs);
  }
}

// The lane accumulation of the canonical norm orders (math/norm_reduction.h), one lane sum per
// lane j of kNormLanes, each adding in increasing element order the squares in double of the
// elements it owns; x[0] is the first element of a lane-0 run. kQuad = 1 (the gradient-norm
// order): lane j owns x[j], x[j + kNormLanes], ...; callers may feed a tile in consecutive pieces
// of whole rows of kNormLanes. kQuad = kNormQuad (the norm tiles' order): element e goes to lane
// norm_lane_of(e) = (e mod kNormRound) / kNormQuad. Whole rows of kNormLanes * kQuad use double
// vectors over consecutive lanes (with kNormQuad, LoadInterleaved4 hands the k-th elements of the
// quads of consecutive lanes to consecutive double lanes, so every lane adds its quad's elements
// 0, 1, 2, 3 in that order, row after row, on any vector width); the elements after the last
// whole row go one by one in increasing order: the same additions per lane.
template <int kQuad = 1>
HWY_INLINE void AddSquaresByLane(const float* HWY_RESTRICT x, size_t n, double* HWY_RESTRICT lanes_acc) {
  static_assert(kQuad == 1 || kQuad == math::kNormQuad, "a lane takes one element or one quad per row");
  using math::kNormLanes;
  constexpr size_t kRow = static_cast<size_t>(kNormLanes) * kQuad;
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t lanes = hn::Lanes(dd);
  const size_t rows = n / kRow;
  size_t done = 0;
  if (rows > 0 && kNormLanes % lanes == 0) {
    for (size_t j = 0; j < static_cast<size_t>(kNormLanes); j += lanes) {
      auto acc = hn::Load(dd, lanes_acc + j);
      for (size_t r = 0; r < rows; ++r) {
        const float* row = x + r * kRow + kQuad * j;
        if constexpr (kQuad == 1) {
          const auto xv = hn::PromoteTo(dd, hn::LoadU(df, row));
          acc = hn::Add(acc, hn::Mul(xv, xv));
        } else {
          hn::Vec<decltype(df)> q0, q1, q2, q3;
          hn::LoadInterleaved4(df, row, q0, q1, q2, q3);
          const auto d0 = hn::PromoteTo(dd, q0);
          acc = hn::Add(acc, hn::Mul(d0, d0));
          const auto d1 = hn::PromoteTo(dd, q1);
          acc = hn::Add(acc, hn::Mul(d1, d1));
          const auto d2 = hn::PromoteTo(dd, q2);
          acc = hn::Add(acc, hn::Mul(d2, d2));
          const auto d3 = hn::PromoteTo(dd, q3);
          acc = hn::Add(acc, hn::Mul(d3, d3));
        }
      }
      hn::Store(acc, dd, lanes_acc + j);
    }
    done = rows * kRow;
  }
  for (size_t e = done; e < n; ++e) {
    double& lane = lanes_acc[(e % kRow) / kQuad];
    lane = lane + math::square_in_double(x[e]);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#endif  // RENAISSANCE_SIMD_POLICY_INL_H_
