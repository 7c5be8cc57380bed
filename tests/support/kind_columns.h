// Test configurations that set the kind table's columns for every kind (momentum, betas, eps,
// trust_coefficient) keep only the ones the kind reads: a configuration refuses a value of a
// column its kind does not read (check_kind_takes), and such a value never changed a step.
#pragma once

#include "renaissance/hyperparameters.h"

namespace renaissance {
namespace testing_util {

// `c` with every kind table column its kind does not read back at the kind's default.
inline OptimizerConfig unread_columns_at_defaults(OptimizerConfig c) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.kind_column != nullptr && !kind_reads(c.kind, row)) c.*row.number = hyper_default(c.kind, row);
  }
  return c;
}

}  // namespace testing_util
}  // namespace renaissance
