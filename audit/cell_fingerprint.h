// A conformance cell's run without the suite's checks: the inputs every backend receives and the
// final Task::fingerprint(). In renaissance_audit (audit/CMakeLists.txt), so that
// `renaissance audit` recomputes the very golden cells the suite records (the mixed-precision
// ones among them) with the same code, and runner.cc feeds its lanes through the same helpers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "audit/matrix.h"
#include "renaissance/backend.h"
#include "renaissance/precision.h"

namespace renaissance {
class Task;
namespace conformance {

// Model-dtype gradient cells (PrecisionOptions::model_dtype_gradients): each host gradient
// rounded to nearest even in the model dtype and widened back (exact), so that the oracles see
// what G holds and Task::set_grad's own rounding of the values changes nothing. No-op otherwise.
void round_grads_to_model_dtype(const PrecisionOptions& p, std::vector<std::vector<float>>* g);
// Writes `value` into element idx of parameter id's G through the raw arena upload, in G's dtype.
void upload_gradient_element(Task& task, const PrecisionOptions& p, size_t id, uint64_t idx, float value);

// The same run as run_cell with the same inputs on one backend, without oracle, guards or
// snapshots: only the final Task::fingerprint() (and Backend::describe() in *description).
// backend_options: the CPU backend's threads (0: all cores) and switches; they never change the bits.
std::string cell_fingerprint(const Cell& cell, BackendKind backend, std::string* description = nullptr,
                             const BackendOptions& backend_options = {});

}  // namespace conformance
}  // namespace renaissance
