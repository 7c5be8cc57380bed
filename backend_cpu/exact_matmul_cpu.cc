// The exact matrix product and exact Newton–Schulz on the CPU (exact_matmul_cpu.h). Highway
// compiles the integer kernel once per SIMD target (foreach_target) and dispatches at run time;
// the fixed-point conversion, the blocking, the OpenMP loop and the fp32 steps are target-free.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend_cpu/exact_matmul_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend_cpu/exact_matmul_cpu.h"

HWY_BEFORE_NAMESPACE();
namespace renaissance {
namespace cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The int32 lanes of the accumulators are moved into int64 after at most kFlushSteps calls of
// ReorderWidenMulAccumulate. Why 15 is safe: every q has |q| <= 2^13 (math::kFixedPointBits), so
// one product has |q_a q_b| <= 2^26. One call adds to each int32 lane of sum0 (and of sum1) at
// most two products (x86: vpmaddwd's pair; emu128: one product in each of sum0 and sum1;
// scalar: one), i.e. at most 2^27 in magnitude. After 15 calls a lane holds at most
// 15 * 2^27 = 2^31 - 2^27 < 2^31 - 1, and sum0 + sum1 (RearrangeToOddPlusEven) holds at most
// 30 products, the same bound. A 16th call could reach 16 * 2^27 = 2^31, one past INT32_MAX.
// The int64 sums hold at most k * 2^26 <= 2^52 (k <= math::kExactMatmulMaxK). vpmaddwd wraps
// (never saturates) and no sum here comes near its one wrapping input (-2^15 * -2^15 twice).
constexpr size_t kFlushSteps = 15;

// Rows and columns of C per register tile: 16 int32 accumulators, 4 + 1 loaded vectors (AVX-512
// keeps them in its 32 registers; AVX2 spills a few and measured no faster with 4 x 3 or 3 x 3).
constexpr int kTileRows = 4;
constexpr int kTileCols = 4;

// The tile loops must be unrolled so that the accumulator arrays live in registers (GCC keeps
// them on the stack otherwise: 2.5x slower).
#define RN_UNROLL _Pragma("GCC unroll 16")

// sums[r * ld + c] += sum over p < len of a[r * kp + p] * b[c * kp + p] for r < MR, c < NR; len is a
// multiple of the vector length (the operands are zero-padded to math's kExactMatmulPad).
template <int MR, int NR>
HWY_INLINE void DotTile(const int16_t* HWY_RESTRICT a, const int16_t* HWY_RESTRICT b, size_t kp, size_t len,
                        int64_t* HWY_RESTRICT sums, size_t ld) {
  const hn::ScalableTag<int16_t> d16;
  const hn::Repartition<int32_t, decltype(d16)> d32;
#if HWY_TARGET != HWY_SCALAR
  const hn::Half<decltype(d32)> d32h;
#endif
  const hn::Repartition<int64_t, decltype(d32)> d64;
  using V32 = hn::Vec<decltype(d32)>;
  using V64 = hn::Vec<decltype(d64)>;
  const size_t lanes = hn::Lanes(d16);
  V64 total[MR * NR];
  RN_UNROLL
  for (int t = 0; t < MR * NR; ++t) total[t] = hn::Zero(d64);
  for (size_t p = 0; p < len;) {
    const size_t end = std::min(len, p + kFlushSteps * lanes);
    V32 s0[MR * NR], s1[MR * NR];
    RN_UNROLL
    for (int t = 0; t < MR * NR; ++t) s0[t] = s1[t] = hn::Zero(d32);
    for (; p < end; p += lanes) {
      hn::Vec<decltype(d16)> bv[NR];
      RN_UNROLL
      for (int c = 0; c < NR; ++c) bv[c] = hn::LoadU(d16, b + c * kp + p);
      RN_UNROLL
      for (int r = 0; r < MR; ++r) {
        const auto av = hn::LoadU(d16, a + r * kp + p);
        RN_UNROLL
        for (int c = 0; c < NR; ++c) s0[r * NR + c] = hn::ReorderWidenMulAccumulate(d32, av, bv[c], s0[r * NR + c], s1[r * NR + c]);
      }
    }
    RN_UNROLL
    for (int t = 0; t < MR * NR; ++t) {
      const V32 s = hn::RearrangeToOddPlusEven(s0[t], s1[t]);
#if HWY_TARGET == HWY_SCALAR
      total[t] = hn::Add(total[t], hn::PromoteTo(d64, s));  // one lane, and d64 has one too
#else
      total[t] = hn::Add(total[t], hn::Add(hn::PromoteTo(d64, hn::LowerHalf(d32h, s)),
                                           hn::PromoteTo(d64, hn::UpperHalf(d32h, s))));
#endif
    }
  }
  RN_UNROLL
  for (int r = 0; r < MR; ++r) {
    RN_UNROLL
    for (int c = 0; c < NR; ++c) sums[r * ld + c] += hn::GetLane(hn::SumOfLanes(d64, total[r * NR + c]));
  }
}

template <int MR>
HWY_INLINE void DotTileCols(int nr, const int16_t* a, const int16_t* b, size_t kp, size_t len, int64_t* sums,
                            size_t ld) {
  if (nr == 4) DotTile<MR, 4>(a, b, kp, len, sums, ld);
  if (nr == 3) DotTile<MR, 3>(a, b, kp, len, sums, ld);
  if (nr == 2) DotTile<MR, 2>(a, b, kp, len, sums, ld);
  if (nr == 1) DotTile<MR, 1>(a, b, kp, len, sums, ld);
}

// sums[(i - i0) * ld + (j - j0)] = the integer dot product of vector i of qa and vector j of qb
// (kp int16 each) for i in [i0, i1), j in [j0, j1); sums is overwritten. The k range is walked
// in chunks that keep a register tile's operands in L1.
void DotBlock(const int16_t* qa, const int16_t* qb, size_t kp, size_t i0, size_t i1, size_t j0, size_t j1,
              int64_t* sums, size_t ld) {
  constexpr size_t kChunk = 1920;  // k per pass: the tile's 8 vectors of 3840 bytes stay in L1
  for (size_t i = i0; i < i1; ++i) std::fill(sums + (i - i0) * ld, sums + (i - i0) * ld + (j1 - j0), int64_t{0});
  for (size_t k0 = 0; k0 < kp; k0 += kChunk) {
    const size_t len = std::min(kChunk, kp - k0);
    for (size_t i = i0; i < i1; i += kTileRows) {
      const int mr = static_cast<int>(std::min<size_t>(kTileRows, i1 - i));
      for (size_t j = j0; j < j1; j += kTileCols) {
        const int nr = static_cast<int>(std::min<size_t>(kTileCols, j1 - j));
        const int16_t* a = qa + i * kp + k0;
        const int16_t* b = qb + j * kp + k0;
        int64_t* s = sums + (i - i0) * ld + (j - j0);
        if (mr == 4) DotTileCols<4>(nr, a, b, kp, len, s, ld);
        if (mr == 3) DotTileCols<3>(nr, a, b, kp, len, s, ld);
        if (mr == 2) DotTileCols<2>(nr, a, b, kp, len, s, ld);
        if (mr == 1) DotTileCols<1>(nr, a, b, kp, len, s, ld);
      }
    }
  }
}

const char* DotTarget() { return hwy::TargetName(HWY_TARGET); }

// ---- The fixed-point conversion, vectorised: the bits algorithm of fixed_point_from_bits (below,
// in HWY_ONCE) lane by lane, in int32 lanes, then narrowed to int16 (|q| <= 2^13 + 1 fits).

// The loop of every row function below: vector(i) for i = 0, L, 2L, ... while a whole vector of
// L = Lanes(d) lanes fits in [0, count), then scalar(i) for each element after the last one.
template <class D, class Vector, class Scalar>
HWY_INLINE void LanesThenTail(D d, size_t count, Vector vector, Scalar scalar) {
  const size_t lanes = hn::Lanes(d);
  size_t i = 0;
  for (; i + lanes <= count; i += lanes) vector(i);
  for (; i < count; ++i) scalar(i);
}

// |x| as float bits.
HWY_INLINE uint32_t AbsBits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u & 0x7fffffffu;
}

// The largest |x| of x[0, count) as float bits (non-negative floats order as their bits; a NaN or
// an inf has bits >= those of inf).
uint32_t AbsMaxBits(const float* HWY_RESTRICT x, size_t count) {
  const hn::ScalableTag<uint32_t> du;
  const hn::Rebind<float, decltype(du)> df;
  const auto mask = hn::Set(du, 0x7fffffffu);
  auto amax = hn::Zero(du);
  uint32_t tail = 0;
  LanesThenTail(
      du, count, [&](size_t p) { amax = hn::Max(amax, hn::And(hn::BitCast(du, hn::LoadU(df, x + p)), mask)); },
      [&](size_t p) { tail = std::max(tail, AbsBits(x[p])); });
  return std::max(hn::GetLane(hn::MaxOfLanes(du, amax)), tail);
}

// amax[j] = max(amax[j], |x[j]| as bits) for j < count (a row of a matrix whose columns are scaled).
void AbsMaxBitsInto(const float* HWY_RESTRICT x, size_t count, uint32_t* HWY_RESTRICT amax) {
  const hn::ScalableTag<uint32_t> du;
  const hn::Rebind<float, decltype(du)> df;
  const auto mask = hn::Set(du, 0x7fffffffu);
  LanesThenTail(
      du, count,
      [&](size_t j) {
        hn::StoreU(hn::Max(hn::LoadU(du, amax + j), hn::And(hn::BitCast(du, hn::LoadU(df, x + j)), mask)), du, amax + j);
      },
      [&](size_t j) { amax[j] = std::max(amax[j], AbsBits(x[j])); });
}

template <class D, class VU, class VI>
HWY_INLINE hn::Vec<hn::Rebind<int16_t, D>> FixLanes(D di, VU u, VI shift) {
  const hn::RebindToUnsigned<D> du;
  const auto biased = hn::And(hn::ShiftRight<23>(u), hn::Set(du, 0xffu));
  const auto mant = hn::Or(hn::And(u, hn::Set(du, 0x7fffffu)),
                           hn::IfThenElseZero(hn::Ne(biased, hn::Zero(du)), hn::Set(du, 0x800000u)));
  const auto t = hn::Add(hn::Sub(hn::Max(hn::BitCast(di, biased), hn::Set(di, 1)), hn::Set(di, 150)), shift);
  const auto left = hn::BitCast(du, hn::Min(hn::Max(t, hn::Zero(di)), hn::Set(di, 31)));
  const auto right = hn::BitCast(du, hn::Min(hn::Max(hn::Neg(t), hn::Zero(di)), hn::Set(di, 31)));
  const auto y = hn::Shl(mant, left);
  const auto q = hn::Shr(y, right);
  const auto unit = hn::Shl(hn::Set(du, 1u), right);
  const auto rem = hn::BitCast(di, hn::And(y, hn::Sub(unit, hn::Set(du, 1u))));
  const auto half = hn::BitCast(di, hn::ShiftRight<1>(unit));
  const auto odd = hn::Ne(hn::And(hn::BitCast(di, q), hn::Set(di, 1)), hn::Zero(di));
  const auto up = hn::Or(hn::Gt(rem, half), hn::And(hn::And(hn::Eq(rem, half), hn::Ne(half, hn::Zero(di))), odd));
  const auto mag = hn::Add(hn::BitCast(di, q), hn::IfThenElseZero(up, hn::Set(di, 1)));
  const auto negative = hn::Ne(hn::ShiftRight<31>(u), hn::Zero(du));
  const auto value = hn::IfThenElse(hn::RebindMask(di, negative), hn::Neg(mag), mag);
  return hn::DemoteTo(hn::Rebind<int16_t, D>(), value);
}

// q[p] = fixed_point_from_bits(x[p], shift) for p < count (a row scaled as a whole).
void FixRow(const float* HWY_RESTRICT x, size_t count, int shift, int16_t* HWY_RESTRICT q) {
  const hn::ScalableTag<int32_t> di;
  const hn::RebindToUnsigned<decltype(di)> du;
  const hn::Rebind<int16_t, decltype(di)> d16;
  const hn::Rebind<float, decltype(di)> df;
  const auto vshift = hn::Set(di, shift);
  LanesThenTail(
      di, count, [&](size_t p) { hn::StoreU(FixLanes(di, hn::BitCast(du, hn::LoadU(df, x + p)), vshift), d16, q + p); },
      [&](size_t p) { q[p] = static_cast<int16_t>(fixed_point_from_bits(x[p], shift)); });
}

// q[j] = fixed_point_from_bits(x[j], shift[j]) for j < count (a row whose columns are scaled).
void FixRowPerColumn(const float* HWY_RESTRICT x, size_t count, const int32_t* HWY_RESTRICT shift,
                     int16_t* HWY_RESTRICT q) {
  const hn::ScalableTag<int32_t> di;
  const hn::RebindToUnsigned<decltype(di)> du;
  const hn::Rebind<int16_t, decltype(di)> d16;
  const hn::Rebind<float, decltype(di)> df;
  LanesThenTail(
      di, count,
      [&](size_t j) {
        hn::StoreU(FixLanes(di, hn::BitCast(du, hn::LoadU(df, x + j)), hn::LoadU(di, shift + j)), d16, q + j);
      },
      [&](size_t j) { q[j] = static_cast<int16_t>(fixed_point_from_bits(x[j], shift[j])); });
}

// out[j] = math::from_fixed_point(sums[j], shift_a, shift_b) for j < count, with row_scale =
// 2^-shift_a and col_scale[j] = 2^-shift_b[j] (computed once): |sums[j]| < 2^53 converts to double
// exactly, each product with a power of two stays inside double's normal range (|sum| 2^-322 at
// the least), so it is exact and the whole equals ldexp; the one rounding is the demotion to float
// (nearest, ties to even).
void RoundSums(const int64_t* HWY_RESTRICT sums, size_t count, double row_scale, const double* HWY_RESTRICT col_scale,
               float* HWY_RESTRICT out) {
  const hn::ScalableTag<double> dd;
  const hn::RebindToSigned<decltype(dd)> di;
  const hn::Rebind<float, decltype(dd)> df;
  const auto rs = hn::Set(dd, row_scale);
  LanesThenTail(
      dd, count,
      [&](size_t j) {
        const auto v = hn::Mul(hn::Mul(hn::ConvertTo(dd, hn::LoadU(di, sums + j)), rs), hn::LoadU(dd, col_scale + j));
        hn::StoreU(hn::DemoteTo(df, v), df, out + j);
      },
      [&](size_t j) { out[j] = static_cast<float>(static_cast<double>(sums[j]) * row_scale * col_scale[j]); });
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace renaissance
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backend_cpu/exact_matmul_cpu.h"
#include "renaissance/math/exact_matmul.h"
#include "renaissance/math/newton_schulz.h"
#include "renaissance/math/norm_reduction.h"

namespace renaissance {
namespace cpu {

HWY_EXPORT(DotBlock);
HWY_EXPORT(DotTarget);
HWY_EXPORT(AbsMaxBits);
HWY_EXPORT(AbsMaxBitsInto);
HWY_EXPORT(FixRow);
HWY_EXPORT(FixRowPerColumn);
HWY_EXPORT(RoundSums);

const char* exact_matmul_target() { return HWY_DYNAMIC_DISPATCH(DotTarget)(); }

bool exact_products_on_tiles(ExactProductUnit unit) { return unit == ExactProductUnit::kBest && amx_int8_usable(); }

void fixed_point_row(const float* x, size_t count, int shift, int16_t* q) {
  HWY_DYNAMIC_DISPATCH(FixRow)(x, count, shift, q);
}

// |x| = mant * 2^(e - 150) with the implicit bit in mant (a subnormal has e = 1), so
// y = x * 2^shift = mant * 2^t, t = e - 150 + shift. t >= 0 only for small mant (|y| <= 2^13 + 1/2),
// a left shift; otherwise mant >> -t, rounded half to even on the bits shifted out (a shift of 25
// or more leaves y < 1/2, i.e. 0, which the clamp at 31 keeps). FixLanes is the same, lane by lane.
int32_t fixed_point_from_bits(float x, int shift) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint32_t biased = (u >> 23) & 0xffu;
  const uint64_t mant = (u & 0x7fffffu) | (biased != 0 ? 0x800000u : 0u);
  const int t = (biased != 0 ? static_cast<int>(biased) : 1) - 150 + shift;
  const int left = std::min(std::max(t, 0), 31);
  const int right = std::min(std::max(-t, 0), 31);
  const uint64_t y = mant << left;
  const uint64_t q = y >> right;
  const uint64_t rem = y & ((uint64_t{1} << right) - 1);
  const uint64_t half = (uint64_t{1} << right) >> 1;
  const uint64_t up = (right > 0) & ((rem > half) | ((rem == half) & (q & 1)));
  const int32_t mag = static_cast<int32_t>(q + up);
  return (u >> 31) != 0 ? -mag : mag;
}

namespace {

constexpr uint32_t kInfBits = 0x7f800000u;

float from_abs_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The shift and finiteness of a vector whose largest |bits| is amax_bits: the bits of
// non-negative floats order as the floats, and a NaN or inf has bits >= those of inf. This is the
// reference's (max of std::fabs, math::fixed_point_shift) for finite vectors.
void scale_of(uint32_t amax_bits, int& shift, uint8_t& finite) {
  finite = amax_bits < kInfBits;
  shift = finite ? math::fixed_point_shift(from_abs_bits(amax_bits)) : 0;
}

void resize(FixedPointOperand& op, size_t count, size_t k) {
  op.count = count;
  op.k = k;
  op.kp = (k + kExactMatmulPad - 1) / kExactMatmulPad * kExactMatmulPad;
  op.q.resize(count * op.kp);
  op.shift.resize(count);
  op.finite.resize(count);
}

// A shift that turns every input, whatever its bits, into q = 0 (the digits of a non-finite
// vector, as in the reference): y = x * 2^shift < 2^(128 - 400) < 1/2.
constexpr int kZeroDigitsShift = -400;

// The rows of x (count x k, row-major) as a left operand (or, equally, the columns of xᵀ as a
// right one).
void fix_rows(const float* x, size_t count, size_t k, FixedPointOperand& op, int threads) {
  resize(op, count, k);
  const int team = static_cast<int>(std::max<size_t>(1, std::min<size_t>(threads, count)));
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t v = 0; v < static_cast<int64_t>(count); ++v) {
    const float* row = x + v * k;
    scale_of(HWY_DYNAMIC_DISPATCH(AbsMaxBits)(row, k), op.shift[v], op.finite[v]);
    int16_t* q = op.q.data() + v * op.kp;
    HWY_DYNAMIC_DISPATCH(FixRow)(row, k, op.finite[v] ? op.shift[v] : kZeroDigitsShift, q);
    std::fill(q + k, q + op.kp, int16_t{0});
  }
}

// The columns of x (k x count, row-major) as a right operand: the column maxima and the digits row
// by row (contiguous reads and writes) into op.staging; then, for the SIMD lanes (along_k), a
// blocked transposition of the int16 digits into op.q, contiguous along k. The tile unit takes
// the staging rows as they are (amx_digits_of_k_rows).
void fix_columns(const float* x, size_t k, size_t count, FixedPointOperand& op, int threads, bool along_k) {
  resize(op, count, k);
  op.amax_bits.assign(count, 0u);
  op.lane_shift.resize(count);
  // The staging rows are a little longer than `count`, an odd number of 64-byte lines: the
  // transposition reads down a column of them, and rows a power-of-two-ish stride apart would
  // fall into the same few L1 sets (768 x 3072: 3x slower).
  const size_t stride = (count + 31) / 32 * 32 + 32;
  op.staging.resize(k * stride);
  op.staging_stride = stride;
  constexpr size_t kBand = 256;  // columns per work item of the maxima
  const int64_t bands = static_cast<int64_t>((count + kBand - 1) / kBand);
  const int band_team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, bands)));
#pragma omp parallel for schedule(static) num_threads(band_team)
  for (int64_t band = 0; band < bands; ++band) {
    const size_t j0 = band * kBand, j1 = std::min(count, j0 + kBand);
    for (size_t p = 0; p < k; ++p) HWY_DYNAMIC_DISPATCH(AbsMaxBitsInto)(x + p * count + j0, j1 - j0, op.amax_bits.data() + j0);
  }
  for (size_t j = 0; j < count; ++j) {
    scale_of(op.amax_bits[j], op.shift[j], op.finite[j]);
    op.lane_shift[j] = op.finite[j] ? op.shift[j] : kZeroDigitsShift;
  }
  const int row_team = static_cast<int>(std::max<size_t>(1, std::min<size_t>(threads, k)));
#pragma omp parallel for schedule(static) num_threads(row_team)
  for (int64_t p = 0; p < static_cast<int64_t>(k); ++p) {
    HWY_DYNAMIC_DISPATCH(FixRowPerColumn)(x + p * count, count, op.lane_shift.data(), op.staging.data() + p * stride);
  }
  if (!along_k) return;
  constexpr size_t kSide = 64;  // a 64 x 64 block of int16: 8 KiB read, 8 KiB written
  const int64_t col_blocks = static_cast<int64_t>((count + kSide - 1) / kSide);
  const int col_team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, col_blocks)));
#pragma omp parallel for schedule(static) num_threads(col_team)
  for (int64_t cb = 0; cb < col_blocks; ++cb) {
    const size_t j0 = cb * kSide, j1 = std::min(count, j0 + kSide);
    for (size_t p0 = 0; p0 < k; p0 += kSide) {
      const size_t p1 = std::min(k, p0 + kSide);
      for (size_t j = j0; j < j1; ++j) {
        for (size_t p = p0; p < p1; ++p) op.q[j * op.kp + p] = op.staging[p * stride + j];
      }
    }
    for (size_t j = j0; j < j1; ++j) std::fill(op.q.data() + j * op.kp + k, op.q.data() + (j + 1) * op.kp, int16_t{0});
  }
}

// 2^e as a double, exactly (|e| well inside the normal range: shifts lie in [-115, 161]).
double pow2(int e) {
  const uint64_t bits = static_cast<uint64_t>(1023 + e) << 52;
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// C per work item: 48 x 48 for the SIMD lanes (int64 sums: 18 KiB), 128 x 128 for the tile unit
// (whole 16 x 16 tiles, taken 2 x 2 at a time; a bigger block reads each operand fewer times).
constexpr size_t kLaneBlock = 48, kTileBlock = 128;

// C (a.count x b.count, row stride ldc) from the fixed-point operands (a.k == b.k): a from fix_rows;
// b from fix_columns with along_k = !exact_products_on_tiles(unit), or a itself when symmetric:
// a and b are the same operand (C = M Mᵀ, or M M with M symmetric in its bits): only the blocks
// on and above the diagonal are computed and each sum is written to (i, j) and (j, i), which the
// reference gives the same bits (the same integer, shift_i + shift_j, the same finiteness).
void product(FixedPointOperand& a, FixedPointOperand& b, float* c, size_t ldc, bool symmetric, ExactProductUnit unit,
             int threads) {
  const size_t m = a.count, n = b.count, kp = a.kp;
  const bool tiles = exact_products_on_tiles(unit);
  const size_t side = tiles ? kTileBlock : kLaneBlock;
  if (tiles) {
    amx_row_digits(a.q.data(), a.count, a.kp, a.tile_rows, threads);
    if (symmetric) {
      amx_columns_from_rows(a.tile_rows, b.tile_columns, threads);
    } else {
      amx_digits_of_k_rows(b.staging.data(), b.k, b.count, b.staging_stride, b.tile_columns, threads);
    }
  }
  const size_t row_blocks = (m + side - 1) / side, col_blocks = (n + side - 1) / side;
  std::vector<std::pair<size_t, size_t>> blocks;
  for (size_t bi = 0; bi < row_blocks; ++bi) {
    for (size_t bj = symmetric ? bi : 0; bj < col_blocks; ++bj) blocks.emplace_back(bi, bj);
  }
  const int team = static_cast<int>(std::max<size_t>(1, std::min<size_t>(threads, blocks.size())));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<double> row_scale(m), col_scale(n);
  for (size_t i = 0; i < m; ++i) row_scale[i] = pow2(-a.shift[i]);
  for (size_t j = 0; j < n; ++j) col_scale[j] = pow2(-b.shift[j]);
  const bool columns_finite = std::all_of(b.finite.begin(), b.finite.begin() + n, [](uint8_t f) { return f != 0; });
#pragma omp parallel num_threads(team)
  {
    // Kept per thread: 128 KiB for the tile unit's blocks, which malloc would map and the kernel
    // zero-fill afresh on every call.
    thread_local std::vector<int64_t> sums;
    sums.resize(side * side);
#pragma omp for schedule(dynamic, 1)
    for (int64_t w = 0; w < static_cast<int64_t>(blocks.size()); ++w) {
      const size_t i0 = blocks[w].first * side, i1 = std::min(m, i0 + side);
      const size_t j0 = blocks[w].second * side, j1 = std::min(n, j0 + side);
      // Row i of C from its integer sums over [j0, j1): the one rounding, then NaN where an operand
      // vector is not finite.
      auto finish_row = [&](size_t i, const int64_t* row_sums) {
        float* out = c + i * ldc;
        HWY_DYNAMIC_DISPATCH(RoundSums)(row_sums, j1 - j0, row_scale[i], col_scale.data() + j0, out + j0);
        if (!a.finite[i]) {
          std::fill(out + j0, out + j1, nan);
        } else if (!columns_finite) {
          for (size_t j = j0; j < j1; ++j) out[j] = b.finite[j] ? out[j] : nan;
        }
      };
      if (tiles) {
        using FinishRow = decltype(finish_row);
        amx_dot_block(a.tile_rows, b.tile_columns, i0, i1, j0, j1, sums.data(), side,
                      [](void* f, size_t i, const int64_t* row_sums) { (*static_cast<FinishRow*>(f))(i, row_sums); },
                      &finish_row);
      } else {
        HWY_DYNAMIC_DISPATCH(DotBlock)(a.q.data(), b.q.data(), kp, i0, i1, j0, j1, sums.data(), side);
        for (size_t i = i0; i < i1; ++i) finish_row(i, sums.data() + (i - i0) * side);
      }
      // The mirror image (j, i) of the block, 16 x 16 at a time so that the rows read and the
      // rows written stay in L1 (column by column, every write was a cache line of its own).
      if (symmetric) {
        for (size_t jb = j0; jb < j1; jb += 16) {
          for (size_t ib = i0; ib < i1; ib += 16) {
            for (size_t j = jb; j < std::min(j1, jb + 16); ++j) {
              for (size_t i = ib; i < std::min(i1, ib + 16); ++i) c[j * ldc + i] = c[i * ldc + j];
            }
          }
        }
      }
    }
  }
}

// off (r x r) = m with its diagonal set to +0 (whatever m's diagonal holds, a NaN or an inf too):
// the operand of an exact product in the diagonal split (math/newton_schulz.h).
void off_diagonal(const float* m, size_t r, float* off, int threads) {
  elementwise(r, threads, [&](size_t i) {
    std::memcpy(off + i * r, m + i * r, r * sizeof(float));
    off[i * r + i] = 0.0f;
  }, r);
}

}  // namespace

double sum_of_squares_canonical(const float* x, size_t count, int threads) {
  const int64_t tiles = static_cast<int64_t>((count + math::kNormTile - 1) / math::kNormTile);
  std::vector<double> partials(static_cast<size_t>(math::kNormComponents * tiles), 0.0);
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(std::max(threads, 1), tiles)));
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t t = 0; t < tiles; ++t) {
    const float* tile = x + t * math::kNormTile;
    const size_t length = std::min<size_t>(math::kNormTile, count - t * math::kNormTile);
    double lanes[math::kNormLanes] = {};
    if (length == static_cast<size_t>(math::kNormTile)) {
      // Lane j adds, round by round and within a round quad element by element, the elements
      // 1024 r + 4 j + e: the canonical order (norm_reduction.h), with the lanes side by side so
      // that the loop over j vectorises.
      for (int r = 0; r < math::kNormRounds; ++r) {
        for (int e = 0; e < math::kNormQuad; ++e) {
          const float* at = tile + r * math::kNormRound + e;
          for (int j = 0; j < math::kNormLanes; ++j) lanes[j] = lanes[j] + math::square_in_double(at[j * math::kNormQuad]);
        }
      }
    } else {
      for (size_t e = 0; e < length; ++e) {
        const int lane = math::norm_lane_of(static_cast<int>(e));
        lanes[lane] = lanes[lane] + math::square_in_double(tile[e]);
      }
    }
    math::norm_lane_tree(lanes);
    partials[static_cast<size_t>(math::kNormComponents * t)] = lanes[0];
  }
  double sums[math::kNormComponents];
  math::combine_tile_partials(partials.data(), tiles, sums);
  return sums[0];
}

bool exact_matmul_cpu(const float* a, const float* b, float* c, size_t m, size_t k, size_t n,
                      ExactMatmulScratch* scratch, int threads) {
  if (k > math::kExactMatmulMaxK) return false;
  ExactMatmulScratch local;
  ExactMatmulScratch& s = scratch != nullptr ? *scratch : local;
  threads = std::max(threads, 1);
  fix_rows(a, m, k, s.a, threads);
  fix_columns(b, k, n, s.b, threads, !exact_products_on_tiles(s.unit));
  product(s.a, s.b, c, n, false, s.unit, threads);
  return true;
}

bool newton_schulz_exact_cpu(const float* u, size_t rows, size_t cols, float* out,
                             const math::NewtonSchulzCoefficients& coeff, int steps, float eps,
                             NewtonSchulzScratch* scratch, int threads) {
  const bool transposed = rows > cols;
  const size_t r = transposed ? cols : rows, c = transposed ? rows : cols;  // X is r x c, r <= c
  if (c > math::kExactMatmulMaxK) return false;
  NewtonSchulzScratch local;
  NewtonSchulzScratch& s = scratch != nullptr ? *scratch : local;
  threads = std::max(threads, 1);
  s.size_for(r, c);
  s.off.resize(r * r);
  float* x = s.x.data();
  newton_schulz_load(u, rows, cols, eps, x, threads);
  for (int step = 0; step < steps; ++step) {
    // A = X Xᵀ: the columns of Xᵀ are the rows of X, so one operand serves both sides.
    fix_rows(x, r, c, s.qx, threads);
    product(s.qx, s.qx, s.gram.data(), r, true, s.unit, threads);
    const float* gram = s.gram.data();
    float* gram2 = s.gram2.data();
    float* poly = s.poly.data();
    float* off = s.off.data();
    // P = A A through the diagonal split (math::newton_schulz_square_from_split): O = A with a
    // zero diagonal, P' = O O. O is symmetric in its bits as A is, so its columns are its rows.
    off_diagonal(gram, r, off, threads);
    fix_rows(off, r, r, s.qg, threads);
    product(s.qg, s.qg, gram2, r, true, s.unit, threads);
    elementwise(r, threads, [&](size_t i) {
      const float d_i = gram[i * r + i];
      for (size_t j = 0; j < r; ++j) {
        const size_t e = i * r + j;
        gram2[e] = math::newton_schulz_square_from_split(gram2[e], off[e], d_i, gram[j * r + j], i == j);
        poly[e] = math::newton_schulz_polynomial(coeff.b, coeff.c, gram[e], gram2[e]);
      }
    }, r);
    // Q = B X through the split (math::newton_schulz_apply_from_split): Q' = O_B X with O_B = B
    // with a zero diagonal, then X = (a*X) + Q.
    off_diagonal(poly, r, off, threads);
    fix_rows(off, r, r, s.qp, threads);
    fix_columns(x, r, c, s.qxt, threads, !exact_products_on_tiles(s.unit));
    product(s.qp, s.qxt, s.q.data(), c, false, s.unit, threads);
    const float* q = s.q.data();
    elementwise(r, threads, [&](size_t i) {
      const float e_i = poly[i * r + i];
      for (size_t j = 0; j < c; ++j) {
        const size_t e = i * c + j;
        const float qe = math::newton_schulz_apply_from_split(q[e], e_i, x[e]);
        x[e] = math::newton_schulz_combine(coeff.a, x[e], qe);
      }
    }, c);
  }
  newton_schulz_store(x, rows, cols, out, threads);
  return true;
}

void newton_schulz_load(const float* u, size_t rows, size_t cols, float eps, float* x, int threads) {
  const bool transposed = rows > cols;
  const size_t r = transposed ? cols : rows, c = transposed ? rows : cols;
  elementwise(r, threads, [&](size_t i) {
    for (size_t j = 0; j < c; ++j) x[i * c + j] = transposed ? u[j * cols + i] : u[i * cols + j];
  }, c);
  const float norm = static_cast<float>(std::sqrt(sum_of_squares_canonical(u, rows * cols, threads)));
  const float denom = math::newton_schulz_denominator(norm, eps);
  elementwise(r * c, threads, [&](size_t e) { x[e] = x[e] / denom; });
}

void newton_schulz_store(const float* x, size_t rows, size_t cols, float* out, int threads) {
  const bool transposed = rows > cols;
  const size_t r = transposed ? cols : rows, c = transposed ? rows : cols;
  elementwise(r, threads, [&](size_t i) {
    for (size_t j = 0; j < c; ++j) {
      if (transposed) {
        out[j * cols + i] = x[i * c + j];
      } else {
        out[i * cols + j] = x[i * c + j];
      }
    }
  }, c);
}

}  // namespace cpu
}  // namespace renaissance
#endif  // HWY_ONCE
