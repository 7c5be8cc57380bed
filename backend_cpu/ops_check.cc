// CPU op CHECK_FINITE: does any gradient element anywhere hold NaN or ±Inf? Sets the
// has-non-finite flag that every later op of the step reads (docs/math.md: the whole step is
// skipped, decided without the host looking at the data).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_check.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include "backend_cpu/simd_policy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {

// x*0 is ±0 for every finite x and NaN for NaN and ±Inf, so a running sum of x*0 is NaN
// exactly when some element is not finite. Four accumulators keep the adds independent.
bool ChunkHasNonFinite(const float* HWY_RESTRICT g, size_t n) {
  const FloatTag d;
  const size_t lanes = hn::Lanes(d);
  const FloatVec zero = hn::Zero(d);
  FloatVec a0 = zero, a1 = zero, a2 = zero, a3 = zero;
  size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    a0 = hn::Add(a0, hn::Mul(hn::LoadU(d, g + i), zero));
    a1 = hn::Add(a1, hn::Mul(hn::LoadU(d, g + i + lanes), zero));
    a2 = hn::Add(a2, hn::Mul(hn::LoadU(d, g + i + 2 * lanes), zero));
    a3 = hn::Add(a3, hn::Mul(hn::LoadU(d, g + i + 3 * lanes), zero));
  }
  for (; i + lanes <= n; i += lanes) a0 = hn::Add(a0, hn::Mul(hn::LoadU(d, g + i), zero));
  const FloatVec sum = hn::Add(hn::Add(a0, a1), hn::Add(a2, a3));
  HWY_ALIGN float out[hn::MaxLanes(d)];
  hn::Store(sum, d, out);
  float tail = 0.0f;
  for (; i < n; ++i) tail += g[i] * 0.0f;
  bool bad = !std::isfinite(tail);
  for (size_t j = 0; j < lanes; ++j) bad = bad || !std::isfinite(out[j]);
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

#include "backend_cpu/cpu_ops.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(ChunkHasNonFinite);
HWY_EXPORT(CompiledTarget);

void run_CHECK_FINITE(const CpuContext& ctx, const GraphNode& node) {
  const float* g = ctx.at<float>(node.g);
  std::atomic<bool> found{false};
  auto* fn = &HWY_DYNAMIC_DISPATCH(ChunkHasNonFinite);
  parallel_blocks(ctx.threads, node.g.count, kChunkElements, [&](uint64_t begin, uint64_t end) {
    if (fn(g + begin, end - begin)) found.store(true, std::memory_order_relaxed);
  });
  ctx.scalars.i32[kHasNonFinite] = found.load() ? 1 : 0;
}

const char* current_simd_target() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(CompiledTarget)());
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
