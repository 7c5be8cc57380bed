// The CUDA same-traffic reference: one pass of Backend::same_traffic_gbps reads the
// spans a step reads and writes back the spans it writes, over the task's own arena, shaped like
// the step's kernels: an updating pass has one 16-byte vector per thread (elementwise.cuh), a
// read-only pass four per trip over a resident grid (check_finite_kernel). The arithmetic is
// trivial and leaves every bit as it was (x ^= t & key, key 0 at run time); a read-only pass
// folds what it read and stores it only when (fold & key) != 0, so its loads cannot be dropped.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/cuda_ops.h"
#include "renaissance/error.h"

namespace renaissance {
namespace cuda {
namespace {

struct Streams {
  const uint4* reads[2];
  uint4* updates[3];
};

__device__ __forceinline__ uint4 xor4(uint4 a, uint4 b) { return make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w); }
__device__ __forceinline__ uint4 and1(uint4 a, uint32_t k) { return make_uint4(a.x & k, a.y & k, a.z & k, a.w & k); }

constexpr int kReadUnroll = 4;  // as kCheckUnroll in kernels_check.cu

template <int R, int U>
__global__ void same_traffic_kernel(Streams s, uint64_t n4, uint32_t key, uint32_t* __restrict__ sink) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (U == 0) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (uint64_t q0 = first; q0 < n4; q0 += kReadUnroll * stride) {
      uint4 v[kReadUnroll][R];
#pragma unroll
      for (int k = 0; k < kReadUnroll; ++k) {
        const uint64_t q = q0 + k * stride;
#pragma unroll
        for (int r = 0; r < R; ++r) v[k][r] = q < n4 ? s.reads[r][q] : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int k = 0; k < kReadUnroll; ++k) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc = xor4(acc, v[k][r]);
      }
    }
    const uint32_t fold = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if ((fold & key) != 0) *sink = fold;
  } else {
    for (uint64_t q = first; q < n4; q += stride) {
      uint4 t = s.reads[0][q];
#pragma unroll
      for (int r = 1; r < R; ++r) t = xor4(t, s.reads[r][q]);
      // All loads before any store, as elementwise_update_kernel: the streams are not __restrict__.
      uint4 old[U];
#pragma unroll
      for (int u = 0; u < U; ++u) old[u] = s.updates[u][q];
      const uint4 delta = and1(t, key);
#pragma unroll
      for (int u = 0; u < U; ++u) s.updates[u][q] = xor4(old[u], delta);
    }
  }
}

template <int R, int U>
void launch(const Streams& s, uint64_t n4, uint32_t key, uint32_t* sink, const LaunchConfig& launch,
            cudaStream_t stream) {
  const int block = fit_block<&same_traffic_kernel<R, U>>(launch.block);
  unsigned grid = grid_for(U == 0 ? (n4 + kReadUnroll - 1) / kReadUnroll : n4, block, launch);
  if (U == 0 && launch.grid == 0) grid = std::min<unsigned>(grid, launch.sm_count * (2048 / block));
  same_traffic_kernel<R, U><<<grid, block, 0, stream>>>(s, n4, key, sink);
  RN_CUDA_CHECK_LAUNCH("same_traffic_kernel");
}

}  // namespace

void launch_same_traffic(char* arena, const TrafficPass& pass, uint32_t key, uint32_t* sink,
                         const LaunchConfig& config, cudaStream_t stream) {
  // Plan spans are padded to 64 floats, so every one is a whole number of 16-byte vectors.
  if (pass.reads.empty() || pass.reads.size() > 2 || pass.updates.size() > 3 || pass.count % 4 != 0) {
    throw Error(ErrorKind::kBackend, "same-traffic pass with " + std::to_string(pass.reads.size()) + " reads, " +
                                         std::to_string(pass.updates.size()) + " updates and " +
                                         std::to_string(pass.count) + " elements is not supported");
  }
  if (pass.count == 0) return;
  Streams s{};
  for (size_t r = 0; r < pass.reads.size(); ++r) s.reads[r] = reinterpret_cast<const uint4*>(arena + pass.reads[r]);
  for (size_t u = 0; u < pass.updates.size(); ++u) s.updates[u] = reinterpret_cast<uint4*>(arena + pass.updates[u]);
  const uint64_t n4 = pass.count / 4;
  switch (pass.reads.size() * 4 + pass.updates.size()) {
    case 4: return launch<1, 0>(s, n4, key, sink, config, stream);
    case 5: return launch<1, 1>(s, n4, key, sink, config, stream);
    case 6: return launch<1, 2>(s, n4, key, sink, config, stream);
    case 7: return launch<1, 3>(s, n4, key, sink, config, stream);
    case 8: return launch<2, 0>(s, n4, key, sink, config, stream);
    case 9: return launch<2, 1>(s, n4, key, sink, config, stream);
    case 10: return launch<2, 2>(s, n4, key, sink, config, stream);
    default: return launch<2, 3>(s, n4, key, sink, config, stream);
  }
}

}  // namespace cuda
}  // namespace renaissance
