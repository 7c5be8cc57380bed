// The Communicator: what a sharded step (renaissance/sharded_step.h, renaissance/shard_layout.h) needs from a collective engine,
// and nothing more. Every buffer is in the backend's own memory (host memory for the CPU
// backend; device memory for the NCCL communicator on the CUDA backend), and every call is
// collective: all ranks call it in the same order with the same layout arguments.
//
// Implementations: LocalCommunicator (a world of one, in the runtime), MpiCommunicator (comm/,
// built when Open MPI is found) and NcclCommunicator (comm/, built when NCCL is found; device
// buffers). On NCCL: all_gather_v maps to grouped ncclBroadcast (NCCL's all-gather needs equal
// counts), all_to_all_v to grouped ncclSend/ncclRecv, reduce_scatter_sum_f32 to
// ncclReduceScatter on padded counts, the max to ncclAllReduce(ncclMax), each enqueued on the
// backend's stream (order_on_stream) with no host wait.
#pragma once

#include <cstdint>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace renaissance {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // e.g. "mpi (Open MPI v4.1.4)" or "local".
  virtual std::string describe() const = 0;

  // In-place all-gather of variable blocks: rank r's block is bytes [offsets[r], offsets[r] +
  // counts[r]) of `buffer` (size() entries each); afterwards every rank holds every block.
  virtual void all_gather_v(void* buffer, const std::vector<uint64_t>& offsets,
                            const std::vector<uint64_t>& counts) = 0;
  // Rank q's bytes [send_offsets[r], + send_counts[r]) of `send` arrive at rank r's
  // [recv_offsets[q], + recv_counts[q]) of `recv`. Send ranges may overlap; `recv` may not
  // overlap `send`.
  virtual void all_to_all_v(const void* send, const std::vector<uint64_t>& send_offsets,
                            const std::vector<uint64_t>& send_counts, void* recv,
                            const std::vector<uint64_t>& recv_offsets,
                            const std::vector<uint64_t>& recv_counts) = 0;
  // `send` holds the same float count on every rank (the sum of `counts`); rank r receives into
  // `recv` the element-wise sum of block r (the blocks follow each other). The summation order
  // is the engine's: no bitwise promise (GradReduce::kFast).
  virtual void reduce_scatter_sum_f32(const float* send, float* recv, const std::vector<uint64_t>& counts) = 0;
  // Element-wise maximum over ranks, in place.
  virtual void all_reduce_max_i32(int32_t* values, uint64_t count) = 0;
  virtual void barrier() = 0;

  // Where the buffers of the calls live: host memory (false: MPI, local) or the device memory of
  // a CUDA backend (true: NCCL). A sharded step stages its host-side arithmetic through the
  // copies and the workspace below; for host memory they are plain copies and a host buffer.
  virtual bool device_memory() const { return false; }
  // (An empty copy may come with null pointers, e.g. an empty vector's data(): memcpy forbids those.)
  virtual void copy_to_host(void* dst, const void* src, uint64_t bytes) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  virtual void copy_from_host(void* dst, const void* src, uint64_t bytes) {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  virtual void copy(void* dst, const void* src, uint64_t bytes) {
    if (bytes != 0) std::memmove(dst, src, bytes);
  }
  // Waits until the calls so far have completed, their results visible to the backend's next
  // work (nothing to wait for where every call returns complete: MPI, local).
  virtual void wait() {}
  // Orders the calls from now on with the work of a backend whose calls end on `stream`
  // (Backend::stream(): a cudaStream_t, nullptr for a host backend). True: every call runs after
  // the backend's work enqueued before it, and the backend's later work runs after the call,
  // with no host wait (the sharded step then waits only where the host reads a value). False:
  // the caller joins them itself (Backend::synchronize(), wait()). A host-memory communicator
  // with a host backend is ordered by construction: both return when their work is done.
  virtual bool order_on_stream(void* stream) { return !device_memory() && stream == nullptr; }

  // The sharded step's communication time (ShardedStep::comm_seconds): begin_timing() and
  // end_timing() bracket one phase (its collectives and the reduction's arithmetic between them);
  // timed_seconds() is the total of the phases so far. The base clocks the host, which is
  // honest where the calls return complete; the NCCL communicator records CUDA events on its
  // stream instead (the phases' time on the device) and timed_seconds() waits for them.
  virtual void begin_timing() { timing_start_ = std::chrono::steady_clock::now(); }
  virtual void end_timing() {
    timed_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - timing_start_).count();
  }
  virtual double timed_seconds() { return timed_; }
  // A buffer of at least `bytes` in the communicator's memory, valid until the next call.
  virtual void* workspace(uint64_t bytes) {
    if (host_workspace_.size() < bytes) host_workspace_.resize(bytes);
    return host_workspace_.data();
  }

 private:
  std::vector<char> host_workspace_;
  std::chrono::steady_clock::time_point timing_start_;
  double timed_ = 0.0;
};

// A world of one rank: every collective is the identity (a sharded step at K = 1 and tests).
std::unique_ptr<Communicator> make_local_communicator();

}  // namespace renaissance
