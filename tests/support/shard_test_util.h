// Helpers shared by the sharded-step unit tests (test_shard_layout.cc, test_shard_model_grads.cc).
#pragma once

#include <cstdint>
#include <string>

#include "renaissance/communicator.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"

namespace renaissance {
namespace testing_util {

// Three synthetic steps of a compiled `task` with weights synthesized from seed 99 and the
// rank-0 gradient stream of seed 5: through a ShardedStep over a world of one when `sharded`,
// else Task::step. Returns the fingerprint of the (gathered) state, so a test compares the two.
inline std::string three_steps_fingerprint(Task& task, GradReduce mode, bool sharded) {
  task.synthesize_weights(99, 0, 0.05f);
  auto comm = make_local_communicator();
  ShardedStep step(task, *comm, mode);
  for (uint64_t t = 0; t < 3; ++t) {
    task.synthesize_gradients(rank_gradient_seed(5, 0), t, 0.01f);
    if (sharded) {
      step.step();
    } else {
      task.step();
    }
  }
  step.gather_state();
  return task.fingerprint();
}

}  // namespace testing_util
}  // namespace renaissance
