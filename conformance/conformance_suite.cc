// The conformance suite binary: every cell of the matrix (matrix.cc) as a gtest case, the
// `renaissance audit` runs, the golden fingerprint checks, and the two outputs that are not
// tests: --record-golden (write audit/golden/fingerprints.json from a GPU run) and
// --report-json (the results REPORT.md is rendered from, by render_report.py).
//
//   conformance_suite                                   run everything, check against the golden file
//   conformance_suite --gtest_filter='Small/*'          one tier (Small, Big, Drift, Audit, Golden,
//                                                       Cuda, HighwayTargets)
//   conformance_suite --report-json results.json        also write every cell's results
//   conformance_suite --record-golden audit/golden/fingerprints.json
//                                                       GPU only: run all, then record CUDA fingerprints
//   conformance_suite --golden FILE                     check against another golden file (self-tests)
//   conformance_suite --write-tampered-golden MODE FILE self-tests: a damaged copy of the embedded file
#include <cctype>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "audit/synthetic.h"
#include "audit/audit_cells.h"
#include "audit/golden.h"
#include "audit/matrix.h"
#include "conformance/runner.h"
#include "conformance/suite_state.h"
#include "renaissance/backend.h"
#include "renaissance/error.h"
#include "renaissance/task.h"
#include "tools/program_env.h"

#if RENAISSANCE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace renaissance {
namespace conformance {
Options g_options;
Golden g_golden;
std::vector<Cell> g_all_cells;  // owned here so Row::cell stays valid

// Recording mode needs the opt-out too (main refuses --record-golden without it); the opt-out
// alone tolerates nothing, so an inherited RENAISSANCE_GOLDEN_RECORDING=1 cannot hide a failure.
bool golden_optional() { return !g_options.record_path.empty(); }

namespace {

// What the report needs per cell, filled in by the tests as they run.
struct Row {
  std::string tier, kind, layout;
  const Cell* cell = nullptr;  // null for audit rows
  CellResult result;
  std::string golden;  // match, differs, not recorded, missing, spec changed, recording
};
std::map<std::string, Row> g_rows;

std::string utc_now() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string first_line_of(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (key.empty() || line.rfind(key, 0) == 0) {
      const size_t colon = line.find(':');
      return key.empty() || colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "";
}

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}


// Compares one cell's fingerprints with the golden file; returns the status for the report.
// When recording, the old file is not consulted (it is being replaced).
std::string check_golden(const std::string& name, const std::string& spec, const CellResult& r) {
  if (!g_options.record_path.empty()) return "recording";
  if (!g_golden.usable) {
    if (golden_optional()) return "not checked (recording)";
    ADD_FAILURE() << "cell " << name << ": NO GOLDEN: " << g_golden.why_not;
    return "no golden file";
  }
  const auto it = g_golden.cells.find(name);
  if (it == g_golden.cells.end()) {
    ADD_FAILURE() << "cell " << name << " is not in the golden file " << g_golden.path << " (recorded on "
                  << g_golden.machine_line() << "): the matrix changed since it was recorded; re-record it on a GPU "
                  << "with scripts/record_golden.sh";
    return "missing";
  }
  if (it->second.spec != spec) {
    ADD_FAILURE() << "cell " << name << ": its definition changed since the golden file was recorded; re-record on a GPU"
                  << "\n  recorded: " << it->second.spec << "\n  now:      " << spec;
    return "spec changed";
  }
  bool same = true;
  if (r.cpu.fingerprint != it->second.fingerprint) {
    same = false;
    ADD_FAILURE() << "GOLDEN MISMATCH in cell " << name << ": CPU fingerprint " << r.cpu.fingerprint
                  << " != golden " << it->second.fingerprint << " recorded on " << g_golden.machine_line();
  }
  if (r.cuda.ran && r.cuda.fingerprint != it->second.fingerprint) {
    same = false;
    ADD_FAILURE() << "GOLDEN MISMATCH in cell " << name << ": CUDA fingerprint " << r.cuda.fingerprint
                  << " != golden " << it->second.fingerprint << " recorded on " << g_golden.machine_line();
  }
  return same ? "match" : "differs";
}

void print_summary(const CellResult& r) {
  std::ostringstream os;
  os.precision(3);
  os << "[conformance] " << r.name << ": cpu W=" << r.cpu.err_w << " M=" << r.cpu.err_m << " V=" << r.cpu.err_v
     << " N=" << r.cpu.err_n << " (" << r.oracle_tensors << "/" << r.tensors << " tensors vs oracle), fp "
     << r.cpu.fingerprint << ", applied " << r.applied << ", skipped " << r.skipped;
  if (r.cuda.ran) os << "; cuda " << (r.cuda_bitwise ? "bitwise" : "DIFFERS") << " fp " << r.cuda.fingerprint;
  std::cout << os.str() << std::endl;
}

uint64_t region_end_bytes(const MemoryPlan& plan, Region r) {
  return plan.region(r).offset + plan.region(r).count * plan.region(r).elem_size;
}

class CellTest : public ::testing::TestWithParam<const Cell*> {};

TEST_P(CellTest, Conforms) {
  const Cell& cell = *GetParam();
  const bool cuda = backend_available(BackendKind::kCuda);
  const CellResult r = run_cell(cell, cuda);
  for (const std::string& f : r.failures) ADD_FAILURE() << "cell " << cell.name << ": " << f;
  EXPECT_TRUE(r.cpu.oracle_ok) << "cell " << cell.name << ": CPU outside the oracle bound (3x the honest float32 error)";
  EXPECT_TRUE(r.cpu.guards_ok) << "cell " << cell.name << ": CPU wrote outside its writable set";
  EXPECT_TRUE(r.cpu.skips_ok) << "cell " << cell.name << ": CPU skip contract broken";
  EXPECT_EQ(r.applied, cell.steps - static_cast<int>(cell.injections.size()));
  EXPECT_GE(r.applied, cell.tier == Tier::kDrift ? 1000 : 7) << "cell " << cell.name;
  if (cuda) {
    EXPECT_TRUE(r.cuda.oracle_ok && r.cuda.guards_ok && r.cuda.skips_ok) << "cell " << cell.name << ": CUDA checks";
    EXPECT_TRUE(r.cuda_bitwise) << "cell " << cell.name << ": CUDA differs from the CPU";
  }
  print_summary(r);
  Row row;
  row.tier = tier_name(cell.tier);
  row.kind = optimizer_kind_name(cell.config.kind);
  row.layout = cell.layout;
  row.cell = &cell;
  row.result = r;
  row.golden = check_golden(cell.name, r.spec, r);
  g_rows[cell.name] = row;
}

std::vector<const Cell*> tier_cells(Tier tier) {
  std::vector<const Cell*> out;
  for (const Cell& c : g_all_cells) {
    if (c.tier == tier) out.push_back(&c);
  }
  return out;
}
std::string gtest_name(const ::testing::TestParamInfo<const Cell*>& info) {
  std::string n = info.param->name;
  for (char& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
}

// The cells are built before gtest registers the instantiations (static initialisation order
// within this file is top to bottom).
const bool g_cells_built = (g_all_cells = all_cells(), true);

INSTANTIATE_TEST_SUITE_P(Small, CellTest, ::testing::ValuesIn(tier_cells(Tier::kSmall)), gtest_name);
INSTANTIATE_TEST_SUITE_P(Big, CellTest, ::testing::ValuesIn(tier_cells(Tier::kBig)), gtest_name);
INSTANTIATE_TEST_SUITE_P(Drift, CellTest, ::testing::ValuesIn(tier_cells(Tier::kDrift)), gtest_name);

// The runs of `renaissance audit`, through the CLI's own run_synthetic, so the golden file
// holds exactly what the audit recomputes.
class AuditTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(AuditTest, MatchesGolden) {
  const OptimizerKind kind = static_cast<OptimizerKind>(std::get<0>(GetParam()));
  const int steps = std::get<1>(GetParam());
  audit::SyntheticRun run = audit_run(kind, steps);
  CellResult r;
  r.name = audit_cell_name(kind, steps);
  r.spec = audit_cell_spec(run);
  r.tensors = run.params.size();
  run.backend = BackendKind::kCpu;
  run.cpu = g_options.backend_options.cpu;
  const audit::SyntheticResult cpu = audit::run_synthetic(run);
  r.cpu.ran = true;
  r.cpu.description = cpu.backend_description;
  r.cpu.fingerprint = cpu.fingerprint;
  r.applied = cpu.steps_applied;
  r.skipped = cpu.steps_skipped;
  EXPECT_EQ(cpu.steps_skipped, 1) << r.name;
  if (backend_available(BackendKind::kCuda)) {
    run.backend = BackendKind::kCuda;
    const audit::SyntheticResult cuda = audit::run_synthetic(run);
    r.cuda.ran = true;
    r.cuda.description = cuda.backend_description;
    r.cuda.fingerprint = cuda.fingerprint;
    r.cuda_bitwise = cuda.fingerprint == cpu.fingerprint;
    EXPECT_EQ(cuda.fingerprint, cpu.fingerprint) << r.name << ": CUDA and CPU fingerprints differ";
  } else {
    r.cuda.not_run_reason = "no CUDA device or no CUDA build";
  }
  std::cout << "[conformance] " << r.name << ": cpu fp " << r.cpu.fingerprint
            << (r.cuda.ran ? ", cuda fp " + r.cuda.fingerprint : std::string()) << std::endl;
  Row row;
  row.tier = "audit";
  row.kind = optimizer_kind_name(kind);
  row.layout = "audit";
  row.result = r;
  row.golden = check_golden(r.name, r.spec, r);
  g_rows[r.name] = row;
}

INSTANTIATE_TEST_SUITE_P(Audit, AuditTest,
                         ::testing::Combine(::testing::Range(0, kNumOptimizerKinds),
                                            ::testing::ValuesIn(kAuditGoldenSteps)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
                           return std::string(optimizer_kind_name(static_cast<OptimizerKind>(std::get<0>(info.param)))) +
                                  "_steps" + std::to_string(std::get<1>(info.param));
                         });

// ---- self-tests: the guard and skip checks can fail ----
// Each one runs a small cell with one deliberate bad write after a step and expects run_cell to
// report it, naming the place. Without these, a guard that compared the wrong bytes (or none)
// would pass forever.
const Cell& selftest_cell() {
  for (const Cell& c : g_all_cells) {
    if (c.tier == Tier::kSmall && c.layout == "small_cnn" && c.config.kind == OptimizerKind::kLars &&
        c.injections.size() == 1 && c.injections[0].step == 1) {
      return c;  // LARS: every family but V, the N family and the LARS tables are allocated
    }
  }
  throw std::logic_error("no self-test cell");
}

::testing::AssertionResult reports(const CellResult& r, const std::string& needle) {
  for (const std::string& f : r.failures) {
    if (f.find(needle) != std::string::npos) return ::testing::AssertionSuccess() << f;
  }
  ::testing::AssertionResult fail = ::testing::AssertionFailure();
  fail << "no failure mentions '" << needle << "'; failures:";
  for (const std::string& f : r.failures) fail << "\n  " << f;
  return fail;
}

void poke(Task& task, uint64_t offset, float value) { task.backend().upload(offset, &value, sizeof(value)); }

TEST(GuardSelfTest, CatchesAWriteIntoRegionPadding) {
  const Cell& cell = selftest_cell();
  const CellResult r = run_cell(cell, false, [](Task& task, int step) {
    if (step != 3) return;
    const MemoryPlan& plan = task.plan();
    for (int role = kNumRoles - 1; role >= 0; --role) {
      const RegionInfo& info = plan.region(family_region(Family::kM, static_cast<Role>(role)));
      if (info.count > info.used) return poke(task, info.offset + info.used * 4, 1.0f);
    }
  });
  EXPECT_FALSE(r.cpu.guards_ok);
  EXPECT_TRUE(reports(r, "(region padding)"));
}

TEST(GuardSelfTest, CatchesAWriteIntoACanaryGap) {
  const CellResult r = run_cell(selftest_cell(), false, [](Task& task, int step) {
    if (step == 2) poke(task, region_end_bytes(task.plan(), S_SCALAR_FP32), 0.0f);
  });
  EXPECT_FALSE(r.cpu.guards_ok);
  EXPECT_TRUE(reports(r, "canary gap after S_SCALAR_FP32"));
}

// (Not the LARS tile table: a corrupted table would make the next step read far outside the
// arena, which is a crash, not a check.)
TEST(GuardSelfTest, CatchesAWriteIntoGradientsAndScalarSlots) {
  const CellResult r = run_cell(selftest_cell(), false, [](Task& task, int step) {
    if (step == 4) poke(task, task.plan().tensor_offset(Family::kG, 0), 123.0f);
    if (step == 5) poke(task, task.plan().region(S_SCALAR_FP32).offset + kWeightDecay * sizeof(float), 0.5f);
  });
  EXPECT_FALSE(r.cpu.guards_ok);
  EXPECT_TRUE(reports(r, "step 4: "));
  EXPECT_TRUE(reports(r, "= G_FIRST_CONV["));
  EXPECT_TRUE(reports(r, "= S_SCALAR_FP32[1]"));
}

TEST(GuardSelfTest, CatchesStateChangedOnASkippedStep) {
  const Cell& cell = selftest_cell();  // poisons step 1
  const CellResult r = run_cell(cell, false, [](Task& task, int step) {
    if (step == 1) poke(task, task.plan().tensor_offset(Family::kW, 0), 0.25f);
  });
  EXPECT_FALSE(r.cpu.guards_ok);
  EXPECT_TRUE(reports(r, "step 1 (skipped)"));
  EXPECT_FALSE(r.cpu.oracle_ok);  // the changed weight also leaves the oracle's trajectory
}

// ---- outputs ----

nlohmann::json machine_json() {
  nlohmann::json m;
  m["host"] = hostname();
  m["cpu_model"] = first_line_of("/proc/cpuinfo", "model name");
  m["date"] = utc_now();
  for (const auto& kv : g_rows) {
    if (kv.second.result.cpu.ran && !kv.second.result.cpu.description.empty()) {
      m["cpu_backend"] = kv.second.result.cpu.description;
    }
    if (kv.second.result.cuda.ran && !kv.second.result.cuda.description.empty()) {
      m["cuda_backend"] = kv.second.result.cuda.description;
    }
  }
#if RENAISSANCE_WITH_CUDA
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) == cudaSuccess && device_count > 0) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      m["gpu"] = prop.name;
      m["gpu_sm"] = std::to_string(prop.major) + "." + std::to_string(prop.minor);
    }
    int v = 0;
    if (cudaRuntimeGetVersion(&v) == cudaSuccess) m["cuda_runtime"] = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
    if (cudaDriverGetVersion(&v) == cudaSuccess) m["cuda_driver_api"] = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
    // The kernel module's version (what nvidia-smi calls the driver version).
    const std::string nv = first_line_of("/proc/driver/nvidia/version", "");
    // The line reads "... Kernel Module  580.159.04 ..." or, for the open modules,
    // "... Open Kernel Module for x86_64  580.159.04 ...": take the first token after
    // "Kernel Module" that looks like a version number.
    const size_t k = nv.find("Kernel Module");
    if (k != std::string::npos) {
      std::istringstream is(nv.substr(k + 13));
      for (std::string token; is >> token;) {
        if (std::isdigit(static_cast<unsigned char>(token[0])) && token.find('.') != std::string::npos) {
          m["driver"] = token;
          break;
        }
      }
    }
  }
#endif
  return m;
}

nlohmann::json backend_json(const BackendResult& b, bool oracle_checked) {
  nlohmann::json j;
  j["ran"] = b.ran;
  if (!b.ran) {
    j["reason"] = b.not_run_reason;
    return j;
  }
  j["fingerprint"] = b.fingerprint;
  if (oracle_checked) {
    j["err_w"] = b.err_w;
    j["err_m"] = b.err_m;
    j["err_v"] = b.err_v;
    j["err_n"] = b.err_n;
    j["oracle_ok"] = b.oracle_ok;
    j["guards_ok"] = b.guards_ok;
    j["skips_ok"] = b.skips_ok;
  }
  j["step_seconds"] = b.seconds;
  return j;
}

// bitwise / within tolerance / failed, per backend (docs/reproducibility.md: bitwise is the promise).
std::string cpu_status(const Row& row) {
  const CellResult& r = row.result;
  const bool checks = r.cpu.oracle_ok && r.cpu.guards_ok && r.cpu.skips_ok && r.failures.empty();
  if (!checks || row.golden == "differs" || row.golden == "missing" || row.golden == "spec changed") return "failed";
  if (row.golden == "match" || (r.cuda.ran && r.cuda_bitwise)) return "bitwise";
  return row.cell ? "within tolerance" : "fingerprint only";
}
std::string cuda_status(const Row& row) {
  const CellResult& r = row.result;
  if (!r.cuda.ran) return "not run";
  const bool checks = r.cuda.oracle_ok && r.cuda.guards_ok && r.cuda.skips_ok && r.failures.empty();
  return checks && r.cuda_bitwise && row.golden != "differs" ? "bitwise" : "failed";
}

void write_report(const std::string& path, double seconds, int failed_tests) {
  nlohmann::json j;
  j["format"] = "renaissance-conformance-results/1";
  j["machine"] = machine_json();
  j["cuda_available"] = backend_available(BackendKind::kCuda);
  j["golden"] = {{"path", g_golden.path}, {"usable", g_golden.usable}, {"why_not", g_golden.why_not},
                 {"machine", g_golden.machine}};
  j["suite_seconds"] = seconds;
  j["failed_tests"] = failed_tests;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& kv : g_rows) {
    const Row& row = kv.second;
    nlohmann::json c;
    c["name"] = kv.first;
    c["tier"] = row.tier;
    c["kind"] = row.kind;
    c["layout"] = row.layout;
    c["spec"] = row.result.spec;
    c["applied"] = row.result.applied;
    c["skipped"] = row.result.skipped;
    c["tensors"] = row.result.tensors;
    c["oracle_tensors"] = row.result.oracle_tensors;
    if (row.cell) {
      c["bound"] = row.cell->bound;
      c["weight_decay"] = row.cell->weight_decay_on;
      c["wd_mode"] = row.cell->config.weight_decay_mode == WeightDecayMode::kL2 ? "l2" : "decoupled";
      c["lr"] = row.cell->scheduled_lr ? "scheduled" : "constant";
      c["loss_scale"] = row.cell->loss_scale;
      nlohmann::json inj = nlohmann::json::array();
      for (const Injection& i : row.cell->injections) {
        inj.push_back(std::to_string(i.step) + ":" + site_name(i.site));
      }
      c["injections"] = inj;
    }
    c["cpu"] = backend_json(row.result.cpu, row.cell != nullptr);
    c["cpu"]["status"] = cpu_status(row);
    c["cuda"] = backend_json(row.result.cuda, row.cell != nullptr);
    c["cuda"]["status"] = cuda_status(row);
    c["golden"] = row.golden;
    c["failures"] = row.result.failures;
    rows.push_back(c);
  }
  j["cells"] = rows;
  std::ofstream out(path);
  out << j.dump(1) << "\n";
  if (!out) {
    std::cerr << "conformance_suite: cannot write " << path << "\n";
  } else {
    std::cout << "[conformance] results written to " << path << std::endl;
  }
}

// Writes the golden file from this run's CUDA fingerprints, only if every cell and audit run
// ran on CUDA, passed every check and matched the CPU bit for bit.
int record_golden(const std::string& path, int failed_tests) {
  const size_t expected = g_all_cells.size() + kNumOptimizerKinds * (sizeof(kAuditGoldenSteps) / sizeof(int));
  if (failed_tests > 0) {
    std::cerr << "record-golden: NOT recording: " << failed_tests << " test(s) failed\n";
    return 1;
  }
  if (g_rows.size() != expected) {
    std::cerr << "record-golden: NOT recording: " << g_rows.size() << " of " << expected
              << " cells ran (do not filter tests when recording)\n";
    return 1;
  }
  nlohmann::json cells = nlohmann::json::object();
  for (const auto& kv : g_rows) {
    const CellResult& r = kv.second.result;
    if (!r.cuda.ran || !r.cuda_bitwise || r.cuda.fingerprint != r.cpu.fingerprint) {
      std::cerr << "record-golden: NOT recording: cell " << kv.first << " did not match CPU and CUDA bit for bit\n";
      return 1;
    }
    cells[kv.first] = {{"spec", r.spec}, {"fingerprint", r.cuda.fingerprint}};
  }
  nlohmann::json j;
  j["format"] = kGoldenFormat;
  j["recorded"] = true;
  j["note"] = "CUDA fingerprints (Task::fingerprint) of every conformance cell, each equal to the CPU backend's. "
              "Re-record with scripts/record_golden.sh on a GPU machine.";
  j["machine"] = machine_json();
  j["cells"] = cells;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(1) << "\n";
    if (!out) {
      std::cerr << "record-golden: cannot write " << tmp << "\n";
      return 1;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::cerr << "record-golden: cannot rename " << tmp << " to " << path << "\n";
    return 1;
  }
  std::cout << "[conformance] recorded " << cells.size() << " golden fingerprints on "
            << j["machine"].value("gpu", "?") << " into " << path << std::endl;
  return 0;
}

// For the ctest self-test of the golden comparison only: a file that claims to be recorded and
// holds every current cell with its current spec but a deliberately wrong fingerprint, so the
// suite and `renaissance audit` can be shown to report the mismatch. Never a real recording.
int write_mismatch_golden(const std::string& path) {
  nlohmann::json cells = nlohmann::json::object();
  const std::string wrong = "0000000000000000";
  for (const Cell& c : g_all_cells) cells[c.name] = {{"spec", c.spec()}, {"fingerprint", wrong}};
  for (int k = 0; k < kNumOptimizerKinds; ++k) {
    for (int steps : kAuditGoldenSteps) {
      const OptimizerKind kind = static_cast<OptimizerKind>(k);
      cells[audit_cell_name(kind, steps)] = {{"spec", audit_cell_spec(audit_run(kind, steps))}, {"fingerprint", wrong}};
    }
  }
  nlohmann::json j = {{"format", kGoldenFormat},
                      {"recorded", true},
                      {"note", "SELF-TEST ONLY: deliberately wrong fingerprints, not a GPU recording"},
                      {"machine", {{"gpu", "none (self-test)"}, {"date", utc_now()}}},
                      {"cells", cells}};
  std::ofstream out(path);
  out << j.dump(1) << "\n";
  return out ? 0 : 1;
}

}  // namespace
}  // namespace conformance
}  // namespace renaissance

int main(int argc, char** argv) {
  using namespace renaissance;
  using namespace renaissance::conformance;
  ::testing::InitGoogleTest(&argc, argv);
  g_options.golden_path = program_env::golden_path_from_env();
  g_options.recording_opt_out = program_env::golden_recording_from_env();
  try {
    g_options.backend_options.cpu = program_env::cpu_tuning_from_env();
  } catch (const Error& e) {
    std::cerr << "conformance_suite: " << e.what() << "\n";
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "conformance_suite: " << flag << " needs a path\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--golden") {
      g_options.golden_path = value("--golden");
    } else if (a == "--record-golden") {
      g_options.record_path = value("--record-golden");
    } else if (a == "--report-json") {
      g_options.report_path = value("--report-json");
    } else if (a == "--write-mismatch-golden") {
      return write_mismatch_golden(value("--write-mismatch-golden"));
    } else if (a == "--write-tampered-golden") {
      const std::string mode = value("--write-tampered-golden");
      return write_tampered_golden(mode, value("--write-tampered-golden"));
    } else {
      std::cerr << "conformance_suite: unknown option " << a
                << " (expected --golden FILE, --record-golden FILE, --report-json FILE or gtest flags)\n";
      return 2;
    }
  }
  if (!g_options.record_path.empty() && !g_options.recording_opt_out) {
    std::cerr << "conformance_suite: --record-golden is for scripts/record_golden.sh, which sets "
                 "RENAISSANCE_GOLDEN_RECORDING=1\n";
    return 2;
  }
  if (!g_options.record_path.empty() && !backend_available(BackendKind::kCuda)) {
    std::cerr << "conformance_suite: refusing to record golden fingerprints: the CUDA backend is not available "
                 "here (no CUDA build or no device). Golden fingerprints must come from a GPU, never from the CPU.\n";
    return 2;
  }
  g_golden = load_golden(g_options.golden_path);
  std::cout << "[conformance] golden file: "
            << (g_golden.usable ? g_golden.path + " (" + g_golden.machine_line() + ")" : g_golden.why_not) << std::endl;
  const auto start = std::chrono::steady_clock::now();
  const int rc = RUN_ALL_TESTS();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int failed = ::testing::UnitTest::GetInstance()->failed_test_count();
  std::cout << "[conformance] " << g_rows.size() << " cells in " << seconds << " s" << std::endl;
  int record_rc = 0;
  if (!g_options.record_path.empty()) {
    record_rc = record_golden(g_options.record_path, failed);
    // The report of a recording run describes the file it has just written.
    g_golden = load_golden(g_options.record_path);
    for (auto& kv : g_rows) kv.second.golden = record_rc == 0 ? "recorded" : "recording refused";
  }
  if (!g_options.report_path.empty()) write_report(g_options.report_path, seconds, failed);
  return record_rc != 0 ? 1 : rc;
}
