// The fused model copy's lookup and key (renaissance/model_copy_key.h), the functions the CUDA
// update kernels call for every quad they update, run here on the CPU against the scalar
// definitions of math/precision.h: for every quad of a span whose tensors start off multiples of
// 8 (a quad then takes words from two Philox blocks), share quads, are cut (first != 0), sit
// beyond 2^32 Philox blocks or across the counter's low-word wrap, with padding between them, the
// bits of copy_quad (or of copy_one where a quad meets a boundary) are
// round(x, sr_random_word(seed, t, param, index in tensor)), and padding is never written. With
// tensor_mask each tensor's own count keys it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "renaissance/math/precision.h"
#include "renaissance/model_copy_key.h"

namespace renaissance {
namespace {

constexpr uint64_t kSeed = 0x0123456789abcdefULL;
constexpr uint32_t kTaskStep = 0x80000003u;  // a t above 2^31: the key takes its low 32 bits unsigned

// A copy span's tensor list (as the plan's tensor tables hold one) and its element count.
struct TestCopy {
  std::vector<CopyTensor> tensors;
  struct {
    uint64_t count = 0;
  } c;
};

std::vector<int32_t> copy_chunks(const TestCopy& copy) { return tensor_chunks(copy.tensors, copy.c.count); }

TestCopy test_copy() {
  TestCopy copy;
  copy.tensors = {
      {0, 5, 3, 0},                             // shares quad 1 with the next tensor
      {5, 20003, 1, 0},                         // its blocks are shifted by 5 against the arena's
      {20040, 2, 0, 0},                         // after padding; half a quad
      {20042, 1030, 5, 7},                      // a cut tensor (first 7) across a chunk boundary
      {21072, 4099, 6, (uint64_t{1} << 34) + 1},  // block counter above 2^32
      {25171, 61, 2, 4 * uint64_t{0xffffffffu} - 6},  // its blocks cross the counter's low-word wrap
  };
  copy.c.count = 25280;  // padding after the last tensor too
  return copy;
}

float master(uint64_t e) {  // ordinary values, exact bf16/fp16 ties, fp16 overflow, a NaN and infinities
  if (e % 97 == 11) return math::f32_from_bits(0x7fc00001u);
  if (e % 89 == 7) return e % 2 ? -INFINITY : INFINITY;
  if (e % 7 == 3) return math::f32_from_bits(0x3f808000u + ((e % 3) << 16));
  if (e % 11 == 5) return 65510.0f + static_cast<float>(e % 5) * 4.0f;
  return static_cast<float>(e % 1000) * 1.37e-3f - 0.6f;
}

// The scalar definition of element e's copy bits; false where e is padding.
bool expected(const TestCopy& copy, Precision p, Rounding r, const int32_t* steps, uint64_t e, uint16_t* out) {
  for (const CopyTensor& t : copy.tensors) {
    if (e < t.begin || e >= t.begin + t.numel) continue;
    const uint64_t step = steps ? static_cast<uint32_t>(steps[t.param]) : kTaskStep;
    const uint32_t word = math::sr_random_word(kSeed, step, t.param, t.first + (e - t.begin));
    const float x = master(e);
    if (r == Rounding::kNearest) *out = p == Precision::kBf16 ? math::f32_to_bf16_rne(x) : math::f32_to_f16_rne(x);
    else *out = p == Precision::kBf16 ? math::f32_to_bf16_sr(x, word) : math::f32_to_f16_sr(x, word);
    return true;
  }
  return false;
}

// Every quad (kN = 4 span elements, copy_quad) against the scalar definition.
template <Precision kP, Rounding kR, int kN>
void check_every_unit(const int32_t* steps) {
  const TestCopy copy = test_copy();
  const std::vector<int32_t> chunks = copy_chunks(copy);
  const CopyLookup lookup{copy.tensors.data(), chunks.data(), static_cast<uint32_t>(copy.tensors.size())};
  uint64_t fast = 0, shifted = 0, mismatches = 0, padding = 0;
  for (uint64_t e0 = 0; e0 < copy.c.count; e0 += kN) {
    uint16_t got[kN] = {};
    bool written[kN] = {};
    float x[kN];
    for (int j = 0; j < kN; ++j) x[j] = master(e0 + j);
    const bool whole = copy_quad<kP, kR>(lookup, kSeed, steps, kTaskStep, e0, x[0], x[1], x[2], x[3], got);
    if (whole) {
      ++fast;
      const uint32_t i = lookup.find(e0);
      if ((copy.tensors[i].first + (e0 - copy.tensors[i].begin)) % math::kSrBlockElements != 0) ++shifted;
      for (bool& w : written) w = true;
    } else {
      for (int j = 0; j < kN; ++j) written[j] = copy_one<kP, kR>(lookup, kSeed, steps, kTaskStep, e0 + j, x[j], &got[j]);
    }
    for (int j = 0; j < kN; ++j) {
      uint16_t want = 0;
      const bool in_tensor = expected(copy, kP, kR, steps, e0 + j, &want);
      padding += in_tensor ? 0 : 1;
      if (written[j] != in_tensor || (in_tensor && got[j] != want)) {
        if (++mismatches <= 5) {
          ADD_FAILURE() << "unit " << kN << " element " << e0 + j << ": written " << written[j] << " (want "
                        << in_tensor << "), bits 0x" << std::hex << got[j] << " want 0x" << want << std::dec;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
  // The layout exercises both fast paths (one and two Philox blocks per unit) and padding.
  EXPECT_GT(fast, 20000u / kN);
  EXPECT_GT(shifted, 16000u / kN);
  EXPECT_EQ(padding, 32u + 48u);  // 20008 .. 20040 and 25232 .. 25280
}

template <Precision kP, Rounding kR>
void check_every_quad(const int32_t* steps) {
  check_every_unit<kP, kR, 4>(steps);
}

// The CUDA warp-pair path (model_copy.cuh's quad_pairs) with the warp simulated: passes of 64
// quads from quad `first`, lane j holding quads j and 32 + j, each lane drawing the block its
// pair keys name, the partners swapping the words pair_sent_words picks (the shuffle), each
// quad rounded with its pair's words when whole, else by copy_quad / copy_one. Every element
// must have the scalar definition's bits, and both lanes of a pair must agree that it is whole
// (the odd lane of a whole a-pair uses the words its partner drew).
template <Precision kP>
uint64_t check_warp_pairs(const TestCopy& copy, const int32_t* steps, uint64_t first) {
  const std::vector<int32_t> chunks = copy_chunks(copy);
  const CopyLookup lookup{copy.tensors.data(), chunks.data(), static_cast<uint32_t>(copy.tensors.size())};
  const uint64_t end = copy.c.count / 4;
  std::vector<uint16_t> got(copy.c.count, 0);
  std::vector<bool> written(copy.c.count, false);
  uint64_t whole_quads = 0, disagreements = 0;
  auto write_quad = [&](uint64_t q, bool whole, uint32_t w0, uint32_t w1) {
    const uint64_t e0 = 4 * q;
    float x[4];
    for (int j = 0; j < 4; ++j) x[j] = master(e0 + j);
    uint16_t out[4];
    if (whole) {
      ++whole_quads;
      copy_pair_quad<kP>(w0, w1, x[0], x[1], x[2], x[3], out);
    } else if (!copy_quad<kP, Rounding::kStochastic>(lookup, kSeed, steps, kTaskStep, e0, x[0], x[1], x[2], x[3], out)) {
      for (int j = 0; j < 4; ++j) {
        if (copy_one<kP, Rounding::kStochastic>(lookup, kSeed, steps, kTaskStep, e0 + j, x[j], &got[e0 + j])) {
          written[e0 + j] = true;
        }
      }
      return;
    }
    for (int j = 0; j < 4; ++j) {
      got[e0 + j] = out[j];
      written[e0 + j] = true;
    }
  };
  for (uint64_t base = first; base < end; base += 64) {
    CopyPairKey ka[32], kb[32];
    math::Philox4x32 block[32];
    PairSent sent[32];
    for (uint32_t lane = 0; lane < 32; ++lane) {
      const bool odd = lane & 1u;
      const uint64_t qa = base + lane, qb = qa + 32;
      ka[lane] = qa < end ? copy_pair_key(lookup, steps, kTaskStep, 4 * qa, odd) : CopyPairKey{};
      kb[lane] = qb < end ? copy_pair_key(lookup, steps, kTaskStep, 4 * qb, odd) : CopyPairKey{};
      block[lane] = pair_lane_block(odd, kSeed, ka[lane], kb[lane]);
      sent[lane] = pair_sent_words(odd, block[lane]);
    }
    for (uint32_t lane = 0; lane < 32; ++lane) {
      const bool odd = lane & 1u;
      disagreements += (ka[lane].whole != ka[lane ^ 1u].whole) + (kb[lane].whole != kb[lane ^ 1u].whole);
      const PairLaneWords r = pair_lane_words(odd, block[lane], sent[lane ^ 1u]);  // the shuffle
      const uint64_t qa = base + lane, qb = qa + 32;
      if (qa < end) write_quad(qa, ka[lane].whole, r.a0, r.a1);
      if (qb < end) write_quad(qb, kb[lane].whole, r.b0, r.b1);
    }
  }
  EXPECT_EQ(disagreements, 0u);
  uint64_t mismatches = 0;
  for (uint64_t e = 4 * first; e < copy.c.count; ++e) {
    uint16_t want = 0;
    const bool in_tensor = expected(copy, kP, Rounding::kStochastic, steps, e, &want);
    if (written[e] != in_tensor || (in_tensor && got[e] != want)) {
      if (++mismatches <= 5) {
        ADD_FAILURE() << "warp pairs, element " << e << ": written " << written[e] << " (want " << in_tensor
                      << "), bits 0x" << std::hex << got[e] << " want 0x" << want << std::dec;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
  return whole_quads;
}

// A layout with tensors on the pair grid (index 0 at an arena multiple of 8, or a cut tensor whose
// first index keeps it there), one shifted by 4 (every pair is split between two blocks), one
// ending inside a pair, tiny ones and padding.
TestCopy pair_copy() {
  TestCopy copy;
  copy.tensors = {
      {0, 4096, 0, 0},       // on the grid
      {4096, 1004, 1, 16},   // cut, still on the grid; ends inside a pair
      {5100, 3000, 2, 0},    // index 0 at 4 past a multiple of 8: no pair is whole
      {8100, 6, 3, 0},       // smaller than a pair
      {8192, 2052, 4, 24},   // after padding, on the grid, ends inside a pair
  };
  copy.c.count = 10304;  // 2576 quads, padding after the last tensor
  return copy;
}

TEST(ModelCopyKey, WarpPairsHaveTheScalarDefinitionsBits) {
  const TestCopy grid = pair_copy(), shifted = test_copy();
  const int32_t steps[7] = {4, 9, 1, 0, 7, 2, 3};  // tensor_mask: each tensor's own count
  // (4096 + 1000 + 2048) / 4 quads take the pair words; the rest, copy_quad / copy_one.
  EXPECT_EQ(check_warp_pairs<Precision::kBf16>(grid, nullptr, 0), 1786u);
  EXPECT_EQ(check_warp_pairs<Precision::kFp16>(grid, steps, 0), 1786u);
  EXPECT_EQ(check_warp_pairs<Precision::kBf16>(grid, nullptr, 16), 1786u - 16u);  // an item from quad 16
  // test_copy's tensors are all off the pair grid (or too short): every quad falls back.
  EXPECT_EQ(check_warp_pairs<Precision::kFp16>(shifted, nullptr, 0), 0u);
  EXPECT_EQ(check_warp_pairs<Precision::kBf16>(shifted, steps, 16), 0u);
}

TEST(ModelCopyKey, ChunkIndexNamesTheFirstTensorEndingAfterEachChunk) {
  const TestCopy copy = test_copy();
  const std::vector<int32_t> chunks = copy_chunks(copy);
  ASSERT_EQ(chunks.size(), (copy.c.count + kCopyChunk - 1) / kCopyChunk);
  EXPECT_EQ(chunks[0], 0);
  EXPECT_EQ(chunks[1], 1);                // element 1024 lies in tensor 1
  EXPECT_EQ(chunks[19], 1);               // 19456 .. 20479: tensor 1 ends at 20008
  EXPECT_EQ(chunks[20], 3);               // 20480: tensor 3 (20042 .. 21072)
  EXPECT_EQ(chunks[24], 4);               // 24576: tensor 4 (21072 .. 25171)
}

TEST(ModelCopyKey, EveryQuadAndOctetHasTheScalarDefinitionsBits) {
  check_every_quad<Precision::kBf16, Rounding::kNearest>(nullptr);
  check_every_quad<Precision::kFp16, Rounding::kNearest>(nullptr);
  check_every_quad<Precision::kBf16, Rounding::kStochastic>(nullptr);
  check_every_quad<Precision::kFp16, Rounding::kStochastic>(nullptr);
}

TEST(ModelCopyKey, TensorMaskKeysEachTensorWithItsOwnCount) {
  const int32_t steps[7] = {4, 9, 1, 0, 7, 2, 3};  // by param id
  check_every_quad<Precision::kBf16, Rounding::kStochastic>(steps);
  check_every_quad<Precision::kFp16, Rounding::kStochastic>(steps);
}

}  // namespace
}  // namespace renaissance
