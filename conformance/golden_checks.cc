// The golden file and backend checks that recompute fingerprints cheaply instead of running
// the full cell checks: the golden file as a whole (Golden.*), CUDA against the CPU in every
// small and audit cell (Cuda.*), every small cell on every Highway target (HighwayTargets.*),
// and the damaged golden copies the strictness self-tests feed to the suite and the audit.
#include <gtest/gtest.h>

#include <fstream>
#include <hwy/targets.h>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "audit/synthetic.h"
#include "audit/audit_cells.h"
#include "conformance/runner.h"
#include "conformance/suite_state.h"
#include "renaissance/backend.h"

namespace renaissance {
namespace conformance {
namespace {

// The cells whose fingerprint is cheap to recompute (cell_fingerprint / run_synthetic): every
// small-tier cell and every audit cell. Big and drift cells compare their fingerprints in their
// own tests (each costs minutes on two cores).
struct CheapCell {
  std::string name, spec;
  const Cell* cell;  // null: an audit run
  OptimizerKind kind;
  int steps;
};
std::vector<CheapCell> cheap_cells() {
  std::vector<CheapCell> out;
  for (const Cell& c : g_all_cells) {
    if (c.tier == Tier::kSmall) out.push_back({c.name, c.spec(), &c, c.config.kind, c.steps});
  }
  for (int k = 0; k < kNumOptimizerKinds; ++k) {
    for (int steps : kAuditGoldenSteps) {
      const OptimizerKind kind = static_cast<OptimizerKind>(k);
      out.push_back({audit_cell_name(kind, steps), audit_cell_spec(audit_run(kind, steps)), nullptr, kind, steps});
    }
  }
  return out;
}
std::string cheap_fingerprint(const CheapCell& c, BackendKind backend, std::string* description = nullptr) {
  if (c.cell) return cell_fingerprint(*c.cell, backend, description, g_options.backend_options);
  audit::SyntheticRun run = audit_run(c.kind, c.steps);
  run.backend = backend;
  run.cpu = g_options.backend_options.cpu;
  const audit::SyntheticResult r = audit::run_synthetic(run);
  if (description) *description = r.backend_description;
  return r.fingerprint;
}

// The golden file as a whole: usable (a failure otherwise, except while recording), holding
// exactly the current matrix with unchanged specs, and its fingerprints equal to what the CPU
// computes now for every cheap cell (the others compare in their own tests).
TEST(Golden, RecordedOnGpuAndCoversTheMatrix) {
  if (!g_options.record_path.empty()) GTEST_SKIP() << "recording mode: the golden file is being rewritten";
  ASSERT_TRUE(g_golden.usable) << "NO GOLDEN: " << g_golden.why_not
                               << ". Every CI run must check the CPU against the fingerprints recorded on a GPU.";
  EXPECT_FALSE(g_golden.machine.value("gpu", "").empty()) << "the golden file does not name its GPU";
  std::map<std::string, std::string> want;  // name -> spec, the whole current matrix
  for (const Cell& c : g_all_cells) want[c.name] = c.spec();
  for (const CheapCell& c : cheap_cells()) want[c.name] = c.spec;
  for (const auto& kv : want) {
    const auto it = g_golden.cells.find(kv.first);
    if (it == g_golden.cells.end()) {
      ADD_FAILURE() << "NO GOLDEN for cell " << kv.first << ": the matrix has it, " << g_golden.path
                    << " does not (re-record with scripts/record_golden.sh on a GPU)";
    } else if (it->second.spec != kv.second) {
      ADD_FAILURE() << "cell " << kv.first << " changed since recording\n  recorded: " << it->second.spec
                    << "\n  now:      " << kv.second;
    }
  }
  for (const auto& kv : g_golden.cells) {
    EXPECT_TRUE(want.count(kv.first)) << g_golden.path << " holds cell " << kv.first << ", which the matrix no longer has";
  }
  int compared = 0, differ = 0;
  // The audit cells' fingerprints, recomputed here. (Each small, big and drift cell compares its
  // own in its test, and HighwayTargets.* the small ones on every other SIMD target: repeating
  // them here would only add CI time.)
  int audit_cells = 0;
  for (const CheapCell& c : cheap_cells()) {
    if (c.cell) continue;
    ++audit_cells;
    const auto it = g_golden.cells.find(c.name);
    if (it == g_golden.cells.end() || it->second.spec != c.spec) continue;  // reported above
    const std::string fp = cheap_fingerprint(c, BackendKind::kCpu);
    ++compared;
    if (fp != it->second.fingerprint) {
      ++differ;
      ADD_FAILURE() << "GOLDEN MISMATCH in cell " << c.name << ": CPU fingerprint " << fp << " != golden "
                    << it->second.fingerprint << " recorded on " << g_golden.machine_line();
    }
  }
  EXPECT_EQ(compared, audit_cells) << "audit cells compared with the golden file";
  std::cout << "[conformance] golden file " << g_golden.path << ": " << g_golden.cells.size()
            << " cells, recorded on " << g_golden.machine_line() << "; " << compared
            << " audit fingerprints recomputed on the CPU, " << differ << " differ" << std::endl;
}

// CUDA against the CPU in every small-tier and audit cell, counted: fails unless every one of
// them was run on both and compared (the big and drift cells compare CUDA with the CPU after
// every step in their own tests). Skips only when there is no GPU.
TEST(Cuda, BitwiseAgainstCpuInEverySmallAndAuditCell) {
  if (!backend_available(BackendKind::kCuda)) {
    GTEST_SKIP() << "no CUDA device (or no CUDA build): CPU vs CUDA bitwise comparisons are not run here";
  }
  const std::vector<CheapCell> all = cheap_cells();
  int compared = 0;
  for (const CheapCell& c : all) {
    const std::string cpu = cheap_fingerprint(c, BackendKind::kCpu);
    const std::string cuda = cheap_fingerprint(c, BackendKind::kCuda);
    EXPECT_EQ(cuda, cpu) << "cell " << c.name << ": CUDA differs from the CPU";
    compared += cpu.size() == 16 && cuda.size() == 16 ? 1 : 0;
  }
  EXPECT_EQ(compared, static_cast<int>(all.size())) << "cells compared CPU vs CUDA";
  std::cout << "[conformance] CUDA vs CPU: " << compared << " of " << all.size() << " cells compared" << std::endl;
}

// Every small-tier cell on every Highway target this build compiled and this CPU runs (AVX2,
// SSE4, SSSE3, EMU128, ... as hwy::SupportedAndGeneratedTargets() lists them; a feature-axis
// cell on one of them, see below), each against
// the golden fingerprint: a last-bit difference in one SIMD path alone fails here, naming
// target and cell. The default (best) target is left out: the Small/* cell tests run it and
// compare with the golden file (no need to pay for it twice in CI).
struct ResetSupportedTargets {
  ~ResetSupportedTargets() { hwy::SetSupportedTargetsForTest(0); }
};

TEST(HighwayTargets, SmallTierBitIdenticalOnEveryTarget) {
  // While recording (--record-golden) after a deliberate change of the math, the old file holds
  // fingerprints that are stale on purpose: every target is compared with the default one then
  // (the recorded file is checked against the GPU by the Cuda.* test of the same run).
  const bool recording = !g_options.record_path.empty();
  const bool have_golden = g_golden.usable && !recording;
  if (!have_golden && !golden_optional()) ADD_FAILURE() << "NO GOLDEN: " << g_golden.why_not;
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  std::map<std::string, std::string> first;  // cell -> fingerprint on the default target (no golden)
  std::string default_target;
  for (const Cell& c : g_all_cells) {
    if (c.tier != Tier::kSmall) continue;
    if (!have_golden) {
      first[c.name] = cell_fingerprint(c, BackendKind::kCpu, &default_target, g_options.backend_options);
    } else if (default_target.empty()) {
      cell_fingerprint(c, BackendKind::kCpu, &default_target, g_options.backend_options);
    }
  }
  // The feature-axis cells run on a diagonal here too: the k-th of them on the k-th other target
  // (modulo their count), so each meets one other target and every target meets them (they run
  // the item walks, table reads and group blocks of every op; running each on every target
  // would cost more CI time than the rest of the tier's growth).
  std::map<std::string, size_t> feature_target;
  {
    size_t others = 0;
    for (int64_t target : targets) others += default_target.find(hwy::TargetName(target)) == std::string::npos ? 1 : 0;
    size_t k = 0;
    for (const Cell& c : g_all_cells) {
      if (c.tier == Tier::kSmall && c.has_feature_axes()) feature_target[c.name] = others ? k++ % others : 0;
    }
  }
  std::string ran;
  int compared = 0;
  size_t other = 0;  // index of the target among those run here
  for (int64_t target : targets) {
    const std::string tname = hwy::TargetName(target);
    if (default_target.find(tname) != std::string::npos) continue;  // the Small/* tests' target
    ResetSupportedTargets reset;
    hwy::SetSupportedTargetsForTest(target);
    const size_t this_target = other++;
    for (const Cell& c : g_all_cells) {
      if (c.tier != Tier::kSmall) continue;
      if (c.has_feature_axes() && feature_target[c.name] != this_target) continue;
      std::string described;
      const std::string fp = cell_fingerprint(c, BackendKind::kCpu, &described, g_options.backend_options);
      // The backend names the target its dispatcher picked: proof the restriction took effect.
      if (described.find(tname) == std::string::npos) {
        ADD_FAILURE() << tname << " requested, backend says: " << described;
        return;
      }
      std::string want;
      if (have_golden) {
        const auto it = g_golden.cells.find(c.name);
        if (it == g_golden.cells.end()) continue;  // Golden.* reports the missing cell
        want = it->second.fingerprint;
      } else {
        want = first[c.name];
      }
      ++compared;
      EXPECT_EQ(fp, want) << "cell " << c.name << " on Highway target " << tname
                          << (have_golden ? " vs the golden fingerprint" : " vs the default target");
    }
    ran += (ran.empty() ? "" : " ") + tname;
  }
  RecordProperty("highway_targets", ran);
  EXPECT_FALSE(ran.empty() && targets.size() > 1) << "no target besides the default one ran";
  std::cout << "[conformance] Highway targets run besides the default (" << default_target << "): " << ran << "; "
            << compared << " cell fingerprints compared" << std::endl;
}

}  // namespace

// For the ctest self-tests of golden strictness only: the embedded golden file with one kind of
// damage, to show that the suite and `renaissance audit` fail on it (and do not skip).
//   unrecorded    "recorded": false
//   emptied       a zero-byte file
//   cell_removed  audit.sgd.steps4 deleted
//   flipped       the last hex digit of audit.adam.steps4 changed
// The mixed-precision cells the precision_* modes damage (conformance/CMakeLists.txt expects
// `renaissance audit` to name them): a bf16 nearest cell with model-dtype gradients, and an fp16
// stochastic one.
constexpr const char* kTamperedPrecisionCell = "adamw.small_cnn.wd_on.sched.scale_2p16.nan_last.bf16.nearest.grad_model";
constexpr const char* kRemovedPrecisionCell = "lamb.odd_sizes.wd_on.sched.scale_2p16.nan_middle.fp16.stochastic";

int write_tampered_golden(const std::string& mode, const std::string& path) {
  if (&renaissance_embedded_golden_size == nullptr || renaissance_embedded_golden_size == 0) {
    std::cerr << "conformance_suite: no embedded golden file to tamper with\n";
    return 1;
  }
  nlohmann::json j = nlohmann::json::parse(
      std::string(renaissance_embedded_golden, renaissance_embedded_golden_size));
  std::string text;
  if (mode == "unrecorded") {
    j["recorded"] = false;
  } else if (mode == "cell_removed") {
    if (j["cells"].erase("audit.sgd.steps4") != 1) return 1;
  } else if (mode == "flipped") {
    std::string& fp = j["cells"]["audit.adam.steps4"]["fingerprint"].get_ref<std::string&>();
    fp.back() = fp.back() == '0' ? '1' : '0';
  } else if (mode == "precision_flipped") {  // a mixed-precision cell (cmd_audit.cc's second table)
    std::string& fp = j["cells"][kTamperedPrecisionCell]["fingerprint"].get_ref<std::string&>();
    fp.back() = fp.back() == '0' ? '1' : '0';
  } else if (mode == "precision_removed") {
    if (j["cells"].erase(kRemovedPrecisionCell) != 1) return 1;
  } else if (mode != "emptied") {
    std::cerr << "conformance_suite: unknown tamper mode " << mode << "\n";
    return 2;
  }
  if (mode != "emptied") text = j.dump(1) + "\n";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return out ? 0 : 1;
}

}  // namespace conformance
}  // namespace renaissance
