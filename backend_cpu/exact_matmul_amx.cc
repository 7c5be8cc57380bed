// Exact mode's integer dot products on the AMX tile unit (exact_matmul_amx.h). This file alone is
// built with the AMX and AVX-512 instruction sets (backend_cpu/CMakeLists.txt); nothing in it runs
// unless amx_int8_usable() said yes, and every CPU with AMX-INT8 has AVX-512 (checked too).
#include "backend_cpu/exact_matmul_amx.h"

#include <stdexcept>

#include "renaissance/math/exact_matmul.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace renaissance {
namespace cpu {
namespace {

constexpr size_t kTile = 16;          // rows (and int32 columns) of a tile
constexpr size_t kKBlock = 64;        // k per tile: 64 int8 in a row of the left operand's tile
constexpr size_t kTileBytes = 1024;   // 16 rows of 64 bytes
// k blocks summed in int32 before the int64 combination (math::kDigitSumMaxK).
constexpr size_t kChunkBlocks = math::kDigitSumMaxK / kKBlock;

// The tile palette: eight 16 x 64-byte tiles (palette 1), the layout of ldtilecfg's 64 bytes.
struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = kTile;
    config.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&config);
}

// C tiles per side of a block (amx_dot_block).
constexpr size_t kBlockTiles = 8;

// acc tiles (MR x NR, 1 KiB each: acc[r][c] at acc + (r * kBlockTiles + c) * 256 int32) = the digit
// products over k blocks [kb0, kb1) of the left tiles at a (row tile r's block kb at
// a + (r * kblocks + kb) KiB) and the right tiles at b (the same for column tiles). Tiles 0..3
// hold C, 4, 5 the left tiles, 6, 7 the right ones. (Splitting [kb0, kb1) so that the operands'
// tiles stay in L1, with the sums reloaded between the pieces, measured no faster.)
template <int MR, int NR>
void dot_tiles(const int8_t* a, const int8_t* b, size_t kblocks, size_t kb0, size_t kb1, int32_t* acc) {
  constexpr size_t ld = 16 * sizeof(int32_t);
  constexpr size_t kAcc = 256;
  _tile_zero(0);
  if constexpr (NR == 2) _tile_zero(1);
  if constexpr (MR == 2) _tile_zero(2);
  if constexpr (MR == 2 && NR == 2) _tile_zero(3);
  const size_t row_step = kblocks * kTileBytes;
  for (size_t kb = kb0; kb < kb1; ++kb) {
    _tile_loadd(4, a + kb * kTileBytes, 64);
    if constexpr (MR == 2) _tile_loadd(5, a + row_step + kb * kTileBytes, 64);
    _tile_loadd(6, b + kb * kTileBytes, 64);
    if constexpr (NR == 2) _tile_loadd(7, b + row_step + kb * kTileBytes, 64);
    _tile_dpbssd(0, 4, 6);
    if constexpr (NR == 2) _tile_dpbssd(1, 4, 7);
    if constexpr (MR == 2) _tile_dpbssd(2, 5, 6);
    if constexpr (MR == 2 && NR == 2) _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, acc, ld);
  if constexpr (NR == 2) _tile_stored(1, acc + kAcc, ld);
  if constexpr (MR == 2) _tile_stored(2, acc + kBlockTiles * kAcc, ld);
  if constexpr (MR == 2 && NR == 2) _tile_stored(3, acc + (kBlockTiles + 1) * kAcc, ld);
}

void dot_tiles(int mr, int nr, const int8_t* a, const int8_t* b, size_t kblocks, size_t kb0, size_t kb1, int32_t* acc) {
  if (mr == 2 && nr == 2) dot_tiles<2, 2>(a, b, kblocks, kb0, kb1, acc);
  if (mr == 2 && nr == 1) dot_tiles<2, 1>(a, b, kblocks, kb0, kb1, acc);
  if (mr == 1 && nr == 2) dot_tiles<1, 2>(a, b, kblocks, kb0, kb1, acc);
  if (mr == 1 && nr == 1) dot_tiles<1, 1>(a, b, kblocks, kb0, kb1, acc);
}

bool cpu_has_amx_int8() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool tile = (edx >> 24) & 1u, int8 = (edx >> 25) & 1u;
  return tile && int8 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

// Linux hands out the tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA); the grant holds for the whole process.
bool os_grants_tiles() {
  constexpr long kReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

bool amx_int8_usable() {
  static const bool usable = cpu_has_amx_int8() && os_grants_tiles();
  return usable;
}

void amx_row_digits(const int16_t* q, size_t count, size_t kp, AmxDigits& digits, int threads) {
  digits.count = count;
  digits.padded = (count + kTile - 1) / kTile * kTile;
  digits.kp = kp;
  for (auto& plane : digits.plane) plane.resize(digits.padded * kp);
  const size_t kblocks = kp / kKBlock;
  const int64_t tiles = static_cast<int64_t>(digits.padded / kTile);
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, tiles)));
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t t = 0; t < tiles; ++t) {
    // One tile at a time (its three planes, 3 KiB, stay in L1 while its 16 rows fill them).
    for (size_t b = 0; b < kblocks; ++b) {
      const size_t tile = (t * kblocks + b) * kTileBytes;
      for (size_t n = 0; n < kTile; ++n) {
        const size_t v = t * kTile + n, at = tile + n * kKBlock;
        if (v >= count) {
          for (auto& plane : digits.plane) std::memset(plane.data() + at, 0, kKBlock);
          continue;
        }
        // Into a local block first: written through the planes, the loop would not vectorise.
        alignas(64) int8_t d[3][kKBlock];
        const int16_t* src = q + v * kp + b * kKBlock;
        for (size_t p = 0; p < kKBlock; ++p) {
          const math::FixedPointDigits digit = math::fixed_point_digits(src[p]);
          d[0][p] = digit.hi;
          d[1][p] = digit.sum;
          d[2][p] = digit.lo;
        }
        for (int plane = 0; plane < 3; ++plane) std::memcpy(digits.plane[plane].data() + at, d[plane], kKBlock);
      }
    }
  }
}

void amx_digits_of_k_rows(const int16_t* rows, size_t k, size_t count, size_t stride, AmxDigits& digits, int threads) {
  digits.count = count;
  digits.padded = (count + kTile - 1) / kTile * kTile;
  digits.kp = (k + kKBlock - 1) / kKBlock * kKBlock;
  for (auto& plane : digits.plane) plane.resize(digits.padded * digits.kp);
  const size_t kblocks = digits.kp / kKBlock;
  const int64_t tiles = static_cast<int64_t>(digits.padded / kTile);
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, tiles)));
  const __m256i c64 = _mm256_set1_epi16(64), c127 = _mm256_set1_epi16(127);
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t t = 0; t < tiles; ++t) {
    // The columns of this tile that exist: lanes past `count` are zero digits.
    const size_t live = std::min<size_t>(kTile, count - t * kTile);
    const __mmask16 keep = static_cast<__mmask16>((1u << live) - 1u);
    for (size_t b = 0; b < kblocks; ++b) {
      int8_t* dst[3];
      for (int plane = 0; plane < 3; ++plane) dst[plane] = digits.plane[plane].data() + (t * kblocks + b) * kTileBytes;
      for (size_t w = 0; w < kKBlock / 4; ++w) {
        // Tile row w: k = 64 b + 4 w + i for i < 4, byte 4 n + i for column n. The digits of the
        // four k rows (16 columns each), then a 4 x 16 byte interleave per plane.
        __m128i d[3][4];
        for (size_t i = 0; i < 4; ++i) {
          const size_t p = b * kKBlock + 4 * w + i;
          const __m256i q = p < k ? _mm256_maskz_loadu_epi16(keep, rows + p * stride + t * kTile) : _mm256_setzero_si256();
          // math::fixed_point_digits in int16 lanes (q - lo is a multiple of 128: >> 7 is exact).
          const __m256i lo = _mm256_sub_epi16(_mm256_and_si256(_mm256_add_epi16(q, c64), c127), c64);
          const __m256i hi = _mm256_srai_epi16(_mm256_sub_epi16(q, lo), 7);
          d[0][i] = _mm256_cvtepi16_epi8(hi);
          d[1][i] = _mm256_cvtepi16_epi8(_mm256_add_epi16(hi, lo));
          d[2][i] = _mm256_cvtepi16_epi8(lo);
        }
        for (int plane = 0; plane < 3; ++plane) {
          const __m128i t0 = _mm_unpacklo_epi8(d[plane][0], d[plane][1]);
          const __m128i t1 = _mm_unpackhi_epi8(d[plane][0], d[plane][1]);
          const __m128i t2 = _mm_unpacklo_epi8(d[plane][2], d[plane][3]);
          const __m128i t3 = _mm_unpackhi_epi8(d[plane][2], d[plane][3]);
          int8_t* row = dst[plane] + w * 64;
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row), _mm_unpacklo_epi16(t0, t2));        // columns 0-3
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 16), _mm_unpackhi_epi16(t0, t2));   // 4-7
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 32), _mm_unpacklo_epi16(t1, t3));   // 8-11
          _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 48), _mm_unpackhi_epi16(t1, t3));   // 12-15
        }
      }
    }
  }
}

void amx_columns_from_rows(const AmxDigits& rows, AmxDigits& columns, int threads) {
  columns.count = rows.count;
  columns.padded = rows.padded;
  columns.kp = rows.kp;
  const int64_t tiles = static_cast<int64_t>(rows.padded / kTile * (rows.kp / kKBlock) * 3);
  for (auto& plane : columns.plane) plane.resize(rows.padded * rows.kp);
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, tiles / 64 + 1)));
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t e = 0; e < tiles; ++e) {
    const int plane = static_cast<int>(e % 3);
    const size_t at = static_cast<size_t>(e / 3) * kTileBytes;
    // A row tile's row n holds vector n's 16 words (k = 4 w .. 4 w + 3 each); the column tile's
    // row w holds word w of each vector n: a 16 x 16 transposition in three unpack stages.
    const int8_t* in = rows.plane[plane].data() + at;
    int8_t* out = columns.plane[plane].data() + at;
    __m512i r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(in + 64 * i);
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
      r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
      r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
      r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8) {
      for (int i = 0; i < 4; ++i) {
        t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + 4 + i], 0x88);
        t[h + 4 + i] = _mm512_shuffle_i32x4(r[h + i], r[h + 4 + i], 0xdd);
      }
    }
    for (int i = 0; i < 8; ++i) {
      _mm512_store_si512(out + 64 * i, _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88));
      _mm512_store_si512(out + 64 * (8 + i), _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd));
    }
  }
}

namespace {

// The tiles of a C block of `rows` x `cols` tiles from row tile rt0 and column tile ct0.
struct BlockTiles {
  size_t rt0, rows, ct0, cols;
};

BlockTiles block_tiles(size_t i0, size_t i1, size_t j0, size_t j1) {
  const BlockTiles t{i0 / kTile, (i1 + kTile - 1) / kTile - i0 / kTile, j0 / kTile, (j1 + kTile - 1) / kTile - j0 / kTile};
  if (t.rows > kBlockTiles || t.cols > kBlockTiles) throw std::logic_error("amx_dot_block: a block is at most 128 x 128");
  return t;
}

// The int32 sums of the three digit products over k blocks [kc0, kc1) for the block's tiles, in
// this thread's buffer: digit product d's tile (r, c) at of(d) + (r * kBlockTiles + c) * 256.
class DigitSums {
 public:
  const int32_t* of(int d) const { return buffer_.data() + static_cast<size_t>(d) * kBlockTiles * kBlockTiles * 256; }
  void compute(const AmxDigits& a, const AmxDigits& b, const BlockTiles& t, size_t kblocks, size_t kc0, size_t kc1) {
    for (int d = 0; d < 3; ++d) {
      const int8_t* ap = a.plane[d].data() + t.rt0 * kblocks * kTileBytes;
      const int8_t* bp = b.plane[d].data() + t.ct0 * kblocks * kTileBytes;
      int32_t* acc = buffer_.data() + static_cast<size_t>(d) * kBlockTiles * kBlockTiles * 256;
      for (size_t r = 0; r < t.rows; r += 2) {
        for (size_t c = 0; c < t.cols; c += 2) {
          dot_tiles(static_cast<int>(std::min<size_t>(2, t.rows - r)), static_cast<int>(std::min<size_t>(2, t.cols - c)),
                    ap + r * kblocks * kTileBytes, bp + c * kblocks * kTileBytes, kblocks, kc0, kc1,
                    acc + (r * kBlockTiles + c) * 256);
        }
      }
    }
  }
  // Where C's row r (within the block) and column tile ct start in each digit product's sums.
  static size_t at(size_t r, size_t ct) { return ((r / kTile) * kBlockTiles + ct) * 256 + (r % kTile) * kTile; }

 private:
  std::vector<int32_t> buffer_ = std::vector<int32_t>(3 * kBlockTiles * kBlockTiles * 256);
};

DigitSums& thread_digit_sums() {
  thread_local DigitSums sums;
  return sums;
}

}  // namespace

void amx_dot_block(const AmxDigits& a, const AmxDigits& b, size_t i0, size_t i1, size_t j0, size_t j1, int64_t* block,
                   size_t ld, AmxRowSink row, void* context) {
  const size_t kblocks = a.kp / kKBlock;
  const BlockTiles t = block_tiles(i0, i1, j0, j1);
  const size_t width = t.cols * kTile;
  // C's row r of the block from the digit sums of one chunk: 16 sums from each column tile.
  DigitSums& acc = thread_digit_sums();
  auto combine_row = [&](size_t r, int64_t* out, bool add) {
    for (size_t ct = 0; ct < t.cols; ++ct) {
      const size_t at = DigitSums::at(r, ct);
      const int32_t* hh = acc.of(0) + at;
      const int32_t* ss = acc.of(1) + at;
      const int32_t* ll = acc.of(2) + at;
      int64_t* o = out + ct * kTile;
      if (add) {
        for (size_t e = 0; e < kTile; ++e) o[e] += math::from_digit_sums(hh[e], ss[e], ll[e]);
      } else {
        for (size_t e = 0; e < kTile; ++e) o[e] = math::from_digit_sums(hh[e], ss[e], ll[e]);
      }
    }
  };
  if (kblocks == 0) {  // k = 0: every sum is 0
    std::fill(block, block + width, int64_t{0});
    for (size_t i = i0; i < i1; ++i) row(context, i, block);
    return;
  }
  configure_tiles();
  if (kblocks <= kChunkBlocks) {
    // One chunk (every Newton–Schulz product of the built-in layouts): each row is combined as it
    // is handed over, in the first row of `block`, which stays in L1.
    acc.compute(a, b, t, kblocks, 0, kblocks);
    _tile_release();
    for (size_t i = i0; i < i1; ++i) {
      combine_row(i - i0, block, false);
      row(context, i, block);
    }
    return;
  }
  for (size_t kc0 = 0; kc0 < kblocks; kc0 += kChunkBlocks) {
    acc.compute(a, b, t, kblocks, kc0, std::min(kblocks, kc0 + kChunkBlocks));
    for (size_t r = 0; r < i1 - i0; ++r) combine_row(r, block + r * ld, kc0 != 0);
  }
  _tile_release();
  for (size_t i = i0; i < i1; ++i) row(context, i, block + (i - i0) * ld);
}

}  // namespace cpu
}  // namespace renaissance

#else  // no AMX kernel in this build

namespace renaissance {
namespace cpu {

bool amx_int8_usable() { return false; }

void amx_row_digits(const int16_t*, size_t, size_t, AmxDigits&, int) {
  throw std::logic_error("amx_row_digits: this build has no AMX kernel (amx_int8_usable() is false)");
}

void amx_digits_of_k_rows(const int16_t*, size_t, size_t, size_t, AmxDigits&, int) {
  throw std::logic_error("amx_digits_of_k_rows: this build has no AMX kernel (amx_int8_usable() is false)");
}

void amx_columns_from_rows(const AmxDigits&, AmxDigits&, int) {
  throw std::logic_error("amx_columns_from_rows: this build has no AMX kernel (amx_int8_usable() is false)");
}

void amx_dot_block(const AmxDigits&, const AmxDigits&, size_t, size_t, size_t, size_t, int64_t*, size_t, AmxRowSink,
                   void*) {
  throw std::logic_error("amx_dot_block: this build has no AMX kernel (amx_int8_usable() is false)");
}

}  // namespace cpu
}  // namespace renaissance

#endif
