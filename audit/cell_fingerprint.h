// A conformance cell's run without the suite's checks: the inputs every backend receives and the
// final Task::fingerprint(). In renaissance_audit (audit/CMakeLists.txt), so that
// `renaissance audit` recomputes the very golden cells the suite records (the mixed-precision
// ones among them) with the same code, and runner.cc feeds its lanes through the same helpers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "audit/matrix.h"
#include "renaissance/backend.h"
#include "renaissance/plan.h"
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

// The Task of a cell on `backend`: its parameters (cell_params), precision, mask and gradient
// table options, its groups' configurations, compiled, the initial weights (make_weights) set.
std::unique_ptr<Task> make_cell_task(const Cell& cell, BackendKind backend, const BackendOptions& backend_options);

// The non-empty tensors in arena order of G: the injection sites (Site) index this list.
std::vector<size_t> injection_order(const MemoryPlan& plan, const std::vector<ParamSpec>& params);

// Step s of a cell, as every backend receives it.
struct CellStep {
  int s = 0;
  std::vector<double> lrs;      // per hyperparameter group
  std::vector<int32_t> mask;    // tensor_mask cells: per tensor, 1 = masked; else empty
  // Host gradients (cells without backend_gradients), as written into G: rounded to the model
  // dtype where G holds it, NaN in every masked tensor, the injected value at its element.
  std::vector<std::vector<float>> grads;
  const Injection* injection = nullptr;  // the step's injection, if any
  size_t poison_id = 0;
  uint64_t poison_idx = 0;
};
// `order`: injection_order() of the cell's plan.
CellStep cell_step(const Cell& cell, const std::vector<ParamSpec>& params, const std::vector<size_t>& order, int s);

// Writes each step's inputs into one Task: lrs, loss scale, gradients (host, backend-synthesized
// or the simulated ranks' sum), NaN into masked tensors, the injection (through the raw arena
// upload), the mask, and for gradient_table cells the table, pointing every tensor at its
// gradient in one of two donor tasks (alternating per step and tensor; their tensors lie back
// to back at odd offsets between finite fillers) while the arena's own G holds NaN.
class CellFeeder {
 public:
  CellFeeder(const Cell& cell, Task& task, const BackendOptions& backend_options);
  ~CellFeeder();
  void feed(const CellStep& step);

 private:
  struct Donor {
    std::unique_ptr<Task> task;
    std::vector<size_t> slot;  // slot[id]: the donor tensor holding parameter id's gradient
  };
  const Cell& cell_;
  Task& task_;
  std::vector<Donor> donors_;
};

// The same run as run_cell with the same inputs on one backend, without oracle, guards or
// snapshots: only the final Task::fingerprint() (and Backend::describe() in *description).
// backend_options: the CPU backend's threads (0: all cores) and switches; they never change the bits.
std::string cell_fingerprint(const Cell& cell, BackendKind backend, std::string* description = nullptr,
                             const BackendOptions& backend_options = {});

}  // namespace conformance
}  // namespace renaissance
