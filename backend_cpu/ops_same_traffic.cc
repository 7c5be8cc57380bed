// The CPU same-traffic reference: one pass of Backend::same_traffic_gbps reads the
// spans a step reads and writes back the spans it writes, over the task's own arena, with the
// step's chunking and threads. Its arithmetic is trivial and leaves every bit as it was
// (x ^= (t & key) with a key of 0 that the compiler cannot see), so measuring a task's limit
// never changes its state or fingerprint. bench/bench_cpu_step.cc times the same function.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_same_traffic.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Counts are template arguments so the inner loop is as plain as a step's (at most 2 read-only
// and 3 updated streams: the LARS norm pass and the Adam update).
template <int R, int U>
uint32_t Sweep(const uint32_t* const* HWY_RESTRICT reads, uint32_t* const* HWY_RESTRICT updates, size_t n,
               uint32_t key) {
  const hn::ScalableTag<uint32_t> d;
  const size_t lanes = hn::Lanes(d);
  const auto vkey = hn::Set(d, key);
  auto acc = hn::Zero(d);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    auto t = hn::LoadU(d, reads[0] + i);
    for (int r = 1; r < R; ++r) t = hn::Xor(t, hn::LoadU(d, reads[r] + i));
    if (U == 0) {
      acc = hn::Xor(acc, t);
    } else {
      const auto delta = hn::And(t, vkey);
      for (int u = 0; u < U; ++u) hn::StoreU(hn::Xor(hn::LoadU(d, updates[u] + i), delta), d, updates[u] + i);
    }
  }
  HWY_ALIGN uint32_t lane_values[hn::MaxLanes(d)];
  hn::Store(acc, d, lane_values);
  uint32_t out = 0;
  for (size_t j = 0; j < lanes; ++j) out ^= lane_values[j];
  for (; i < n; ++i) {
    uint32_t t = reads[0][i];
    for (int r = 1; r < R; ++r) t ^= reads[r][i];
    if (U == 0) out ^= t;
    for (int u = 0; u < U; ++u) updates[u][i] ^= t & key;
  }
  return out;
}

uint32_t SameTrafficChunk(const uint32_t* const* reads, int nreads, uint32_t* const* updates, int nupdates,
                          size_t n, uint32_t key) {
  switch (nreads * 4 + nupdates) {
    case 4: return Sweep<1, 0>(reads, updates, n, key);
    case 5: return Sweep<1, 1>(reads, updates, n, key);
    case 6: return Sweep<1, 2>(reads, updates, n, key);
    case 7: return Sweep<1, 3>(reads, updates, n, key);
    case 8: return Sweep<2, 0>(reads, updates, n, key);
    case 9: return Sweep<2, 1>(reads, updates, n, key);
    case 10: return Sweep<2, 2>(reads, updates, n, key);
    case 11: return Sweep<2, 3>(reads, updates, n, key);
    default: return 0;  // rejected by the caller
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <atomic>
#include <string>

#include "backend_cpu/cpu_ops.h"
#include "renaissance/error.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(SameTrafficChunk);

uint32_t run_same_traffic_pass(const CpuContext& ctx, const TrafficPass& pass, uint32_t key) {
  if (pass.reads.empty() || pass.reads.size() > 2 || pass.updates.size() > 3) {
    throw Error(ErrorKind::kBackend, "same-traffic pass with " + std::to_string(pass.reads.size()) + " reads and " +
                                         std::to_string(pass.updates.size()) + " updates is not supported");
  }
  const uint32_t* reads[2] = {};
  uint32_t* updates[3] = {};
  for (size_t r = 0; r < pass.reads.size(); ++r) reads[r] = reinterpret_cast<const uint32_t*>(ctx.arena + pass.reads[r]);
  for (size_t u = 0; u < pass.updates.size(); ++u) updates[u] = reinterpret_cast<uint32_t*>(ctx.arena + pass.updates[u]);
  const int nr = static_cast<int>(pass.reads.size()), nu = static_cast<int>(pass.updates.size());
  std::atomic<uint32_t> folded{0};
  auto* fn = &HWY_DYNAMIC_DISPATCH(SameTrafficChunk);
  // The step's chunking and schedule (ctx.tuning), so the limit is measured the way the step runs.
  parallel_blocks(ctx.threads, pass.count, ctx.tuning.chunk_elements, [&](uint64_t begin, uint64_t end) {
    const uint32_t* r[2] = {reads[0] + begin, reads[1] != nullptr ? reads[1] + begin : nullptr};
    uint32_t* u[3];
    for (int k = 0; k < 3; ++k) u[k] = updates[k] != nullptr ? updates[k] + begin : nullptr;
    folded.fetch_xor(fn(r, nr, u, nu, end - begin, key), std::memory_order_relaxed);
  }, ctx.tuning.schedule);
  return folded.load();
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
