// The pieces of cuda::phase_times (cuda_backend.h) outside the backend class: the recorder that
// marks a profiled step's phases with CUDA events and keeps each phase's time per step, the
// device-side hold enqueued before a profiled step, and the row name of a step node.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/newton_schulz.h"
#include "renaissance/graph.h"

struct CUevent_st;

namespace renaissance {
namespace cuda {

// Marks phases on one stream (an event recorded before each, with its name) and, at the end of
// each step, takes each phase's milliseconds (mark to next mark, summed by name within the step)
// as one sample; medians() gives each phase's median over the steps, in the order first met.
class PhaseRecorder final : public NewtonSchulzPhases {
 public:
  explicit PhaseRecorder(CUstream_st* stream) : stream_(stream) {}
  ~PhaseRecorder() override;
  PhaseRecorder(const PhaseRecorder&) = delete;
  PhaseRecorder& operator=(const PhaseRecorder&) = delete;

  void mark(const std::string& phase) override;
  // Marks the end of the last phase, waits for the stream and keeps the step's samples.
  void end_step();
  std::vector<PhaseTime> medians() const;

 private:
  CUstream_st* stream_;
  std::vector<CUevent_st*> events_;  // reused from step to step
  std::vector<std::string> marks_;   // this step's phase names, one per recorded event
  std::vector<std::string> names_;   // every phase met, in the order first met
  std::vector<std::vector<double>> samples_;  // per phase of names_: its ms in each step
};

// Enqueues a one-thread kernel on `stream` that spins until `ms` milliseconds of the device's
// global timer have passed: a profiled step enqueued behind it runs back to back on the device.
void launch_hold(CUstream_st* stream, double ms);

// A node's row in phase_times: a compute node's op; a range node's op, its group and "aux" for
// the auxiliary AdamW's nodes.
std::string phase_label(const GraphNode& node);

}  // namespace cuda
}  // namespace renaissance
