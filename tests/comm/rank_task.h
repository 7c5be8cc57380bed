// Shared by the mpirun test programs of tests/comm: the Task a rank test starts from (reference
// hyperparameters of a kind, synthetic weights, a loss scale of 256), the gradients of step t
// by their source (the same on every rank, each rank's own stream, their simulated ordered sum)
// and the state-byte checks of one case.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "check_log.h"
#include "renaissance/layout.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"

// The amplitude of the synthetic gradients: 0.01 as scaled by the loss scale of 256.
constexpr float kRankGradientAmplitude = 0.01f * 256.0f;

struct RankTaskSpec {
  renaissance::OptimizerKind kind;
  bool clip = false;  // max_grad_norm 0.05 when set
  renaissance::PrecisionOptions precision;
  renaissance::BackendKind backend = renaissance::BackendKind::kCpu;
  bool tensor_mask = false;
  uint64_t seed = 0;  // the weights are synthesized from seed ^ 0x5eed
};

inline std::unique_ptr<renaissance::Task> make_rank_task(const renaissance::Layout& layout, const RankTaskSpec& spec,
                                                         renaissance::StateShard shard) {
  using namespace renaissance;
  TaskOptions options;
  options.state_shard = shard;
  options.backend = spec.backend;
  options.backend_options.threads = 1;
  options.tensor_mask = spec.tensor_mask;
  options.precision = spec.precision;
  auto task = std::make_unique<Task>(layout.params, options);
  OptimizerConfig config = reference_config(spec.kind);
  config.max_grad_norm = spec.clip ? 0.05 : 0.0;
  task->optimizer(config);
  task->compile();
  task->synthesize_weights(spec.seed ^ 0x5eed, 0, 1.0f);
  task->set_loss_scale(256.0);
  return task;
}

// The rank's slice of the state when comm is given (as renaissance.torch's ranks hold it), else
// the whole state.
inline renaissance::StateShard rank_shard(renaissance::Communicator* comm) {
  return comm != nullptr ? renaissance::StateShard{comm->rank(), comm->size()} : renaissance::StateShard{};
}

// A rank's Task and, when comm is given, the sharded step over comm that drives it.
struct RankRun {
  std::unique_ptr<renaissance::Task> task;
  std::unique_ptr<renaissance::ShardedStep> sharded;
  int rank = 0;

  RankRun(std::unique_ptr<renaissance::Task> t, renaissance::Communicator* comm, renaissance::GradReduce mode)
      : task(std::move(t)), rank(comm != nullptr ? comm->rank() : 0) {
    if (comm != nullptr) sharded = std::make_unique<renaissance::ShardedStep>(*task, *comm, mode);
  }
  void step() {
    if (sharded) {
      sharded->step();
    } else {
      task->step();
    }
  }
};

// kSame: every rank's gradient from `seed`; kOwn: rank r's from rank_gradient_seed(seed, r);
// kSimulated: the ordered mean of `ranks` such streams formed in one process (the reference of
// `ordered`); kOther: another seed (a run that must differ).
enum class Grads { kSame, kOwn, kSimulated, kOther };

inline void rank_gradients(renaissance::Task& task, Grads grads, uint64_t seed, int t, float amplitude, int rank,
                           int ranks) {
  using namespace renaissance;
  const uint64_t step = static_cast<uint64_t>(t);
  switch (grads) {
    case Grads::kSame: return task.synthesize_gradients(seed, step, amplitude);
    case Grads::kOwn: return task.synthesize_gradients(rank_gradient_seed(seed, rank), step, amplitude);
    case Grads::kSimulated: return synthesize_rank_sum(task, seed, step, amplitude, ranks);
    case Grads::kOther: return task.synthesize_gradients(seed + 1, step, amplitude);
  }
}

// `steps` steps of the driver's Task fed `grads`; at step 1 a NaN in element 0 of tensor nan_id
// (every rank's G, or the simulated sum's) skips that step.
inline void run_steps_with_a_nan_at_step_1(RankRun& driver, Grads grads, uint64_t seed, int steps, float amplitude,
                                           int ranks, size_t nan_id) {
  for (int t = 0; t < steps; ++t) {
    rank_gradients(*driver.task, grads, seed, t, amplitude, driver.rank, ranks);
    if (t == 1) driver.task->poison_gradient(nan_id, 0, std::numeric_limits<float>::quiet_NaN());
    driver.step();
  }
}

// The state's bytes in one fixed order: W, (Muon) N, M, V (those the plan holds; through
// ShardedStep::read_state when sharded), the model copy of every tensor, then the step count.
inline std::vector<char> rank_state_bytes(renaissance::Task& task, renaissance::ShardedStep* sharded) {
  using namespace renaissance;
  std::vector<char> out;
  auto append = [&out](const void* p, size_t n) {
    out.insert(out.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  };
  for (size_t id = 0; id < task.num_params(); ++id) {
    const uint64_t n = static_cast<uint64_t>(task.param(id).numel());
    std::vector<float> x(n);
    task.read(Family::kW, id, x.data());
    append(x.data(), n * sizeof(float));
    if (task.plan().config().muon) {
      float lr = 0.0f;
      task.read(Family::kN, id, &lr);
      append(&lr, sizeof(lr));
    }
    for (Family f : {Family::kM, Family::kV}) {
      if (!task.plan().has_family(f)) continue;
      if (sharded) {
        sharded->read_state(f, id, 0, n, x.data());
      } else {
        task.read(f, id, x.data());
      }
      append(x.data(), n * sizeof(float));
    }
    if (task.plan().has_model_copy()) {
      std::vector<uint16_t> copy(n);
      task.read_model_copy(id, copy.data());
      append(copy.data(), n * sizeof(uint16_t));
    }
  }
  const int64_t t = task.step_count();
  append(&t, sizeof(t));
  return out;
}

// The state bytes (rank_state_bytes) after run_steps_with_a_nan_at_step_1 of `task`, stepped
// through a sharded step over comm when comm is given.
inline std::vector<char> state_bytes_after_steps(std::unique_ptr<renaissance::Task> task,
                                                 renaissance::Communicator* comm, renaissance::GradReduce mode,
                                                 Grads grads, uint64_t seed, int steps, float amplitude, int ranks,
                                                 size_t nan_id) {
  RankRun driver(std::move(task), comm, mode);
  run_steps_with_a_nan_at_step_1(driver, grads, seed, steps, amplitude, ranks, nan_id);
  return rank_state_bytes(*driver.task, driver.sharded.get());
}

// The checks of one case on this rank, `run(layout, c, comm, mode, grads, ranks)` giving the state
// bytes (rank_state_bytes) of a run over comm, or of the rank's own run without any sharding code
// when comm is null: the run differs from one with another gradient (else the comparisons would
// prove nothing); replicated == the one-device run; ordered == the one-process simulation of K
// ranks.
template <class Case>
void check_state_bytes(CheckLog& check, const std::string& tag, const renaissance::Layout& layout, const Case& c,
                       renaissance::Communicator& comm,
                       std::vector<char> (*run)(const renaissance::Layout&, const Case&, renaissance::Communicator*,
                                                renaissance::GradReduce, Grads, int)) {
  using renaissance::GradReduce;
  const int K = comm.size();
  const std::vector<char> replicated = run(layout, c, &comm, GradReduce::kReplicated, Grads::kSame, 1);
  const std::vector<char> plain = run(layout, c, nullptr, GradReduce::kReplicated, Grads::kSame, 1);
  const std::vector<char> other = run(layout, c, nullptr, GradReduce::kReplicated, Grads::kOther, 1);
  check(plain != other, tag + ": another gradient gives other state bytes");
  check(replicated == plain, tag + " replicated: W, N, M, V, copy and t == the one-device run (" +
                                 std::to_string(plain.size()) + " bytes)");
  const std::vector<char> ordered = run(layout, c, &comm, GradReduce::kOrdered, Grads::kOwn, 1);
  const std::vector<char> simulated = run(layout, c, nullptr, GradReduce::kReplicated, Grads::kSimulated, K);
  check(ordered == simulated, tag + " ordered: the same bytes as --simulate-ranks " + std::to_string(K));
}
