// Moving a Newton–Schulz batch's matrices between their stored orientation and the slab of X
// (newton_schulz.h): slab_in_kernel makes X = matrix / denominator (the normalisation, rounded once
// into a bf16 slab in fast mode) and slab_out_kernel hands every element of X back, in the
// matrix's stored layout, to a sink: newton_schulz.cu's store writes it into U; the fused Muon
// update (kernels_muon.cu) applies it to W at once, so that U is neither written nor read again.
//
// A block of kSlabLanes x kSlabRows threads moves one kSlabTile x kSlabTile tile of X (r x c) of
// entry blockIdx.z (grid-stride over the entries); each thread moves four adjacent elements of a
// row (a quad: one 16-byte fp32 or 8-byte bf16 access) in each of kSlabTile / kSlabRows rows.
// Where the entry is stored transposed (c x r) the tile passes through shared memory, so that both
// sides go along rows of their own arrays and only the shared tile is read across (its padding
// column spreads that read over the banks). An entry whose rows do not split into aligned quads
// (a side not a multiple of 4, or a start off a 16-byte boundary) takes the same elements one by
// one. Each element gets the same operations whatever the order or width: the results do not
// depend on them.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/exact_matmul_internal.cuh"
#include "backend_cuda/newton_schulz.h"
#include "renaissance/math/precision.h"

namespace renaissance {
namespace cuda {

constexpr int kSlabTile = 64;
constexpr int kSlabLanes = kSlabTile / 4;  // threads along a tile row, a quad each
constexpr int kSlabRows = 16;              // thread rows: thread row y takes tile rows y, y + kSlabRows, ...
constexpr int kSlabPasses = kSlabTile / kSlabRows;
static_assert(kSlabTile % kSlabRows == 0 && kSlabLanes * 4 == kSlabTile, "whole quads and passes");

// The batch's matrices: entry b starts at start(b) elements into U (and W) and is stored c x r
// when transposed(b) (else r x c); no table: one matrix at 0 with the launch's `transposed`.
struct SlabEntries {
  const NewtonSchulzEntry* table;
  bool transposed;
  __device__ int64_t start(size_t b) const { return table != nullptr ? table[b].start : 0; }
  __device__ bool is_transposed(size_t b) const { return table != nullptr ? table[b].transposed != 0 : transposed; }
};

// Slab elements: fp32 (exact mode) or the bits of a bf16 (fast mode), written rounded to nearest
// even from fp32 and read widened exactly; one at a time or as an aligned quad (a float4 or a
// ushort4, x the first element).
__device__ __forceinline__ float slab_get(const float* p) { return *p; }
__device__ __forceinline__ float slab_get(const uint16_t* p) { return math::bf16_to_f32(*p); }
__device__ __forceinline__ void slab_put(float* p, float v) { *p = v; }
__device__ __forceinline__ void slab_put(uint16_t* p, float v) { *p = math::f32_to_bf16_rne(v); }
__device__ __forceinline__ float4 slab_get4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 slab_get4(const uint16_t* p) {
  const ushort4 h = *reinterpret_cast<const ushort4*>(p);
  return make_float4(math::bf16_to_f32(h.x), math::bf16_to_f32(h.y), math::bf16_to_f32(h.z), math::bf16_to_f32(h.w));
}
__device__ __forceinline__ void slab_put4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void slab_put4(uint16_t* p, float4 v) {
  *reinterpret_cast<ushort4*>(p) = make_ushort4(math::f32_to_bf16_rne(v.x), math::f32_to_bf16_rne(v.y),
                                                math::f32_to_bf16_rne(v.z), math::f32_to_bf16_rne(v.w));
}

__host__ __device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Whether entry b's rows split into aligned quads on both sides: X's rows (c) and the stored rows
// (c, or r when transposed) a multiple of 4 and the stored matrix on a 16-byte boundary (the slab's
// slices then are too: the scratch is 256-byte aligned).
__device__ __forceinline__ bool slab_quads(size_t r, size_t c, bool transposed, const void* stored) {
  return c % 4 == 0 && (!transposed || r % 4 == 0) && aligned16(stored);
}

inline dim3 slab_tile_grid(size_t nb, size_t r, size_t c) {
  return dim3(static_cast<unsigned>((c + kSlabTile - 1) / kSlabTile), static_cast<unsigned>((r + kSlabTile - 1) / kSlabTile),
              static_cast<unsigned>(std::min<size_t>(nb, 65535)));
}
inline dim3 slab_tile_block() { return dim3(kSlabLanes, kSlabRows); }

// The shared tile a transposed entry passes through, padded by a column so that a read across it
// (four rows, one column) spreads over the banks: a quad goes in along row k at columns 4 tx ..
// 4 tx + 3 and comes out across, rows 4 tx .. 4 tx + 3 of column k.
using SlabTileBuffer = float[kSlabTile][kSlabTile + 1];
__device__ __forceinline__ void tile_put_row4(SlabTileBuffer& tile, int k, int tx, float4 v) {
  tile[k][4 * tx] = v.x;
  tile[k][4 * tx + 1] = v.y;
  tile[k][4 * tx + 2] = v.z;
  tile[k][4 * tx + 3] = v.w;
}
__device__ __forceinline__ float4 tile_get_column4(const SlabTileBuffer& tile, int tx, int k) {
  return make_float4(tile[4 * tx][k], tile[4 * tx + 1][k], tile[4 * tx + 2][k], tile[4 * tx + 3][k]);
}

// Rows row0 + k (k < kSlabTile, those < rows) of a row-major source with `stride` elements a row,
// positions pos .. pos + 3 of each (those < positions; pos = 4 tx past the tile's first), into
// tile[k][4 tx + q]: a quad per row, or element by element where the rows are not aligned quads.
template <class T>
__device__ __forceinline__ void load_tile_rows(SlabTileBuffer& tile, const T* src, size_t stride, size_t row0,
                                               size_t rows, size_t pos, size_t positions, bool quads) {
  const int tx = threadIdx.x;
#pragma unroll
  for (int k = threadIdx.y; k < kSlabTile; k += kSlabRows) {
    const size_t row = row0 + k;
    if (row >= rows) continue;
    const T* p = src + row * stride + pos;
    if (quads) {
      if (pos < positions) tile_put_row4(tile, k, tx, slab_get4(p));
    } else {
      for (int q = 0; q < 4; ++q) {
        if (pos + q < positions) tile[k][4 * tx + q] = slab_get(p + q);
      }
    }
  }
}

// The four quads of one thread in one pass over a tile, in stored-layout element indices.
struct SlabQuads {
  int64_t e[kSlabPasses];   // the quad's first element (valid[k] only)
  float4 x[kSlabPasses];
  bool valid[kSlabPasses];
};

// Entry b's X (r x c, slice b of the slab x) = its stored matrix in u / denoms[b] (one __fdiv_rn
// per element, then slab_put's rounding): the matrix's transpose when it is stored c x r.
template <class T>
__global__ void __launch_bounds__(kSlabLanes* kSlabRows)
    slab_in_kernel(const float* __restrict__ u, const SlabEntries entries, size_t nb, size_t r, size_t c,
                   const float* __restrict__ denoms, T* __restrict__ x, SkipFlags skip) {
  if (skip_now(skip)) return;
  __shared__ SlabTileBuffer tile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const size_t i0 = static_cast<size_t>(blockIdx.y) * kSlabTile, j0 = static_cast<size_t>(blockIdx.x) * kSlabTile;
  const size_t jq = j0 + 4 * static_cast<size_t>(tx);  // this thread's columns of X: jq .. jq + 3
  const size_t iq = i0 + 4 * static_cast<size_t>(tx);  // transposed: its positions along a stored row
  for (size_t b = blockIdx.z; b < nb; b += gridDim.z) {
    const float* __restrict__ m = u + entries.start(b);
    T* __restrict__ xb = x + b * r * c;
    const float d = denoms[b];
    const bool transposed = entries.is_transposed(b);
    const bool quads = slab_quads(r, c, transposed, m);
    if (!transposed) {
      float4 v[kSlabPasses];
#pragma unroll
      for (int k = 0; k < kSlabPasses; ++k) {
        const size_t i = i0 + ty + k * kSlabRows;
        if (quads && i < r && jq < c) v[k] = *reinterpret_cast<const float4*>(m + i * c + jq);
      }
#pragma unroll
      for (int k = 0; k < kSlabPasses; ++k) {
        const size_t i = i0 + ty + k * kSlabRows;
        if (i >= r) continue;
        if (quads) {
          if (jq < c) {
            slab_put4(xb + i * c + jq, make_float4(__fdiv_rn(v[k].x, d), __fdiv_rn(v[k].y, d), __fdiv_rn(v[k].z, d),
                                                   __fdiv_rn(v[k].w, d)));
          }
        } else {
          for (int q = 0; q < 4; ++q) {
            if (jq + q < c) slab_put(xb + i * c + jq + q, __fdiv_rn(m[i * c + jq + q], d));
          }
        }
      }
    } else {
      // Stored rows j = j0 + k (length r), positions iq .. iq + 3, into tile[k][4 tx + q].
      load_tile_rows(tile, m, r, j0, c, iq, r, quads);
      __syncthreads();
      // X row i = i0 + k, columns jq .. jq + 3: X_ij = stored[j * r + i] = tile[j - j0][k].
#pragma unroll
      for (int k = ty; k < kSlabTile; k += kSlabRows) {
        const size_t i = i0 + k;
        if (i >= r) continue;
        if (quads) {
          if (jq < c) {
            const float4 v = tile_get_column4(tile, tx, k);
            slab_put4(xb + i * c + jq, make_float4(__fdiv_rn(v.x, d), __fdiv_rn(v.y, d), __fdiv_rn(v.z, d), __fdiv_rn(v.w, d)));
          }
        } else {
          for (int q = 0; q < 4; ++q) {
            if (jq + q < c) slab_put(xb + i * c + jq + q, __fdiv_rn(tile[4 * tx + q][k], d));
          }
        }
      }
      __syncthreads();  // the tile is read before the next entry's overwrites it
    }
  }
}

// Every element of every entry's X handed to `sink` at its index in the stored layout. Sink: a
// copyable struct with
//   State entry(size_t b) const                            what it needs per entry
//   bool quad_aligned(int64_t e) const                     whether quads may start at element e
//   void put(const State&, int64_t e, float x) const       one element
//   void put_quads(const State&, const SlabQuads&) const   a thread's quads of one tile
template <class T, class Sink>
__global__ void __launch_bounds__(kSlabLanes* kSlabRows)
    slab_out_kernel(const T* __restrict__ x, const SlabEntries entries, size_t nb, size_t r, size_t c, const Sink sink,
                    SkipFlags skip) {
  if (skip_now(skip)) return;
  __shared__ SlabTileBuffer tile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const size_t i0 = static_cast<size_t>(blockIdx.y) * kSlabTile, j0 = static_cast<size_t>(blockIdx.x) * kSlabTile;
  const size_t jq = j0 + 4 * static_cast<size_t>(tx);
  const size_t iq = i0 + 4 * static_cast<size_t>(tx);
  for (size_t b = blockIdx.z; b < nb; b += gridDim.z) {
    const int64_t m = entries.start(b);
    const T* __restrict__ xb = x + b * r * c;
    const auto state = sink.entry(b);
    const bool transposed = entries.is_transposed(b);
    const bool quads = c % 4 == 0 && (!transposed || r % 4 == 0) && sink.quad_aligned(m);
    SlabQuads out;
    if (!transposed) {
#pragma unroll
      for (int k = 0; k < kSlabPasses; ++k) {
        const size_t i = i0 + ty + k * kSlabRows;
        out.valid[k] = quads && i < r && jq < c;
        out.e[k] = m + static_cast<int64_t>(i * c + jq);
        if (out.valid[k]) out.x[k] = slab_get4(xb + i * c + jq);
      }
      if (quads) {
        sink.put_quads(state, out);
      } else {
        for (int k = 0; k < kSlabPasses; ++k) {
          const size_t i = i0 + ty + k * kSlabRows;
          for (int q = 0; q < 4 && i < r; ++q) {
            if (jq + q < c) sink.put(state, m + static_cast<int64_t>(i * c + jq + q), slab_get(xb + i * c + jq + q));
          }
        }
      }
    } else {
      // X rows i = i0 + k, columns jq .. jq + 3, into tile[k][4 tx + q].
      load_tile_rows(tile, xb, c, i0, r, jq, c, quads);
      __syncthreads();
      // Stored row j = j0 + k (length r), positions iq .. iq + 3: X_ij = tile[i - i0][k].
#pragma unroll
      for (int p = 0; p < kSlabPasses; ++p) {
        const int k = ty + p * kSlabRows;
        const size_t j = j0 + k;
        out.valid[p] = quads && j < c && iq < r;
        out.e[p] = m + static_cast<int64_t>(j * r + iq);
        if (out.valid[p]) out.x[p] = tile_get_column4(tile, tx, k);
      }
      if (quads) {
        sink.put_quads(state, out);
      } else {
        for (int p = 0; p < kSlabPasses; ++p) {
          const int k = ty + p * kSlabRows;
          const size_t j = j0 + k;
          for (int q = 0; q < 4 && j < c; ++q) {
            if (iq + q < r) sink.put(state, m + static_cast<int64_t>(j * r + iq + q), tile[4 * tx + q][k]);
          }
        }
      }
      __syncthreads();  // the tile is read before the next entry's overwrites it
    }
  }
}

// slab_out_kernel over a batch's slab (NewtonSchulzBatch::enqueue_to_slab), enqueued on `stream`.
template <class Sink>
void launch_slab_out(const NewtonSchulzSlab& slab, const Sink& sink, cudaStream_t stream, SkipFlags skip) {
  if (slab.nb == 0) return;
  const dim3 grid = slab_tile_grid(slab.nb, slab.r, slab.c);
  const SlabEntries entries{slab.entries, false};
  if (slab.bf16) {
    slab_out_kernel<<<grid, slab_tile_block(), 0, stream>>>(static_cast<const uint16_t*>(slab.x), entries, slab.nb,
                                                            slab.r, slab.c, sink, skip);
  } else {
    slab_out_kernel<<<grid, slab_tile_block(), 0, stream>>>(static_cast<const float*>(slab.x), entries, slab.nb,
                                                            slab.r, slab.c, sink, skip);
  }
  RN_CUDA_CHECK_LAUNCH("newton-schulz slab out");
}

}  // namespace cuda
}  // namespace renaissance
