// Run under `mpirun -np K` (comm/CMakeLists.txt, K = 1..3): a sharded step of a Task with two
// hyperparameter groups (Task::optimizer_groups; different lr, weight decay, betas, eps,
// momentum, trust coefficient, aux lr and aux weight decay), the parameters alternating between
// the groups so that each role holds runs of both, and for Muon fc.weight stepped by the
// auxiliary AdamW in the same Task. Every rank holds its slice of M and V
// (TaskOptions::state_shard). After four steps (one skipped for a NaN in one group's gradient),
// with and without clipping (one norm over both groups) and with a bf16 stochastic model copy,
// on every rank, against a Task without any sharding code that the rank runs itself:
//   replicated == the one-device run: W, N (Muon's adjusted lrs), M and V (read through
//                 ShardedStep::read_state), the model copy and the step count, bit for bit;
//   ordered    == the one-process simulation of K ranks (synthesize_rank_sum), the same bytes.
// Muon also with every matrix in group 0 and the rest in group 1 (MuonWithAuxAdam's shape: a run
// of matrices of one group, which the sharded step still cuts at matrix starts; at K > 1 more
// than one rank owns matrices).
// The run must differ from one with another gradient, and at K > 1 more than one rank must own
// elements (the partition shards). Exit 0 only when every check passed.
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "check_log.h"
#include "rank_task.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/layout.h"
#include "renaissance/mpi_communicator.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"

using namespace renaissance;

namespace {

constexpr uint64_t kSeed = 31;
constexpr int kSteps = 4;
constexpr int kGroups = 2;

struct Case {
  OptimizerKind kind;
  bool clip;
  PrecisionOptions precision;
  bool matrices_apart = false;  // weight-role tensors in group 0, the others in group 1
};

std::vector<ParamSpec> grouped_params(const Layout& layout, const Case& c) {
  std::vector<ParamSpec> params = layout.params;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].hyper_group = c.matrices_apart ? (group_of(params[i].role) == Group::kWeight ? 0 : 1)
                                             : static_cast<int>(i % kGroups);
    if (c.kind == OptimizerKind::kMuon && params[i].name == "fc.weight") params[i].optimizer = ParamOptimizer::kAdamW;
  }
  return params;
}

// Group h's configuration: the kind's reference one, shifted by h (as the conformance groups
// cells shift theirs), max_grad_norm task-wide.
std::vector<OptimizerConfig> group_configs(const Case& c) {
  std::vector<OptimizerConfig> configs;
  const OptimizerConfig base = reference_config(c.kind);
  for (int h = 0; h < kGroups; ++h) {
    OptimizerConfig g = base;
    g.lr = base.lr * (1.0 + 0.5 * h);
    g.weight_decay = base.weight_decay * (1.0 + h) + 0.01 * h;
    if (base.momentum > 0.0) g.momentum = base.momentum - 0.1 * h;
    g.beta1 = base.beta1 - 0.05 * h;
    g.beta2 = base.beta2 - 0.004 * h;
    g.eps = base.eps * (1.0 + h);
    g.trust_coefficient = base.trust_coefficient * (1.0 + h);
    // Only the columns the kind reads: a configuration refuses another value of one it does not.
    for (const HyperparameterInfo& row : kHyperparameterTable) {
      if (row.kind_column != nullptr && !kind_reads(c.kind, row)) g.*row.number = base.*row.number;
    }
    if (c.kind == OptimizerKind::kMuon) {  // the aux AdamW's own rows: muon's only
      g.aux_lr = base.aux_lr * (1.0 + 0.5 * h);
      g.aux_weight_decay = 0.01 * h;
    }
    g.max_grad_norm = c.clip ? 0.05 : 0.0;
    configs.push_back(g);
  }
  return configs;
}

std::unique_ptr<Task> make_task(const Layout& layout, const Case& c, StateShard shard) {
  TaskOptions options;
  options.state_shard = shard;
  options.backend = BackendKind::kCpu;
  options.backend_options.threads = 1;
  options.precision = c.precision;
  auto task = std::make_unique<Task>(grouped_params(layout, c), options);
  task->optimizer_groups(group_configs(c));
  task->compile();
  task->synthesize_weights(kSeed ^ 0x5eed, 0, 1.0f);
  task->set_loss_scale(256.0);
  return task;
}

// Four steps; a NaN at step 1 in the last tensor's gradient (group 1's; every rank's G, or the
// simulated sum's) skips that step for both groups.
std::vector<char> run(const Layout& layout, const Case& c, Communicator* comm, GradReduce mode, Grads grads,
                      int ranks) {
  return state_bytes_after_steps(make_task(layout, c, rank_shard(comm)), comm, mode, grads, kSeed, kSteps,
                                 kRankGradientAmplitude, ranks, layout.params.size() - 1);
}

}  // namespace

int main(int argc, char** argv) {
  auto [comm, layout, check] = start_rank_program(argc, argv, "sharded_groups");
  const int K = comm->size();
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kLamb, OptimizerKind::kLars, OptimizerKind::kMuon}) {
    for (bool apart : {false, true}) {
      if (apart && kind != OptimizerKind::kMuon) continue;
      // The partition the runs below use: more than one rank owns elements (Muon: matrices)
      // when K > 1.
      const std::unique_ptr<Task> task = make_task(layout, Case{kind, false, PrecisionOptions{}, apart}, StateShard{});
      int owners = 0, matrix_owners = 0;
      std::string text;
      for (const RankShard& s : make_shard_layout(task->plan(), K).ranks) {
        owners += s.end > s.begin ? 1 : 0;
        matrix_owners += s.muon_matrix_end > s.muon_matrix_begin ? 1 : 0;
        text += " [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ")";
      }
      const std::string what = std::string(optimizer_kind_name(kind)) + " H=2" + (apart ? " matrices apart" : "") +
                               " K=" + std::to_string(K) + " slices:" + text;
      check(K == 1 || owners > 1, what);
      if (kind == OptimizerKind::kMuon) check(K == 1 || matrix_owners > 1, what + ": matrices on more than one rank");
    }
    // Without and with clipping, and (AdamW, Muon) a bf16 stochastic model copy, written by the
    // item walks of the slice and gathered.
    std::vector<Case> cases = {{kind, false, PrecisionOptions{}}, {kind, true, PrecisionOptions{}}};
    if (kind == OptimizerKind::kAdamW || kind == OptimizerKind::kMuon) {
      cases.push_back({kind, true, PrecisionOptions{Precision::kBf16, Rounding::kStochastic, 99}});
    }
    if (kind == OptimizerKind::kMuon) {
      cases.push_back({kind, false, PrecisionOptions{}, true});
      cases.push_back({kind, true, PrecisionOptions{}, true});
    }
    for (const Case& c : cases) {
      const std::string tag = std::string(optimizer_kind_name(kind)) + " H=2" + (c.matrices_apart ? " matrices apart" : "") +
                              (c.clip ? " clip" : "") +
                              (c.precision.precision != Precision::kFp32 ? " bf16 stochastic" : "") + " K=" +
                              std::to_string(K) + " rank " + std::to_string(comm->rank());
      check_state_bytes(check, tag, layout, c, *comm, run);
    }
  }
  return check.verdict(*comm, "all sharded group runs match", "SHARDED GROUP RUNS FAILED");
}
