// The hyperparameters every benchmark uses per optimizer kind (bench_step, bench_cpu_step and,
// on the torch side, bench/compare_torch.py's HYPER table, which must stay equal to this).
#pragma once

#include "renaissance/optimizer.h"

namespace renaissance {
namespace bench {

inline OptimizerConfig benchmark_config(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  switch (kind) {
    case OptimizerKind::kSgd: c.lr = 0.1; c.weight_decay = 1e-4; break;
    case OptimizerKind::kSgdMomentum:
    case OptimizerKind::kSgdNesterov: c.lr = 0.1; c.momentum = 0.9; c.weight_decay = 1e-4; break;
    case OptimizerKind::kAdam: c.lr = 1e-3; break;
    case OptimizerKind::kAdamW: c.lr = 1e-3; c.weight_decay = 0.01; break;
    case OptimizerKind::kLars:
    case OptimizerKind::kLarsNesterov: c.lr = 0.5; c.momentum = 0.9; c.weight_decay = 5e-5; break;
  }
  return c;
}

}  // namespace bench
}  // namespace renaissance
