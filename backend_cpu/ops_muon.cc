// CPU ops of Muon (docs/math.md, "Muon"): MUON_MOMENTUM (the element-wise momentum pass into U,
// through run_elementwise), MUON_ORTHOGONALIZE (Newton–Schulz on each matrix of U, in exact or fast
// mode as the node's MuonDesc::mode says, through orthogonalize_matrix) and UPDATE_MUON (the tile
// walker with each tensor's adjusted lr).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_muon.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"
#include "backend_cpu/tile_walker-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// m and U from ĝ (rules::muon_momentum) over one chunk: the ElementwiseFn shape, its fourth
// array being U (run_MUON_MOMENTUM hands U's span in V's place); w is not read.
void MuonMomentum(float*, const float* g, float* m, float* u, size_t n, const float* s, CoeffSet, bool) {
  const FloatTag d;
  const auto cv = vector_coeffs(s, CoeffSet::kWeight);
  const auto cs = scalar_coeffs(s, CoeffSet::kWeight);
  const auto mv = rules::make_muon_coeffs<FloatVec>(s, [&](float x) { return hn::Set(d, x); });
  const auto ms = rules::make_muon_coeffs<float>(s, [](float x) { return x; });
  ForEachLane(
      n, [&](FloatVec& gv, FloatVec& mm, FloatVec& uv) { rules::muon_momentum<VectorPolicy>(gv, mm, uv, cv, mv); },
      [&](const float& gs, float& mm, float& us) { rules::muon_momentum<rules::ScalarPolicy>(gs, mm, us, cs, ms); },
      In{g}, InOut{m}, Out{u});
}

// w from U with the tile's adjusted lr (N[t]); reads no G.
struct MuonRule {
  static std::tuple<InOut, In> operands(const TileArgs& a) { return {InOut{a.w}, In{a.state[0]}}; }
  static float factor(float, float lr_adj) { return lr_adj; }
  template <class P, class V>
  static HWY_INLINE void apply(V& w, V u, V lr_adj, const rules::Coeffs<V>& c) {
    rules::muon_update<P>(w, u, lr_adj, c);
  }
};

void MuonUpdate(const TileArgs& a) { UpdateTiles<MuonRule>(a); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>

#include "backend_cpu/cpu_ops.h"
#include "backend_cpu/exact_matmul_cpu.h"
#include "backend_cpu/newton_schulz_fast_cpu.h"
#include "backend_cpu/ops_muon.h"
#include "renaissance/math/newton_schulz.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(MuonMomentum);
HWY_EXPORT(MuonUpdate);

bool orthogonalize_matrix(float* u, size_t rows, size_t cols, const math::NewtonSchulzCoefficients& coeff, int steps,
                          float eps, int threads, int mode, bool amx_tiles) {
  if (mode == 1) {
    thread_local NewtonSchulzFastScratch fast_scratch;
    newton_schulz_fast_cpu(u, rows, cols, u, coeff, steps, eps, &fast_scratch, threads);
    return true;
  }
  // The fast exact product (exact_matmul_cpu.h), the reference's bits. Its buffers are kept per
  // calling thread and reused from step to step (a first call pays their page faults).
  thread_local NewtonSchulzScratch scratch;
  scratch.unit = amx_tiles ? ExactProductUnit::kBest : ExactProductUnit::kSimdLanes;
  return newton_schulz_exact_cpu(u, rows, cols, u, coeff, steps, eps, &scratch, threads);
}

// The element-wise pass with U in V's place: run_elementwise walks the weight group span (or its
// items, with the mask) and widens a 2-byte or table-read G as for every update.
void run_MUON_MOMENTUM(const CpuContext& ctx, const GraphNode& node) {
  GraphNode pass = node;
  pass.span(Family::kV) = node.muon.update;
  run_elementwise(ctx, pass, &HWY_DYNAMIC_DISPATCH(MuonMomentum));
}

// A matrix whose Newton–Schulz products take fewer multiply-adds than this (r² c each, r and c its
// short and long side) runs on one thread: a team's wake-up and join cost more than the team
// saves there, many times per step (about nine parallel regions per Newton–Schulz step).
constexpr uint64_t kMuonSmallMatrixWork = uint64_t{1} << 21;

bool is_small_matrix(const MuonMatrix& mat) {
  const uint64_t r = static_cast<uint64_t>(std::min(mat.rows, mat.cols));
  const uint64_t c = static_cast<uint64_t>(std::max(mat.rows, mat.cols));
  return r * r * c < kMuonSmallMatrixWork;
}

// Each matrix of U with its tensor's scalar block (H > 1: tensor_blocks; a masked tensor is
// skipped, its U and N unused); N[t] = its adjusted lr. The small matrices run one per thread,
// side by side; the others one after another, each on the whole team (the products are parallel
// inside). A matrix's result does not depend on its thread count, so neither does the step.
void run_MUON_ORTHOGONALIZE(const CpuContext& ctx, const GraphNode& node) {
  if (ctx.step_skipped()) return;
  const MuonMatrix* matrices = ctx.at<MuonMatrix>(node.muon.matrices);
  float* u = ctx.at<float>(node.muon.update);
  float* n = ctx.at<float>(node.span(Family::kN));
  const int32_t* blocks = node.work.tensor_blocks.count ? ctx.at<int32_t>(node.work.tensor_blocks) : nullptr;
  const int32_t* mask = tensor_mask(ctx, node);
  const int64_t count = static_cast<int64_t>(node.muon.matrices.count);
  // false: the matrix is longer than the exact product's limit (thrown after the parallel loop).
  auto orthogonalize = [&](int64_t t, int threads) {
    const MuonMatrix& mat = matrices[t];
    const int32_t block = blocks ? blocks[t] : 0;
    if (block_masked(mask, block)) return true;
    const float* s = scalar_block(ctx, block);
    n[t] = math::muon_adjusted_lr(s[kLr], mat.adjust);
    if (mat.rows == 0 || mat.cols == 0) return true;
    math::NewtonSchulzCoefficients coeff;
    coeff.a = s[kNsA];
    coeff.b = s[kNsB];
    coeff.c = s[kNsC];
    return orthogonalize_matrix(u + mat.start, static_cast<size_t>(mat.rows), static_cast<size_t>(mat.cols), coeff,
                                static_cast<int>(s[kNsSteps]), s[kNsEps], threads, node.muon.mode, ctx.tuning.amx_tiles);
  };
  int64_t small = 0;
  for (int64_t t = 0; t < count; ++t) small += is_small_matrix(matrices[t]) ? 1 : 0;
  bool ok = true;
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ctx.threads, small)));
#pragma omp parallel for schedule(dynamic, 1) num_threads(team) reduction(&& : ok)
  for (int64_t t = 0; t < count; ++t) {
    if (is_small_matrix(matrices[t])) ok = orthogonalize(t, 1) && ok;
  }
  for (int64_t t = 0; t < count; ++t) {
    if (!is_small_matrix(matrices[t])) ok = orthogonalize(t, ctx.threads) && ok;
  }
  if (!ok) throw_invalid("MUON_ORTHOGONALIZE: a matrix is longer than the exact product's limit");
}

// TileArgs::state = {U}, as MuonRule::operands reads it.
void run_UPDATE_MUON(const CpuContext& ctx, const GraphNode& node) {
  run_tiles(ctx, node, &HWY_DYNAMIC_DISPATCH(MuonUpdate), TileGrad::kNone, node.muon.update);
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
