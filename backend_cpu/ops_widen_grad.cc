// Widening model-dtype gradients (bf16 / fp16 encodings) to fp32 on the CPU, for speed:
// the update ops read G as floats, so grad_dtype.h's widen_grad turns each block of encodings
// into floats right before the op runs. Compiled once per Highway target and dispatched at run
// time, so the widen runs at the machine's vector width (as plain C++ it compiled to 4-lane SSE2,
// about a fifth of the bf16 step's time on Zen 4). The element-wise updates with a model copy
// widen in their own loop instead (fused_update-inl.h); this pass serves the tile-wise updates,
// the norm passes and the gradient-table path. The lane-wise code (half_simd-inl.h) restates the scalar
// definitions of math/precision.h (bf16_to_f32, f16_to_f32) with integer operations (fp16 with
// F16C: the hardware conversion, with the quiet bit it sets on signalling NaNs cleared again):
// every target gives their bits, NaN payloads included. tests/cpu/test_widen_grad_simd.cc checks
// all 65536 encodings per target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_widen_grad.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstdint>

#include "backend_cpu/grad_dtype.h"
#include "backend_cpu/half_simd-inl.h"
#include "renaissance/math/precision.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {
namespace {

// The scalar definition, for tails shorter than a vector (and the HWY_SCALAR target).
void widen_scalar(bool bf16, const uint16_t* src, uint64_t n, float* dst) {
  for (uint64_t i = 0; i < n; ++i) dst[i] = math::half_to_f32(bf16, src[i]);
}

#if HWY_TARGET != HWY_SCALAR
namespace hn = hwy::HWY_NAMESPACE;

// The lane-wise widen is half_simd-inl.h's WidenLoad (shared with the fused update loop).
template <bool kBf16>
void widen_vector(const uint16_t* src, uint64_t n, float* dst) {
  const half::DF df;
  const uint64_t lanes = hn::Lanes(df);
  uint64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(half::WidenLoad<kBf16>(src + i), df, dst + i);
  widen_scalar(kBf16, src + i, n - i, dst + i);
}
#endif

}  // namespace

void WidenGrad(int bf16, const uint16_t* src, uint64_t n, float* dst) {
#if HWY_TARGET == HWY_SCALAR
  widen_scalar(bf16 != 0, src, n, dst);
#else
  if (bf16) {
    widen_vector<true>(src, n, dst);
  } else {
    widen_vector<false>(src, n, dst);
  }
#endif
}

const char* WidenGradTarget() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace renaissance {
namespace cpu {

HWY_EXPORT(WidenGrad);
HWY_EXPORT(WidenGradTarget);

void widen_grad(Precision dtype, const void* src, uint64_t n, float* dst) {
  if (dtype != Precision::kBf16 && dtype != Precision::kFp16) {  // no vector code: the scalar definition
    for (uint64_t i = 0; i < n; ++i) dst[i] = math::encoded_to_f32(dtype, math::load_encoding(dtype, src, i));
    return;
  }
  HWY_DYNAMIC_DISPATCH(WidenGrad)(dtype == Precision::kBf16 ? 1 : 0, static_cast<const uint16_t*>(src), n, dst);
}

const char* widen_grad_target() { return HWY_DYNAMIC_DISPATCH(WidenGradTarget)(); }

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
