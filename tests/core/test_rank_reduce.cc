// Backend::reduce_ranks (math/rank_reduction.h), the arithmetic of a sharded step's gradient
// reduction on the backend's own memory, against an independent scalar loop written here: plain
// float additions in rank order r = 0..K-1, a division by K, the 2-byte formats decoded field by
// field and rounded by the oracle of tests/support/precision_oracle.h (none of math/precision.h's bit
// tricks). Bitwise for every value that is not a NaN; a NaN must stay a NaN (its payload is the
// hardware's: x86 keeps an operand's, CUDA returns the canonical one). The CPU cells run
// everywhere; the Cuda cells skip without a device (scripts: the lead's 1x H200 filter
// --gtest_filter='RankReduce*').
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/precision_oracle.h"
#include "renaissance/backend.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

namespace po = precision_oracle;

uint64_t bytes_of(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

// An encoding's value as a float, decoded independently (fp32: its bits; NaN: a quiet NaN).
float widen(Precision p, const std::vector<uint8_t>& mem, uint64_t i) {
  if (p == Precision::kFp32) {
    float x;
    std::memcpy(&x, mem.data() + 4 * i, 4);
    return x;
  }
  uint16_t h;
  std::memcpy(&h, mem.data() + 2 * i, 2);
  return static_cast<float>(po::decode(p == Precision::kBf16 ? po::Fmt::kBf16 : po::Fmt::kF16, h));
}

bool half_is_nan(Precision p, uint16_t h) {
  return p == Precision::kBf16 ? (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0 : (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

// Random encodings of `p` with the values a gradient reduction must get right: rounding in the
// sum (similar magnitudes), cancellation, overflow to inf, subnormals, signed zeros, inf, NaN.
std::vector<uint8_t> random_encodings(Precision p, uint64_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> mem(n * bytes_of(p));
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  for (uint64_t i = 0; i < n; ++i) {
    const unsigned pick = static_cast<unsigned>(rng() % 16);
    if (p == Precision::kFp32) {
      float x = unit(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
      if (pick == 0) x = std::ldexp(unit(rng), 127);                 // the sum may overflow
      if (pick == 1) x = std::ldexp(unit(rng), -130);                // subnormal
      if (pick == 2) x = (rng() & 1) ? 0.0f : -0.0f;
      if (pick == 3) x = (rng() & 1) ? INFINITY : -INFINITY;
      if (pick == 4) x = NAN;
      std::memcpy(mem.data() + 4 * i, &x, 4);
    } else {
      uint16_t h = static_cast<uint16_t>(rng());
      if (pick < 8) h = static_cast<uint16_t>((h & 0x83ff) | (p == Precision::kBf16 ? 0x3c00 : 0x3800));  // near 1
      std::memcpy(mem.data() + 2 * i, &h, 2);
    }
  }
  return mem;
}

struct Cell {
  int summands;
  int divisor;
  Precision in, out;
};

// Runs `cell` over `summands` blocks of `stride` elements, elements [first, first + count), on
// `kind`, and compares each result with the scalar loop.
void check_cell(BackendKind kind, const Cell& cell, uint64_t seed) {
  const uint64_t stride = 1000, first = 37, count = 900;
  std::mt19937_64 rng(seed);
  const std::vector<uint8_t> blocks = random_encodings(cell.in, cell.summands * stride, rng);
  const uint64_t out_bytes = count * bytes_of(cell.out);
  const uint64_t dst_offset = (blocks.size() + 255) / 256 * 256;
  std::unique_ptr<Backend> backend = create_backend(kind, {});
  backend->allocate_arena(dst_offset + out_bytes);
  backend->upload(0, blocks.data(), blocks.size());
  std::vector<uint8_t> poison(out_bytes, 0xA5);  // every result element must be written
  backend->upload(dst_offset, poison.data(), poison.size());
  math::RankReduce op;
  op.blocks = backend->arena();
  op.stride = stride;
  op.first = first;
  op.count = count;
  op.summands = cell.summands;
  op.divisor = cell.divisor;
  op.in = cell.in;
  op.out = cell.out;
  op.dst = static_cast<char*>(backend->arena()) + dst_offset;
  backend->reduce_ranks(op);
  std::vector<uint8_t> got(out_bytes);
  backend->download(dst_offset, got.data(), got.size());

  uint64_t bad = 0;
  std::string first_bad;
  for (uint64_t i = 0; i < count; ++i) {
    float sum = widen(cell.in, blocks, first + i);
    for (int r = 1; r < cell.summands; ++r) sum = sum + widen(cell.in, blocks, static_cast<uint64_t>(r) * stride + first + i);
    if (cell.divisor > 0) sum = sum / static_cast<float>(cell.divisor);
    bool ok;
    if (cell.out == Precision::kFp32) {
      float x;
      std::memcpy(&x, got.data() + 4 * i, 4);
      uint32_t xb, eb;
      std::memcpy(&xb, &x, 4);
      std::memcpy(&eb, &sum, 4);
      ok = std::isnan(sum) ? std::isnan(x) : xb == eb;
      // The widening of a 2-byte NaN keeps its payload: bf16's bits are the top half of fp32's.
      if (ok && std::isnan(sum) && cell.in == Precision::kBf16 && cell.summands == 1 && cell.divisor == 0) {
        uint16_t h;
        std::memcpy(&h, blocks.data() + 2 * (first + i), 2);
        ok = xb == static_cast<uint32_t>(h) << 16;
      }
    } else {
      uint16_t h;
      std::memcpy(&h, got.data() + 2 * i, 2);
      const po::Fmt fmt = cell.out == Precision::kBf16 ? po::Fmt::kBf16 : po::Fmt::kF16;
      ok = std::isnan(sum) ? half_is_nan(cell.out, h) : h == po::oracle_rne(fmt, sum);
    }
    if (!ok && bad++ == 0) first_bad = "element " + std::to_string(i) + " (sum " + std::to_string(sum) + ")";
  }
  EXPECT_EQ(bad, 0u) << backend_kind_name(kind) << " summands " << cell.summands << " divisor " << cell.divisor
                     << " in " << precision_name(cell.in) << " out " << precision_name(cell.out) << ": first at "
                     << first_bad;
}

// The sharded step's three uses (ShardedStep::reduce_gradients), for every G dtype and K = 1..5.
void check_all_cells(BackendKind kind) {
  uint64_t seed = 1;
  for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    for (int k = 1; k <= 5; ++k) {
      check_cell(kind, {k, k, p, p}, seed++);                      // ordered: the rank-order mean
      check_cell(kind, {1, k, Precision::kFp32, p}, seed++);       // fast: the engine's sum / K
    }
    check_cell(kind, {1, 0, p, Precision::kFp32}, seed++);         // fast: the widening
  }
}

TEST(RankReduceCpu, MatchesTheScalarLoop) { check_all_cells(BackendKind::kCpu); }

TEST(RankReduceCuda, MatchesTheScalarLoop) {
  RN_SKIP_IF_UNAVAILABLE(BackendKind::kCuda);
  check_all_cells(BackendKind::kCuda);
}

}  // namespace
}  // namespace renaissance
