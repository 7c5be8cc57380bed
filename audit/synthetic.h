// The synthetic run behind `renaissance run` and `renaissance audit` and the conformance suite's
// audit cells: weights and gradients that are pure functions of a spec, so the fingerprint is the
// same on every machine and backend.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "renaissance/backend.h"
#include "renaissance/communicator.h"
#include "renaissance/error.h"
#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "renaissance/shard_layout.h"

namespace renaissance {
namespace audit {

// A failure of the system during the work (disk full, I/O error, a write refused mid-way),
// unlike a bad input: the CLI exits 3 on it, not 2. Raised around writes whose path was checked up front.
class SystemFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Runs a write; any library error it raises becomes a SystemFailure (the command was fine).
template <typename F>
void as_system_failure(F&& write) {
  try {
    write();
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kInvalidArgument) throw;
    throw SystemFailure(e.what());
  }
}

enum class Schedule { kConstant, kCosine, kStep };

// A run on synthetic, counter-based gradients: every input is a pure function of the spec, so
// the fingerprint is the same on every machine and backend.
struct SyntheticRun {
  std::vector<ParamSpec> params;
  OptimizerConfig config;
  int steps = 20;
  BackendKind backend = BackendKind::kAuto;
  int threads = 0;
  CpuTuning cpu;  // the CPU backend's switches (BackendOptions::cpu); never change a bit
  Schedule schedule = Schedule::kConstant;
  int schedule_steps = 20;  // the schedule's horizon (--schedule-steps)
  int warmup = 0;
  double loss_scale = 1.0;
  std::vector<int64_t> nan_at;  // 0-based steps whose gradients get one NaN
  uint64_t seed = 0;
  bool check_finite = true;
  PrecisionOptions precision;  // a bf16/fp16 model copy (Task::fingerprint covers it)
  bool measure_copy_bandwidth = true;  // measure the same-traffic limit (limit_gb_per_s)
  // Checkpoints (Task::save / Task::load): `--steps` counts batches of the whole run, so a
  // resumed run starts at the checkpoint's batch (applied + skipped steps) and ends at `steps`.
  std::string checkpoint;
  int checkpoint_every = 0;
  std::string resume;
  // Called after each step with (steps done, that step's ms); may be empty.
  std::function<void(int, double)> on_step;
  // A sharded run: called with (rank, batch) before each batch's step; may be empty (the CLI's
  // lost-rank test hook kills a rank here).
  std::function<void(int, int)> before_sharded_step;
  // A sharded run over this communicator (null: one device), and how G is reduced.
  Communicator* comm = nullptr;
  GradReduce grad_reduce = GradReduce::kOrdered;
  int simulate_ranks = 0;  // > 0: G is the rank-order sum of this many ranks' gradients / K
  uint64_t reduce_chunk = 0;  // > 0: elements per round of the gradient reduction (tests)
};

struct SyntheticResult {
  BackendKind backend = BackendKind::kCpu;
  std::string backend_description;
  int threads = 0;
  std::vector<double> step_ms;
  int64_t steps_applied = 0;
  int64_t steps_skipped = 0;
  double limit_gb_per_s = 0.0;  // Backend::same_traffic_gbps of the step run
  std::string fingerprint;
  int64_t first_step = 0;  // the batch the run started at (> 0 after --resume)
  double last_grad_norm = 0.0;  // Task::last_grad_norm() after the run (clipping on)
  double comm_ms_per_step = 0.0;  // sharded runs: collectives and gradient reduction per step
  uint64_t arena_bytes = 0;  // the task's arena (a sharded run: this rank's, M and V sliced)
};

// The learning rate of step t (0-based) under a schedule of horizon `steps` with linear warm-up
// (past the horizon the schedule stays at its end value).
double scheduled_lr(double base, Schedule schedule, int warmup, int steps, int t);
const char* schedule_name(Schedule s);
bool parse_schedule(const std::string& text, Schedule* out);  // false for an unknown name
SyntheticResult run_synthetic(const SyntheticRun& run);

}  // namespace audit
}  // namespace renaissance
