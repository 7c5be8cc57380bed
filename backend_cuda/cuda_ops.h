// What the CUDA op files share with the backend class: the launch context of one node and one
// launch function per op of RN_RANGE_OPS / RN_COMPUTE_OPS (a missing one is a link error).
// Each launch_* enqueues its kernel(s) on ctx.stream; during prepare() that stream is being
// captured, so the same code builds the CUDA graph and runs nodes directly (cuda_graph=false).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend_cuda/cuda_check.h"
#include "backend_cuda/newton_schulz.h"
#include "renaissance/backend.h"
#include "renaissance/graph.h"
#include "renaissance/model_copy_key.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace cuda {

// Threads per block of the element-wise kernels when BackendOptions::cuda_block is 0. With one
// 16-byte vector per thread this keeps 8 blocks (2048 threads) resident per multiprocessor.
constexpr int kDefaultBlock = 256;
// The norm tile kernels use one block of math::kNormLanes threads per tile whatever cuda_block
// says: the lane of a thread is part of the canonical reduction order.

struct LaunchConfig {
  int block = kDefaultBlock;  // threads per block (a multiple of 32)
  int grid = 0;               // 0: one thread per work item; > 0: this many blocks, grid-stride
  int sm_count = 1;           // multiprocessors of the device
};

// The weight-group matrices of one shape class (min side, max side) and one scalar block, which
// MUON_ORTHOGONALIZE orthogonalises as one batch with that block's coefficients and step count.
struct MuonClass {
  int32_t block = 0;
  int steps = 0;
  std::unique_ptr<NewtonSchulzBatch> batch;
};

// What MUON_ORTHOGONALIZE needs on the host when its launches are enqueued (one launch sequence
// per shape class, sized by it): the backend downloads the tables from the arena and plans the
// classes before a capture (or before each step without graphs), so nothing is read from the
// device during a capture.
struct MuonHost {
  uint64_t matrices_offset = 0;        // the node's T_MUON_MATRICES span, which this copies
  std::vector<MuonMatrix> matrices;    // per weight-group tensor
  std::vector<int32_t> blocks;         // each tensor's scalar block (empty: block 0 for all)
  std::vector<int> steps;              // ns_steps of each scalar block (kNsSteps), as launched
  std::vector<MuonClass> classes;      // the matrices by (shape class, block), in first-seen order
  // Every class batched: MUON_ORTHOGONALIZE applies the update (the step's UPDATE_MUON node, kept
  // here for its copy writer) as it takes each class's X out of the scratch, and UPDATE_MUON does
  // nothing; otherwise MUON_ORTHOGONALIZE stores X into U and UPDATE_MUON walks its tiles.
  bool update_fused = false;
  GraphNode update{};
  void* scratch = nullptr;             // Newton–Schulz scratch when the arena's is too small
  size_t scratch_bytes = 0;
};

struct CudaContext {
  char* arena = nullptr;
  ScalarPtrs scalars{};
  LaunchConfig launch;
  cudaStream_t stream = nullptr;
  // Two counters owned by the backend (outside the arena), zero between steps: CHECK_FINITE's
  // blocks-with-a-bad-value and blocks-done counts (see kernels_check.cu).
  unsigned* check_scratch = nullptr;
  // The host tables of the step's MUON_ORTHOGONALIZE node (nullptr without one).
  const MuonHost* muon = nullptr;
  // phase_times' marks inside Newton–Schulz (nullptr: none, as in every step and capture).
  NewtonSchulzPhases* phases = nullptr;

  template <class T>
  T* at(const Span& span) const {
    return reinterpret_cast<T*>(arena + span.offset);
  }
};

// Blocks for `items` work items of one thread each (or the fixed grid the options ask for).
// Grid-stride loops in every kernel make any grid correct; the cap keeps within gridDim.x.
inline unsigned grid_for(uint64_t items, int block, const LaunchConfig& launch) {
  if (launch.grid > 0) return static_cast<unsigned>(launch.grid);
  const uint64_t blocks = (items + static_cast<uint64_t>(block) - 1) / static_cast<uint64_t>(block);
  return static_cast<unsigned>(std::max<uint64_t>(1, std::min<uint64_t>(blocks, 0x7fffffffu)));
}

// One block per work item (a norm tile, or a tensor): grid_for with one item per block.
inline unsigned tile_grid(int64_t items, const LaunchConfig& launch) {
  return grid_for(static_cast<uint64_t>(items), 1, launch);
}

// The largest block <= `requested` that kKernel can be launched with: register use can cap a
// kernel below 1024 threads, and a user's cuda_block must not make a launch fail. Results never
// depend on the block size, so clamping changes no bit. Queried once per kernel.
template <auto kKernel>
int fit_block(int requested) {
  static const int limit = [] {
    cudaFuncAttributes attributes{};
    RN_CUDA_CHECK(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(kKernel)));
    return attributes.maxThreadsPerBlock / 32 * 32;
  }();
  return std::min(requested, limit);
}

#define RN_DECLARE_CUDA_OP(name) void launch_##name(const CudaContext& ctx, const GraphNode& node);
RN_RANGE_OPS(RN_DECLARE_CUDA_OP)
RN_COMPUTE_OPS(RN_DECLARE_CUDA_OP)
#undef RN_DECLARE_CUDA_OP


// One pass of the same-traffic reference over the arena (kernels_same_traffic.cu); every bit
// stays as it was when key is 0, and sink (4 device bytes) is written only when it is not.
void launch_same_traffic(char* arena, const TrafficPass& pass, uint32_t key, uint32_t* sink,
                         const LaunchConfig& launch, cudaStream_t stream);

// Writes math::synthetic_gradient(seed, step, tensor, i, amplitude) into g[0, count).
void launch_synthetic_gradient(float* g, uint64_t count, uint64_t seed, uint64_t step, uint64_t tensor,
                               float amplitude, const LaunchConfig& launch, cudaStream_t stream);
// The same values rounded to nearest even into `dtype`'s encodings (model-dtype G: count elements
// of precision_bytes(dtype) each at g).
void launch_synthetic_gradient_half(void* g, uint64_t count, uint64_t seed, uint64_t step, uint64_t tensor,
                                    float amplitude, Precision dtype, const LaunchConfig& launch, cudaStream_t stream);

// Backend::reduce_ranks: one thread per element (math::rank_reduce_element), grid-stride.
void launch_rank_reduce(const math::RankReduce& op, const LaunchConfig& launch, cudaStream_t stream);

}  // namespace cuda
}  // namespace renaissance
