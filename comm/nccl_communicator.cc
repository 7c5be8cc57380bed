// NcclCommunicator: the Communicator over NCCL for CUDA ranks (one GPU each), bootstrapped through
// MPI. A sharded step puts it on its CUDA backend's stream (order_on_stream): every call and copy
// is enqueued there behind the step's kernels, and the host waits only where it reads a value
// (copy_to_host) or frees memory in use. Without a stream it runs on its own and waits for every
// call, so calls complete in order as MPI's do. Variable blocks (all_gather_v) are grouped
// broadcasts; the all-to-all is grouped send/recv; the reduce-scatter pads every rank's block to
// the largest. Its check on 2 GPUs is `scripts/gpu.sh dist` (docs/distributed.md, "NCCL"), run once
// with host waits; the stream-ordered path has not run on two GPUs.
#include "renaissance/nccl_communicator.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "mpi_session.h"
#include "renaissance/error.h"

namespace renaissance {

namespace {

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorKind::kBackend, std::string("nccl communicator: ") + what + ": " + cudaGetErrorString(status));
  }
}

void check_nccl(ncclResult_t status, const char* what) {
  if (status != ncclSuccess) {
    throw Error(ErrorKind::kBackend, std::string("nccl: ") + what + ": " + ncclGetErrorString(status));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator() {
    // The local rank picks the GPU: ranks of one host share its devices.
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mpi_.rank(), MPI_INFO_NULL, &local);
    int local_rank = 0;
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_free(&local);
    int devices = 0;
    check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    if (devices < 1) throw Error(ErrorKind::kBackend, "nccl communicator: no CUDA device");
    device_ = local_rank % devices;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id;
    if (mpi_.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, MPI_COMM_WORLD);
    check_nccl(ncclCommInitRank(&comm_, mpi_.size(), id, mpi_.rank()), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    stream_ = own_stream_;
  }
  ~NcclCommunicator() override {
    // (stream_ may be a backend's that is gone already: only own resources are touched.)
    if (workspace_ != nullptr) (void)cudaFree(workspace_);
    if (pad_ != nullptr) (void)cudaFree(pad_);
    for (auto& pair : pending_) free_.push_back(pair);
    for (auto& pair : free_) {
      (void)cudaEventDestroy(pair.first);
      (void)cudaEventDestroy(pair.second);
    }
    if (own_stream_ != nullptr) (void)cudaStreamDestroy(own_stream_);
    if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
  }

  int rank() const override { return mpi_.rank(); }
  int size() const override { return mpi_.size(); }
  std::string describe() const override {
    int version = 0;
    (void)ncclGetVersion(&version);
    return "nccl " + std::to_string(version) + " (" + std::to_string(mpi_.size()) + " ranks, GPU " + std::to_string(device_) +
           " here)";
  }

  void all_gather_v(void* buffer, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& counts) override {
    char* b = static_cast<char*>(buffer);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < mpi_.size(); ++r) {
      if (counts[r] == 0) continue;
      check_nccl(ncclBroadcast(b + offsets[r], b + offsets[r], counts[r], ncclChar, r, comm_, stream_), "ncclBroadcast");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    wait_unless_ordered();
  }

  void all_to_all_v(const void* send, const std::vector<uint64_t>& send_offsets, const std::vector<uint64_t>& send_counts,
                    void* recv, const std::vector<uint64_t>& recv_offsets,
                    const std::vector<uint64_t>& recv_counts) override {
    const char* s = static_cast<const char*>(send);
    char* d = static_cast<char*>(recv);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < mpi_.size(); ++r) {
      if (send_counts[r] > 0) check_nccl(ncclSend(s + send_offsets[r], send_counts[r], ncclChar, r, comm_, stream_), "ncclSend");
      if (recv_counts[r] > 0) check_nccl(ncclRecv(d + recv_offsets[r], recv_counts[r], ncclChar, r, comm_, stream_), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    wait_unless_ordered();
  }

  void reduce_scatter_sum_f32(const float* send, float* recv, const std::vector<uint64_t>& counts) override {
    // NCCL's reduce-scatter takes equal blocks: each rank's block padded to the largest (zeros).
    const uint64_t block = *std::max_element(counts.begin(), counts.end());
    if (block == 0) return;
    const uint64_t bytes = block * sizeof(float) * static_cast<uint64_t>(mpi_.size());
    if (pad_bytes_ < bytes + block * sizeof(float)) {
      if (pad_ != nullptr) {
        wait();  // earlier calls on the stream may still read it
        check_cuda(cudaFree(pad_), "cudaFree");
      }
      pad_ = nullptr;
      check_cuda(cudaMalloc(&pad_, bytes + block * sizeof(float)), "cudaMalloc");
      pad_bytes_ = bytes + block * sizeof(float);
    }
    float* padded = static_cast<float*>(pad_);
    float* out = padded + block * static_cast<uint64_t>(mpi_.size());
    check_cuda(cudaMemsetAsync(padded, 0, bytes, stream_), "cudaMemsetAsync");
    uint64_t at = 0;
    for (int r = 0; r < mpi_.size(); ++r) {
      check_cuda(cudaMemcpyAsync(padded + block * static_cast<uint64_t>(r), send + at, counts[r] * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
      at += counts[r];
    }
    check_nccl(ncclReduceScatter(padded, out, block, ncclFloat32, ncclSum, comm_, stream_), "ncclReduceScatter");
    check_cuda(cudaMemcpyAsync(recv, out, counts[mpi_.rank()] * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
               "cudaMemcpyAsync");
    wait_unless_ordered();
  }

  // The sharded step's non-finite flag stays on the device: the update reads it there.
  void all_reduce_max_i32(int32_t* values, uint64_t count) override {
    check_nccl(ncclAllReduce(values, values, count, ncclInt32, ncclMax, comm_, stream_), "ncclAllReduce");
    wait_unless_ordered();
  }

  void barrier() override {
    wait();
    MPI_Barrier(MPI_COMM_WORLD);
  }

  bool device_memory() const override { return true; }
  // The host reads dst, or may free src, when these return: waited for.
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override {
    copy_kind(dst, src, bytes, cudaMemcpyDeviceToHost);
    wait();
  }
  void copy_from_host(void* dst, const void* src, uint64_t bytes) override {
    copy_kind(dst, src, bytes, cudaMemcpyHostToDevice);
    wait();
  }
  void copy(void* dst, const void* src, uint64_t bytes) override {
    copy_kind(dst, src, bytes, cudaMemcpyDeviceToDevice);
    wait_unless_ordered();
  }
  void wait() override { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  bool order_on_stream(void* stream) override {
    cudaStream_t next = stream != nullptr ? static_cast<cudaStream_t>(stream) : own_stream_;
    if (next != stream_) wait();  // what is on the old stream comes first
    stream_ = next;
    ordered_ = stream != nullptr;
    return ordered_;
  }

  // CUDA events on the stream around each phase; their pairs are summed as they complete.
  void begin_timing() override {
    if (free_.empty()) {
      std::pair<cudaEvent_t, cudaEvent_t> pair{nullptr, nullptr};
      check_cuda(cudaEventCreate(&pair.first), "cudaEventCreate");
      check_cuda(cudaEventCreate(&pair.second), "cudaEventCreate");
      free_.push_back(pair);
    }
    timing_ = free_.back();
    free_.pop_back();
    check_cuda(cudaEventRecord(timing_.first, stream_), "cudaEventRecord");
  }
  void end_timing() override {
    check_cuda(cudaEventRecord(timing_.second, stream_), "cudaEventRecord");
    pending_.push_back(timing_);
    // Pairs already done are summed now (no host wait), so a long run keeps few events.
    while (!pending_.empty() && cudaEventQuery(pending_.front().second) == cudaSuccess) sum_oldest();
  }
  double timed_seconds() override {
    while (!pending_.empty()) {
      check_cuda(cudaEventSynchronize(pending_.front().second), "cudaEventSynchronize");
      sum_oldest();
    }
    return timed_ms_ * 1e-3;
  }

  void* workspace(uint64_t bytes) override {
    if (workspace_bytes_ < bytes) {
      if (workspace_ != nullptr) {
        wait();  // earlier calls on the stream may still use it
        check_cuda(cudaFree(workspace_), "cudaFree");
      }
      workspace_ = nullptr;
      check_cuda(cudaMalloc(&workspace_, std::max<uint64_t>(bytes, 1)), "cudaMalloc");
      workspace_bytes_ = bytes;
    }
    return workspace_;
  }

 private:
  // On its own stream every call completes before it returns, as MPI's do; on a backend's
  // stream the order of the stream suffices.
  void wait_unless_ordered() {
    if (!ordered_) wait();
  }
  void copy_kind(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, stream_), "cudaMemcpyAsync");
  }
  void sum_oldest() {
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, pending_.front().first, pending_.front().second), "cudaEventElapsedTime");
    timed_ms_ += ms;
    free_.push_back(pending_.front());
    pending_.pop_front();
  }

  MpiSession mpi_;  // first: MPI ends after the NCCL communicator is destroyed
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t own_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;  // own_stream_, or the backend's (order_on_stream)
  bool ordered_ = false;           // stream_ is the backend's: no wait after a call
  std::pair<cudaEvent_t, cudaEvent_t> timing_{nullptr, nullptr};  // the open phase's events
  std::deque<std::pair<cudaEvent_t, cudaEvent_t>> pending_;        // recorded, not yet summed
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> free_;
  double timed_ms_ = 0.0;
  void* workspace_ = nullptr;
  uint64_t workspace_bytes_ = 0;
  void* pad_ = nullptr;
  uint64_t pad_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator() { return std::make_unique<NcclCommunicator>(); }

}  // namespace renaissance
