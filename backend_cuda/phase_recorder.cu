// cuda::phase_times' recorder, hold kernel and row names (phase_recorder.h).
#include "backend_cuda/phase_recorder.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend_cuda/cuda_check.h"
#include "renaissance/ops.h"

namespace renaissance {
namespace cuda {
namespace {

__global__ void hold_kernel(uint64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

PhaseRecorder::~PhaseRecorder() {
  for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
}

void PhaseRecorder::mark(const std::string& phase) {
  if (marks_.size() == events_.size()) {
    cudaEvent_t e = nullptr;
    RN_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  RN_CUDA_CHECK(cudaEventRecord(events_[marks_.size()], stream_));
  marks_.push_back(phase);
}

void PhaseRecorder::end_step() {
  mark("");  // the end of the last phase
  RN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<double> step(names_.size(), 0.0);
  std::vector<char> met(names_.size(), 0);
  for (size_t i = 0; i + 1 < marks_.size(); ++i) {
    float ms = 0.0f;
    RN_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    const size_t row = static_cast<size_t>(std::find(names_.begin(), names_.end(), marks_[i]) - names_.begin());
    if (row == names_.size()) {
      names_.push_back(marks_[i]);
      samples_.emplace_back();
      step.push_back(0.0);
      met.push_back(0);
    }
    step[row] += ms;
    met[row] = 1;
  }
  for (size_t row = 0; row < names_.size(); ++row) {
    if (met[row]) samples_[row].push_back(step[row]);
  }
  marks_.clear();
}

std::vector<PhaseTime> PhaseRecorder::medians() const {
  std::vector<PhaseTime> out;
  for (size_t row = 0; row < names_.size(); ++row) {
    std::vector<double> v = samples_[row];
    std::sort(v.begin(), v.end());
    out.push_back({names_[row], v[v.size() / 2]});
  }
  return out;
}

void launch_hold(CUstream_st* stream, double ms) {
  hold_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(ms * 1e6));
  RN_CUDA_CHECK_LAUNCH("phase_times hold kernel");
}

std::string phase_label(const GraphNode& node) {
  if (node.kind == NodeKind::kCompute) {
    // MUON_ORTHOGONALIZE's own row is what runs before its first Newton-Schulz mark.
    if (node.compute_op == ComputeOp::MUON_ORTHOGONALIZE) return "MUON_ORTHOGONALIZE: adjusted lr";
    return compute_op_name(node.compute_op);
  }
  std::string label = range_op_name(node.range_op);
  label += node.group == Group::kWeight ? " [weight" : " [bias-like";
  label += node.flags.aux ? ", aux]" : "]";
  return label;
}

}  // namespace cuda
}  // namespace renaissance
