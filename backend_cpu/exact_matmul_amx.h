// Exact mode's integer dot products on Intel AMX (the AMX-INT8 tile unit of Sapphire Rapids and
// later Xeons): the same int64 sums as the Highway kernel of exact_matmul_cpu.cc, so the same bits,
// at up to 30x its multiply-add rate. Each fixed-point integer q is cut into its int8 digits hi,
// lo and hi + lo (math::fixed_point_digits); the tile unit sums the three digit products in int32
// over k chunks of math::kDigitSumMaxK (exact), and the three sums give the integer dot product in
// int64 (math::from_digit_sums, the three-product form CUDA's kernels use too). Integer sums do not
// depend on their order, so the result is the Highway kernel's integer whatever the tiling
// (docs/math.md, "Muon: the exact matrix product").
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace renaissance {
namespace cpu {

// Whether this process can run the tile unit: the CPU has AMX-TILE and AMX-INT8, the build has the
// kernel (x86-64 with a compiler that knows AMX), and the kernel granted the process its tile data
// (Linux's ARCH_REQ_XCOMP_PERM, asked once).
bool amx_int8_usable();

// The three digit planes (hi, hi + lo, lo) of one fixed-point operand, laid out for the tile unit in
// 1 KiB tiles of 16 vectors x 64 k: tile (vector tile t, k block b) at plane[d] + (t * kblocks + b)
// KiB, kblocks = kp / 64, `count` rounded up to 16 vectors (the padding 0). A left operand's tile
// holds vector (row) n in its row n; a right operand's is in the tile unit's pair layout: its row r
// holds columns n < 16 at bytes 4 n .. 4 n + 3, the digits of k = 64 b + 4 r .. 64 b + 4 r + 3.
// Storage aligned to 64-byte lines: a tile row that crosses a line costs the unit a second load.
template <class T>
struct LineAlignedAllocator {
  using value_type = T;
  LineAlignedAllocator() = default;
  template <class U>
  LineAlignedAllocator(const LineAlignedAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  bool operator==(const LineAlignedAllocator&) const { return true; }
  bool operator!=(const LineAlignedAllocator&) const { return false; }
};

struct AmxDigits {
  size_t count = 0, padded = 0, kp = 0;
  std::vector<int8_t, LineAlignedAllocator<int8_t>> plane[3];
};

// digits of a left operand: the `count` rows of q (row v's kp int16 at q[v * kp], kp a multiple
// of 64).
void amx_row_digits(const int16_t* q, size_t count, size_t kp, AmxDigits& digits, int threads);

// digits of a right operand given by its k rows: column j's q at k = p is rows[p * stride + j]
// (p < k, j < count; stride >= count rounded up to 16, the entries past count are ignored).
void amx_digits_of_k_rows(const int16_t* rows, size_t k, size_t count, size_t stride, AmxDigits& digits, int threads);

// The digits of a right operand whose columns are the vectors of `rows` (a left operand's digits):
// C = M Mᵀ. Each tile is the 16 x 16 transposition of the 4-byte words of its row layout.
void amx_columns_from_rows(const AmxDigits& rows, AmxDigits& columns, int threads);

// Receives row i of a block's integer dot products: sums[j - j0] for j in [j0, j1) (and the
// padding columns up to the next multiple of 16).
using AmxRowSink = void (*)(void* context, size_t i, const int64_t* sums);

// The integer dot products of rows i in [i0, i1) of `a` and columns j in [j0, j1) of `b` (i0, j0
// multiples of 16, a block of at most 128 x 128), handed to row(context, i, sums) in increasing i.
// `block` (128 x 128 int64, rows ld apart) is the workspace: where k fits one int32 chunk (every
// Newton–Schulz product of the built-in layouts) each row is combined from the digit sums into its
// first row just before it is handed over, so no block of int64 sums goes through memory; a longer
// k adds its chunks' sums in the whole block first.
void amx_dot_block(const AmxDigits& a, const AmxDigits& b, size_t i0, size_t i1, size_t j0, size_t j1, int64_t* block,
                   size_t ld, AmxRowSink row, void* context);

}  // namespace cpu
}  // namespace renaissance
