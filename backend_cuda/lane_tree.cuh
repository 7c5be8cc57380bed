// The canonical halving tree of renaissance/math/norm_reduction.h (math::norm_lane_tree) over a
// block of kNormLanes threads, for the device code that sums norms: the norm kinds' tile walker
// (tile_walker.cuh) and Newton-Schulz's Frobenius norm (newton_schulz.cu).
#pragma once

#include <cuda_runtime.h>

#include "renaissance/math/norm_reduction.h"

namespace renaissance {
namespace cuda {

// Two lane sums per thread, double-buffered between consecutive tiles of a block (so that the
// next tile's stores never wait for the previous tree to be read).
struct LaneScratch {
  double lanes[2][math::kNormComponents][math::kNormLanes];
};

// math::norm_lane_tree over the block's kNormLanes threads for two sums at once: the levels
// s = 128, 64, 32 through shared memory, s = 16 ... 1 inside warp 0 by shuffles (lane j adds the
// value lane j + s holds: the same additions, in the same operand order). Thread 0 returns the
// roots. `buf` alternates between tiles.
__device__ __forceinline__ void block_lane_tree(LaneScratch& sh, int buf, double& a, double& b) {
  const int j = threadIdx.x;
  double* la = sh.lanes[buf][0];
  double* lb = sh.lanes[buf][1];
  la[j] = a;
  lb[j] = b;
  __syncthreads();
#pragma unroll
  for (int s = math::kNormLanes / 2; s >= 64; s >>= 1) {
    if (j < s) {
      la[j] = la[j] + la[j + s];
      lb[j] = lb[j] + lb[j + s];
    }
    __syncthreads();
  }
  if (j < 32) {
    a = la[j] + la[j + 32];
    b = lb[j] + lb[j + 32];
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      a = a + __shfl_down_sync(0xffffffffu, a, s);
      b = b + __shfl_down_sync(0xffffffffu, b, s);
    }
  }
}

}  // namespace cuda
}  // namespace renaissance
