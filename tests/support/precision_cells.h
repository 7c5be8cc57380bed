// The parameter cells of the mixed-precision tests (test_mixed_precision.cc,
// test_model_dtype_grads.cc): every kind case x {bf16, fp16} x {nearest, stochastic} x every
// backend under test, with gtest's printer and test-name generator for them.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "renaissance/backend.h"
#include "renaissance/precision.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace precision_cells {

struct Cell {
  testing_util::KindCase kind;
  Precision precision;
  Rounding rounding;
  BackendKind backend;
};

inline void PrintTo(const Cell& c, std::ostream* os) {
  *os << c.kind.name << " " << precision_name(c.precision) << " " << rounding_name(c.rounding) << " "
      << backend_kind_name(c.backend);
}

inline std::string cell_name(const ::testing::TestParamInfo<Cell>& info) {
  return info.param.kind.name + "_" + precision_name(info.param.precision) + "_" + rounding_name(info.param.rounding) +
         "_" + backend_kind_name(info.param.backend);
}

// Every kind x {bf16, fp16} x {nearest, stochastic} on each of `backends` (default: every
// backend under test; a test about one backend only passes just that one, rather than skipping).
inline std::vector<Cell> all_cells(const std::vector<BackendKind>& backends = testing_util::backends_under_test()) {
  std::vector<Cell> cells;
  for (const auto& k : testing_util::all_kind_cases()) {
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
        for (BackendKind b : backends) cells.push_back({k, p, r, b});
      }
    }
  }
  return cells;
}

}  // namespace precision_cells
}  // namespace renaissance
