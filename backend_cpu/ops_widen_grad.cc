// Widening model-dtype gradients (bf16 / fp16 encodings) to fp32 on the CPU (issue 14, speed):
// the update ops read G as floats, so grad_dtype.h's widen_grad turns each block of encodings
// into floats right before the op runs. Compiled once per Highway target and dispatched at run
// time, so the widen runs at the machine's vector width (as plain C++ it compiled to 4-lane SSE2,
// about a fifth of the bf16 step's time on Zen 4). The lane-wise code restates the scalar
// definitions of math/precision.h (bf16_to_f32, f16_to_f32) with integer operations: every
// target gives their bits, NaN payloads included (a hardware f16 conversion would quiet
// signalling NaNs). tests/test_widen_grad_simd.cc checks all 65536 encodings per target.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/ops_widen_grad.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstdint>

#include "backend_cpu/grad_dtype.h"
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
using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using D16 = hn::Rebind<uint16_t, DU>;  // as many 16-bit lanes as DU has 32-bit lanes
using VU = hn::Vec<DU>;

HWY_INLINE VU K(uint32_t x) { return hn::Set(DU(), x); }

// f16_to_f32, lane-wise: a normal number re-biases its exponent; inf/NaN keep the all-ones
// exponent and the fraction (payload) shifted up; a subnormal's value frac * 2^-24 is formed by
// an exact int -> float conversion (frac < 2^10) and an exact multiply by a power of two, which
// is the number the scalar loop normalises by shifting (both results are normal floats).
HWY_INLINE VU F16ToF32Bits(VU h) {
  const DF df;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, K(0x8000u)));
  const VU exp = hn::And(hn::ShiftRight<10>(h), K(0x1fu));
  const VU frac = hn::And(h, K(0x3ffu));
  const VU normal = hn::Or(hn::ShiftLeft<23>(hn::Add(exp, K(112u))), hn::ShiftLeft<13>(frac));
  const VU special = hn::Or(K(0x7f800000u), hn::ShiftLeft<13>(frac));
  const VU sub = hn::BitCast(DU(), hn::Mul(hn::ConvertTo(df, hn::BitCast(DI(), frac)), hn::Set(df, 0x1p-24f)));
  VU r = hn::IfThenElse(hn::Eq(exp, K(0x1fu)), special, normal);
  r = hn::IfThenElse(hn::Eq(exp, K(0)), sub, r);
  return hn::Or(r, sign);
}

template <bool kBf16>
void widen_vector(const uint16_t* src, uint64_t n, float* dst) {
  const DF df;
  const DU du;
  const D16 d16;
  const uint64_t lanes = hn::Lanes(du);
  uint64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const VU h = hn::PromoteTo(du, hn::LoadU(d16, src + i));
    const VU bits = kBf16 ? hn::ShiftLeft<16>(h) : F16ToF32Bits(h);
    hn::StoreU(hn::BitCast(df, bits), df, dst + i);
  }
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

void widen_grad(Precision dtype, const uint16_t* src, uint64_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(WidenGrad)(dtype == Precision::kBf16 ? 1 : 0, src, n, dst);
}

const char* widen_grad_target() { return HWY_DYNAMIC_DISPATCH(WidenGradTarget)(); }

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
