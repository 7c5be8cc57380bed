// State the conformance suite's test files share (conformance_suite.cc owns it): options, the
// golden file in use and the cells, plus the golden checks that live in golden_checks.cc.
#pragma once

#include <string>
#include <vector>

#include "audit/golden.h"
#include "audit/matrix.h"
#include "renaissance/backend.h"

namespace renaissance {
namespace conformance {

// main() fills these from the command line and the environment (tools/program_env.h).
struct Options {
  std::string golden_path;  // "" = the embedded file; RENAISSANCE_GOLDEN, or --golden FILE
  std::string record_path;  // non-empty: recording mode
  std::string report_path;
  bool recording_opt_out = false;  // RENAISSANCE_GOLDEN_RECORDING=1: permits --record-golden
  // The CPU lanes' backend options: the RENAISSANCE_CPU_* switches (they never change a bit).
  BackendOptions backend_options;
};
extern Options g_options;
extern Golden g_golden;
extern std::vector<Cell> g_all_cells;

// Whether an unusable golden file is tolerated: only while recording (--record-golden, which
// scripts/record_golden.sh runs with RENAISSANCE_GOLDEN_RECORDING=1). Everywhere else a
// missing, unrecorded, emptied or incomplete file is a failure: a skip would let a tampered
// file switch every fingerprint comparison off while ctest stays green.
bool golden_optional();

// Self-tests only: writes a damaged copy of the embedded golden file (golden_checks.cc).
int write_tampered_golden(const std::string& mode, const std::string& path);

}  // namespace conformance
}  // namespace renaissance
