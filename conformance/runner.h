// Runs one conformance cell on the CPU backend (and, when a device is present, the CUDA backend
// in lockstep with it) against the float64 oracle, checking after every step what each backend
// may and may not have written. Returns everything the suite asserts on and the report shows.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "audit/cell_fingerprint.h"  // cell_fingerprint(), with the gradient helpers run_cell uses
#include "audit/matrix.h"
#include "renaissance/backend.h"

namespace renaissance {
class Task;
namespace conformance {

struct BackendResult {
  bool ran = false;
  std::string not_run_reason;  // when !ran
  std::string description;     // Backend::describe()
  // Worst relative L2 per tensor against the oracle over all checked steps (N: relative error
  // of the LARS trust ratio).
  double err_w = 0, err_m = 0, err_v = 0, err_n = 0;
  bool oracle_ok = true;   // every checked tensor within the cell's bound
  bool guards_ok = true;   // no byte outside the step's writable set changed, ever
  bool skips_ok = true;    // skipped steps skipped (and only those), t and skip counts right
  std::string fingerprint;
  double seconds = 0;
};

struct CellResult {
  std::string name, spec;
  int64_t applied = 0, skipped = 0;
  size_t tensors = 0, oracle_tensors = 0;
  BackendResult cpu, cuda;
  bool cuda_bitwise = false;  // CUDA arena == CPU arena after every step (cuda.ran only)
  // Human-readable failures, the first few per kind of check, each naming step and location.
  std::vector<std::string> failures;
  double max_err() const;  // worst of the CPU errors
};

// with_cuda: also run the CUDA backend (the caller checks that it is available).
// sabotage (self-tests only): called on every lane right after each step(), before the
// post-step snapshot, to show that the checks catch a write the step must not make.
using Sabotage = std::function<void(Task& task, int step)>;
CellResult run_cell(const Cell& cell, bool with_cuda, const Sabotage& sabotage = {});

}  // namespace conformance
}  // namespace renaissance
