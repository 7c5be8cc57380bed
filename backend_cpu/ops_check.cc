// CPU op CHECK_FINITE: does any gradient element anywhere hold NaN or ±Inf? Sets the
// has-non-finite flag that every later op of the step reads (docs/math.md: the whole step is
// skipped, decided without the host looking at the data). With gradient-norm clipping the check
// is fused into GRAD_NORM_PARTIALS (tile partials of ‖g*(1/scale)‖² in the canonical order of
// math/norm_reduction.h, each tile checked and squared while it is in cache), and
// CLIP_COEFFICIENT turns the partials into the total norm and the coefficient. With the tensor
// mask the fused pass reads a masked tensor's elements as +0.0 (the bits of a zeroed G).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_check.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <algorithm>

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// Both scans below fold their elements into four accumulators, each walking its own quarter of
// the run, one vector at a time: four read streams per thread instead of one. A lone stream per
// core leaves memory idle (its hardware prefetcher runs too few lines ahead); with four, the scan
// of resnet50's 51 MB of bf16 G at 2 threads took 2.3 ms instead of 3.3 on the dev VM and 2.6
// instead of 2.9 on the H200 host (medians, blocks of one chunk; bench/JOURNAL.md).
// The answer is an OR over elements, so the order of the walk cannot change it.
// acc[k] = fold(acc[k], load(i)) over the vectors at i of quarter k, then the remaining whole
// vectors into acc[0]; returns the first element not visited (the caller's scalar tail).
template <class V, class Load, class Fold>
HWY_INLINE size_t FoldQuarters(size_t n, size_t lanes, V (&acc)[4], const Load& load, const Fold& fold) {
  const size_t q = n / (4 * lanes) * lanes;
  for (size_t i = 0; i < q; i += lanes) {
    acc[0] = fold(acc[0], load(i));
    acc[1] = fold(acc[1], load(q + i));
    acc[2] = fold(acc[2], load(2 * q + i));
    acc[3] = fold(acc[3], load(3 * q + i));
  }
  size_t i = 4 * q;
  for (; i + lanes <= n; i += lanes) acc[0] = fold(acc[0], load(i));
  return i;
}

// x*0 is ±0 for every finite x and NaN for NaN and ±Inf, so a running sum of x*0 is NaN
// exactly when some element is not finite.
bool ChunkHasNonFinite(const float* HWY_RESTRICT g, size_t n) {
  const FloatTag d;
  const size_t lanes = hn::Lanes(d);
  const FloatVec zero = hn::Zero(d);
  FloatVec a[4] = {zero, zero, zero, zero};
  size_t i = FoldQuarters(
      n, lanes, a, [&](size_t at) { return hn::Mul(hn::LoadU(d, g + at), zero); },
      [](FloatVec acc, FloatVec x) { return hn::Add(acc, x); });
  const FloatVec sum = hn::Add(hn::Add(a[0], a[1]), hn::Add(a[2], a[3]));
  HWY_ALIGN float out[hn::MaxLanes(d)];
  hn::Store(sum, d, out);
  float tail = 0.0f;
  for (; i < n; ++i) tail += g[i] * 0.0f;
  bool bad = !std::isfinite(tail);
  for (size_t j = 0; j < lanes; ++j) bad = bad || !std::isfinite(out[j]);
  return bad;
}

// The same for n 2-byte encodings (model-dtype G): a bf16 / fp16 encoding is NaN or ±Inf exactly
// when its exponent field (`exponent`: 0x7f80 or 0x7c00) is all ones, as its widened float then
// is (math/precision.h widens every other encoding to a finite). Integer lanes, no widening; the
// compare results are OR-ed, so the answer cannot depend on the vector width.
bool EncodedChunkHasNonFinite(const uint16_t* HWY_RESTRICT g, size_t n, uint16_t exponent) {
  const hn::ScalableTag<uint16_t> d;
  using V = hn::Vec<decltype(d)>;
  const V e = hn::Set(d, exponent);
  V a[4] = {hn::Zero(d), hn::Zero(d), hn::Zero(d), hn::Zero(d)};
  size_t i = FoldQuarters(
      n, hn::Lanes(d), a, [&](size_t at) { return hn::VecFromMask(d, hn::Eq(hn::And(hn::LoadU(d, g + at), e), e)); },
      [](V acc, V x) { return hn::Or(acc, x); });
  bool bad = !hn::AllTrue(d, hn::Eq(hn::Or(hn::Or(a[0], a[1]), hn::Or(a[2], a[3])), hn::Zero(d)));
  for (; i < n; ++i) bad = bad || (g[i] & exponent) == exponent;
  return bad;
}

// Grad-norm tiles [tile_begin, tile_end) of the G span (count elements): each tile's partial of
// Σ (g*(1/scale))² in the canonical lane order, fed to the lanes one norm tile at a time; returns
// whether any element of these tiles is NaN or ±Inf (when `check`).
bool GradNormPartials(const float* HWY_RESTRICT g, uint64_t count, size_t tile_begin, size_t tile_end,
                      const float* s, bool check, double* HWY_RESTRICT partials) {
  const auto cv = vector_coeffs(s, CoeffSet::kWeight);
  const auto cs = scalar_coeffs(s, CoeffSet::kWeight);
  HWY_ALIGN float gh[math::kNormTile];
  HWY_ALIGN double lanes_acc[math::kNormLanes];
  bool bad = false;
  for (size_t t = tile_begin; t < tile_end; ++t) {
    const uint64_t begin = static_cast<uint64_t>(t) * math::kGradNormTile;
    const uint64_t end = std::min<uint64_t>(count, begin + math::kGradNormTile);
    for (int j = 0; j < math::kNormLanes; ++j) lanes_acc[j] = 0.0;
    for (uint64_t piece = begin; piece < end; piece += math::kNormTile) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(end - piece, math::kNormTile));
      if (check && ChunkHasNonFinite(g + piece, n)) bad = true;
      UnscaleInto<false>(g + piece, n, cv, cs, gh);
      AddSquaresByLane(gh, n, lanes_acc);
    }
    math::norm_lane_tree(lanes_acc);
    partials[t] = math::stored_grad_norm_partial(lanes_acc[0]);
  }
  return bad;
}

// The Highway target this copy was compiled for, to report which one the dispatcher picked.
int64_t CompiledTarget() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <atomic>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend_cpu/cpu_ops.h"
#include "renaissance/math/norm_reduction.h"
#include "renaissance/math/step_state.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(ChunkHasNonFinite);
HWY_EXPORT(EncodedChunkHasNonFinite);
HWY_EXPORT(GradNormPartials);
HWY_EXPORT(CompiledTarget);

bool encoded_has_non_finite(Precision dtype, const void* g, uint64_t n) {
  if (dtype != Precision::kBf16 && dtype != Precision::kFp16) {
    // No vector code: each encoding widened (exact; NaN or ±Inf exactly when the encoding is).
    for (uint64_t i = 0; i < n; ++i) {
      if (!std::isfinite(math::encoded_to_f32(dtype, math::load_encoding(dtype, g, i)))) return true;
    }
    return false;
  }
  return HWY_DYNAMIC_DISPATCH(EncodedChunkHasNonFinite)(static_cast<const uint16_t*>(g), static_cast<size_t>(n),
                                                        dtype == Precision::kBf16 ? 0x7f80 : 0x7c00);
}

bool fp32_has_non_finite(const float* g, uint64_t n) {
  return HWY_DYNAMIC_DISPATCH(ChunkHasNonFinite)(g, static_cast<size_t>(n));
}

constexpr uint64_t kCheckBlockChunks = 8;

void run_CHECK_FINITE(const CpuContext& ctx, const GraphNode& node) {
  std::atomic<bool> found{false};
  // Whether elements [at, at + n) of G span s hold a NaN or Inf: fp32 values, or model-dtype
  // encodings checked as they are (grad_dtype.h).
  // With a gradient table the elements are read through it (widened: a widened value is NaN or
  // Inf exactly when its encoding is), at their place in node.g (which holds both groups' spans).
  const GradSource g_src = grad_source(ctx, node);
  auto has_non_finite = [&](const Span& s, uint64_t at, uint64_t n) {
    if (node.grad.table.count != 0) {
      const uint64_t elem = precision_bytes(node.grad.encoding);
      const uint64_t b = (s.offset - node.span(Family::kG).offset) / elem + at;
      return fp32_has_non_finite(fp32_grad(g_src, b, b + n) + b, n);
    }
    if (node.grad.encoding != Precision::kFp32) {
      return encoded_has_non_finite(node.grad.encoding, ctx.at<char>(s) + at * precision_bytes(node.grad.encoding), n);
    }
    return fp32_has_non_finite(ctx.at<float>(s) + at, n);
  };
  if (const int32_t* mask = tensor_mask(ctx, node)) {
    // tensor_mask: the unmasked tensors' items only (a masked tensor's G is never looked at).
    for (int group = 0; group < 2; ++group) {
      const HyperItem* items = ctx.at<HyperItem>(node.work.group_items[group]);
      parallel_blocks(ctx.threads, node.work.group_items[group].count, 1, [&](uint64_t b, uint64_t e) {
        for (uint64_t k = b; k < e; ++k) {
          if (block_masked(mask, items[k].block)) continue;
          if (has_non_finite(node.work.group_g[group], static_cast<uint64_t>(items[k].start), static_cast<uint64_t>(items[k].count))) {
            found.store(true, std::memory_order_relaxed);
          }
        }
      }, ctx.tuning.schedule);
    }
  } else {
    // The scan of the arena's G moves 2-4 B per element where an update moves 22-40, so its
    // blocks are longer: 8 chunks (128 K elements by default, 256-512 KiB of G, each of a
    // thread's four streams 64-128 KiB). Against 1 chunk: median share of the same-traffic limit
    // with the check on, AdamW resnet50 bf16 / fp16 at 2 threads, 0.959 -> 0.976 / 0.964 ->
    // 0.992 (dev VM, 8 interleaved rounds). Through a gradient table a block is
    // first gathered into the thread's buffer (64 KiB of floats at one chunk, which L2 holds);
    // longer blocks were not measured there, so that path keeps 1 chunk.
    const uint64_t block = (node.grad.table.count != 0 ? 1 : kCheckBlockChunks) * ctx.tuning.chunk_elements;
    parallel_blocks(ctx.threads, node.span(Family::kG).count, block, [&](uint64_t begin, uint64_t end) {
      if (has_non_finite(node.span(Family::kG), begin, end - begin)) found.store(true, std::memory_order_relaxed);
    }, ctx.tuning.schedule);
  }
  ctx.scalars.i32[kHasNonFinite] = found.load() ? 1 : 0;
}

namespace {

// An element range [begin, end) of the node's G span.
struct ElementRun {
  uint64_t begin, end;
};

// tensor_mask: the runs of the node's G span that belong to masked tensors, in increasing order
// (each group's items, from its offset in the span; the bias-like group lies first). Empty when
// nothing is masked, or without the mask.
std::vector<ElementRun> masked_runs(const CpuContext& ctx, const GraphNode& node) {
  std::vector<ElementRun> runs;
  const int32_t* mask = tensor_mask(ctx, node);
  if (mask == nullptr) return runs;
  const uint64_t element_bytes = precision_bytes(node.grad.encoding);
  const int64_t count = static_cast<int64_t>(node.span(Family::kG).count);
  for (int group = 0; group < 2; ++group) {
    // Signed, and each run clipped to the node's span: a sharded step's node covers only its
    // rank's tiles, which may start inside the group (ShardedStep cuts the node's G span, not the tables).
    const int64_t first = (static_cast<int64_t>(node.work.group_g[group].offset) - static_cast<int64_t>(node.span(Family::kG).offset)) /
                          static_cast<int64_t>(element_bytes);
    const HyperItem* items = ctx.at<HyperItem>(node.work.group_items[group]);
    for (uint64_t k = 0; k < node.work.group_items[group].count; ++k) {
      if (!block_masked(mask, items[k].block)) continue;
      const int64_t b = std::max<int64_t>(0, first + items[k].start);
      const int64_t e = std::min<int64_t>(count, first + items[k].start + items[k].count);
      if (e <= b) continue;
      const uint64_t begin = static_cast<uint64_t>(b), end = static_cast<uint64_t>(e);
      if (!runs.empty() && runs.back().end == begin) {
        runs.back().end = end;
      } else {
        runs.push_back({begin, end});
      }
    }
  }
  return runs;
}

// The fp32 gradient of elements [begin, end) with the masked runs' elements +0.0, in the
// calling thread's buffer (the same pointer convention as fp32_grad). A +0.0 adds +0.0 to a
// partial sum and is finite, so the partials and the check see what a zeroed G would give.
const float* masked_fp32_grad(const GradSource& src, uint64_t begin, uint64_t end,
                              const std::vector<ElementRun>& runs) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < end - begin) buffer.resize(end - begin);
  const float* g = fp32_grad(src, begin, end);
  std::copy(g + begin, g + end, buffer.data());
  auto run = std::upper_bound(runs.begin(), runs.end(), begin,
                              [](uint64_t at, const ElementRun& r) { return at < r.end; });
  for (; run != runs.end() && run->begin < end; ++run) {
    const uint64_t from = std::max(run->begin, begin), to = std::min(run->end, end);
    std::fill(buffer.data() + (from - begin), buffer.data() + (to - begin), 0.0f);
  }
  return reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(buffer.data()) - begin * sizeof(float));
}

}  // namespace

void run_GRAD_NORM_PARTIALS(const CpuContext& ctx, const GraphNode& node) {
  const GradSource g_src = grad_source(ctx, node);  // G in node.grad.encoding (grad_dtype.h)
  double* partials = ctx.at<double>(node.norm.partials);
  const float* s = ctx.scalars.f32;
  const bool check = node.flags.check_finite;
  std::atomic<bool> found{false};
  auto* fn = &HWY_DYNAMIC_DISPATCH(GradNormPartials);
  const std::vector<ElementRun> runs = masked_runs(ctx, node);
  parallel_blocks(ctx.threads, node.norm.partials.count, 1, [&](uint64_t b, uint64_t e) {
    // The widened tiles [b, e) of G (kGradNormTile elements each, the last one shorter).
    const uint64_t begin = b * static_cast<uint64_t>(math::kGradNormTile);
    const uint64_t end = std::min<uint64_t>(node.span(Family::kG).count, e * static_cast<uint64_t>(math::kGradNormTile));
    const float* g = runs.empty() ? fp32_grad(g_src, begin, end) : masked_fp32_grad(g_src, begin, end, runs);
    if (fn(g, node.span(Family::kG).count, b, e, s, check, partials)) found.store(true, std::memory_order_relaxed);
  }, ctx.tuning.schedule);
  if (check) ctx.scalars.i32[kHasNonFinite] = found.load() ? 1 : 0;
}

namespace {

// The canonical sum of the partials (math/norm_reduction.h), the total and the coefficient.
void clip_coefficient(const CpuContext& ctx, const GraphNode& node) {
  const double* partials = ctx.at<double>(node.norm.partials);
  const int64_t count = static_cast<int64_t>(node.norm.partials.count);
  std::vector<double> lanes(math::kGradNormSumLanes);
  for (int j = 0; j < math::kGradNormSumLanes; ++j) lanes[j] = math::grad_norm_sum_lane(partials, count, j);
  math::grad_norm_sum_tree(lanes.data());
  const double total = math::grad_norm_total(lanes[0]);
  ctx.scalars.f64[kGradNormD] = total;
  // Task-wide: the same coefficient in every hyperparameter block (scalars.h).
  const float coefficient = math::clip_coefficient(total, ctx.scalars.f64[kMaxGradNormD]);
  for (int h = 0; h < node.work.hyper_groups; ++h) ctx.scalars.f32[h * kNumScalarF32 + kClipCoefficient] = coefficient;
}

}  // namespace

// A skipped step leaves the last total norm and the coefficient as they were. Then the step
// counters (advance_counters, as ADVANCE_STEP): with clipping this node replaces ADVANCE_STEP.
void run_CLIP_COEFFICIENT(const CpuContext& ctx, const GraphNode& node) {
  if (!ctx.step_skipped()) clip_coefficient(ctx, node);
  advance_counters(ctx, node);
}

const char* current_simd_target() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CompiledTarget)());
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
