// The subcommands of the `renaissance` tool and what they share: option structs filled by CLI11
// in main.cc and the exit codes. The synthetic run that `run` and `audit` both use is the audit
// library's (audit/synthetic.h).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <stdexcept>

#include "renaissance/backend.h"
#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/optimizer.h"
#include "renaissance/param.h"
#include "audit/synthetic.h"

namespace renaissance {
namespace cli {

using audit::as_system_failure;
using audit::run_synthetic;
using audit::Schedule;
using audit::schedule_name;
using audit::scheduled_lr;
using audit::SyntheticResult;
using audit::SyntheticRun;
using audit::SystemFailure;

// Exit codes: the contract scripts rely on.
constexpr int kExitOk = 0;
constexpr int kExitComparisonFailed = 1;  // replay above tolerance, audit disagreement
constexpr int kExitBadInput = 2;          // bad option, file or case
constexpr int kExitRuntime = 3;           // a backend or system failure while running

// Bounds of the count options (parsed strictly in main.cc).
constexpr uint64_t kMaxSteps = 1000000000;   // the checkpoint's step counters are int32
constexpr uint64_t kMaxThreadsOption = 1024;  // and at most what OpenMP can start (cmd_run.cc)

// --threads: within what OpenMP can start here; throws Error(kInvalidArgument) otherwise.
void check_threads_option(int threads);

// Options of `renaissance run`; `given` says which options the user typed.
struct RunOptions {
  std::string model = "resnet50";
  std::string optimizer = "adamw";
  // The hyperparameter table's options (renaissance/hyperparameters.h), by row: the value typed
  // (a flag: 1 or 0), meaningful only where the row's flag is in `given` (else the kind's default,
  // or on a resume the checkpoint's value, holds).
  std::array<double, kNumHyperparameters> hyper{};
  std::string weight_decay_mode;  // "" (the kind's default), "decoupled" or "l2"
  int steps = 20;
  int schedule_steps = 0;  // 0: not given (a fresh run uses --steps, a resume the checkpoint's)
  std::string backend = "auto";
  int threads = 0;
  std::string schedule = "constant";
  int warmup = 0;
  double loss_scale = 1.0;
  std::vector<int64_t> nan_at;
  uint64_t seed = 0;
  bool no_check_finite = false;
  std::string precision = "fp32";    // --precision: fp32, or a bf16/fp16 model copy
  bool stochastic_rounding = false;  // --stochastic-rounding: of the copy, keyed by --seed
  std::string grad_dtype = "fp32";   // --grad-dtype fp32|model: gradients in the model dtype (bf16/fp16)
  bool json = false;
  std::string checkpoint;     // save the state here (at the end, and every checkpoint_every steps)
  int checkpoint_every = 0;   // 0: only at the end
  std::string resume;         // load this checkpoint and continue from its step
  std::vector<std::string> overrides;  // --override NAME: on resume, NAME may differ from the checkpoint
  std::vector<std::string> given;      // the long names of every option typed ("--lr", ...)
  // Sharded runs (docs/distributed.md): "" or "mpi"; "" (ordered) or replicated|ordered|fast;
  // --simulate-ranks K: the one-process audit of an ordered K-rank run (0: off).
  std::string distributed;
  std::string grad_reduce;
  int simulate_ranks = 0;
};

struct ReplayOptions {
  std::string case_dir;
  std::string backend = "cpu";
  std::string out;
  double tolerance = 1e-6;
  bool tolerance_given = false;  // --tolerance on the command line: it overrides case.json's
  int threads = 0;
};

struct AuditOptions {
  int steps = 8;
  bool json = false;
};

int cmd_run(const RunOptions& options);
int cmd_replay(const ReplayOptions& options);
int cmd_audit(const AuditOptions& options);
int cmd_layouts(bool json);
int cmd_kinds(bool json);

// Parses a --backend value; throws Error(kInvalidArgument) naming the option, and says so when
// CUDA was asked for but cannot run here.
BackendKind backend_from_option(const std::string& text);

}  // namespace cli
}  // namespace renaissance
