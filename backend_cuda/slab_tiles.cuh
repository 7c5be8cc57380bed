// The walk that takes a Newton–Schulz batch's X out of its slab (newton_schulz.h): every element of
// every entry's matrix, in the matrix's stored orientation, handed to a sink. newton_schulz.cu's
// store writes it into U; the Muon update (kernels_muon.cu) applies it to W at once, so that U is
// neither written nor read again.
//
// A block of kTile x kTileRows threads moves one kTile x kTile tile of X (r x c) of entry
// blockIdx.z (grid-stride over the entries). Where the entry is stored transposed (c x r) the
// tile passes through shared memory, so that both the slab read and the sink's accesses go along
// rows of their own arrays (coalesced) and only the shared tile is read across; the padding
// column keeps that read free of bank conflicts. Each element reaches the sink once, with the
// value the slab holds (widened exactly from bf16): the result does not depend on the order.
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

constexpr int kSlabTile = 32;
constexpr int kSlabTileRows = 8;

// The batch's matrices: entry b starts at start(b) elements into U (and W) and is stored c x r
// when transposed(b) (else r x c); no table: one matrix at 0 with the launch's `transposed`.
struct SlabEntries {
  const NewtonSchulzEntry* table;
  bool transposed;
  __device__ int64_t start(size_t b) const { return table != nullptr ? table[b].start : 0; }
  __device__ bool is_transposed(size_t b) const { return table != nullptr ? table[b].transposed != 0 : transposed; }
};

// A slab element: fp32 (exact mode) or the bits of a bf16 (fast mode), read widened exactly.
__device__ __forceinline__ float slab_get(const float* p) { return *p; }
__device__ __forceinline__ float slab_get(const uint16_t* p) { return math::bf16_to_f32(*p); }

inline dim3 slab_tile_grid(size_t nb, size_t r, size_t c) {
  return dim3(static_cast<unsigned>((c + kSlabTile - 1) / kSlabTile), static_cast<unsigned>((r + kSlabTile - 1) / kSlabTile),
              static_cast<unsigned>(std::min<size_t>(nb, 65535)));
}

// Sink: a copyable struct with
//   State entry(size_t b) const       what the sink needs per entry (read once per tile)
//   void put(const State&, int64_t e, float x) const    element e of U's layout gets X's value x
template <class T, class Sink>
__global__ void __launch_bounds__(kSlabTile* kSlabTileRows)
    slab_out_kernel(const T* __restrict__ x, const SlabEntries entries, size_t nb, size_t r, size_t c, const Sink sink,
                    SkipFlags skip) {
  if (skip_now(skip)) return;
  __shared__ float tile[kSlabTile][kSlabTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const size_t i0 = static_cast<size_t>(blockIdx.y) * kSlabTile, j0 = static_cast<size_t>(blockIdx.x) * kSlabTile;
  for (size_t b = blockIdx.z; b < nb; b += gridDim.z) {
    const int64_t m = entries.start(b);
    const T* __restrict__ xb = x + b * r * c;
    const auto state = sink.entry(b);
    if (entries.is_transposed(b)) {  // stored element j * r + i = X_ij: rows i0.. of X into the tile
      for (int k = ty; k < kSlabTile; k += kSlabTileRows) {
        const size_t i = i0 + k, j = j0 + tx;
        if (i < r && j < c) tile[k][tx] = slab_get(xb + i * c + j);
      }
      __syncthreads();
      for (int k = ty; k < kSlabTile; k += kSlabTileRows) {
        const size_t j = j0 + k, i = i0 + tx;
        if (j < c && i < r) sink.put(state, m + static_cast<int64_t>(j * r + i), tile[tx][k]);
      }
      __syncthreads();  // the tile is read before the next entry's overwrites it
    } else {
      for (int k = ty; k < kSlabTile; k += kSlabTileRows) {
        const size_t i = i0 + k, j = j0 + tx;
        if (i < r && j < c) sink.put(state, m + static_cast<int64_t>(i * c + j), slab_get(xb + i * c + j));
      }
    }
  }
}

// slab_out_kernel over a batch's slab (NewtonSchulzBatch::enqueue_to_slab), enqueued on `stream`.
template <class Sink>
void launch_slab_out(const NewtonSchulzSlab& slab, const Sink& sink, cudaStream_t stream, SkipFlags skip) {
  if (slab.nb == 0) return;
  const dim3 grid = slab_tile_grid(slab.nb, slab.r, slab.c), block(kSlabTile, kSlabTileRows);
  const SlabEntries entries{slab.entries, false};
  if (slab.bf16) {
    slab_out_kernel<<<grid, block, 0, stream>>>(static_cast<const uint16_t*>(slab.x), entries, slab.nb, slab.r, slab.c,
                                                sink, skip);
  } else {
    slab_out_kernel<<<grid, block, 0, stream>>>(static_cast<const float*>(slab.x), entries, slab.nb, slab.r, slab.c,
                                                sink, skip);
  }
  RN_CUDA_CHECK_LAUNCH("newton-schulz slab out");
}

}  // namespace cuda
}  // namespace renaissance
