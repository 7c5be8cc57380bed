// `renaissance replay CASE_DIR`: re-runs a recorded case (docs/replay-format.md) on a
// backend, prints the per-tensor error against expected.safetensors, checks the final
// fingerprint bitwise against case.json's expected_fingerprint (format 2) and the per-tensor step
// counts against expected_tensor_steps, and optionally writes the result. The whole case is validated before anything runs; output is written atomically.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "core/src/io/file_checks.h"
#include "renaissance/error.h"
#include "renaissance/replay.h"
#include "tools/program_env.h"

namespace renaissance {
namespace cli {

namespace {

// Never write over an input of this replay (compared by device and inode after symlinks): the
// case's own files, above all expected.safetensors, whose loss would make the next replay "pass".
void check_out_is_not_an_input(const std::string& out, const std::string& case_dir) {
  io::FileId out_id;
  if (!io::file_id(out, &out_id)) return;  // a new file
  for (const char* name : {"case.json", "init.safetensors", "grads.safetensors", "expected.safetensors"}) {
    io::FileId in_id;
    if (io::file_id(case_dir + "/" + name, &in_id) && in_id == out_id) {
      throw_invalid("--out " + io::printable(out) + ": is the case's " + name + "; it would be overwritten");
    }
  }
}

}  // namespace

int cmd_replay(const ReplayOptions& o) {
  if (o.tolerance_given && !(o.tolerance >= 0.0)) throw_invalid("--tolerance " + std::to_string(o.tolerance) + ": must be >= 0");
  check_threads_option(o.threads);
  TaskOptions options;
  options.backend = backend_from_option(o.backend);
  options.backend_options.threads = o.threads;
  if (!o.out.empty()) {
    io::check_output_path(o.out, "--out");  // before any work: a typo costs nothing
    check_out_is_not_an_input(o.out, o.case_dir);
  }
  const ReplayCase rc = load_replay_case(o.case_dir);
  const double tolerance = replay_tolerance(rc, o.tolerance_given ? o.tolerance : -1.0);

  options.backend_options.cpu = program_env::cpu_tuning_for(options.backend);  // RENAISSANCE_CPU_*
  const ReplayResult r = run_replay(rc, options);
  if (rc.groups.size() == 1) {
    std::printf("replay %s: %s, %lld steps (%lld applied, %lld skipped) on %s\n", io::printable(rc.name).c_str(),
                optimizer_kind_name(rc.groups.front().config.kind), static_cast<long long>(rc.steps),
                static_cast<long long>(r.steps_applied), static_cast<long long>(r.steps_skipped), r.backend.c_str());
  } else {
    std::printf("replay %s: %zu groups in %zu task%s, %lld steps on %s\n", io::printable(rc.name).c_str(),
                rc.groups.size(), r.num_tasks, r.num_tasks == 1 ? "" : "s", static_cast<long long>(rc.steps),
                r.backend.c_str());
    for (size_t gi = 0; gi < rc.groups.size(); ++gi) {
      const ReplayGroup& g = rc.groups[gi];
      std::printf("  group %zu (task %zu%s): %s, %zu tensors, step count %lld -> %lld, fingerprint %s\n", gi,
                  r.group_task[gi], r.group_masked[gi] ? ", per-tensor mask" : "", optimizer_kind_name(g.config.kind),
                  g.num_params, static_cast<long long>(g.initial_step), static_cast<long long>(r.group_step_counts[gi]),
                  r.group_fingerprints[gi].c_str());
    }
  }
  int status = kExitOk;
  if (rc.has_expected) {
    const std::vector<TensorComparison> cmp = compare_replay(rc, r);
    size_t width = 6;
    for (const TensorComparison& c : cmp) width = std::max(width, c.name.size());
    std::printf("  %-*s %10s %12s %12s\n", static_cast<int>(width), "tensor", "numel", "rel L2 err", "max abs err");
    const TensorComparison* worst = nullptr;
    for (const TensorComparison& c : cmp) {
      const bool ok = c.rel_l2 <= tolerance;
      if (c.bitwise) {  // the model copy (c/NAME): bits, whatever the tolerance
        std::printf("  %-*s %10lld %25s%s\n", static_cast<int>(width), io::printable(c.name).c_str(),
                    static_cast<long long>(c.numel), c.mismatched == 0 ? "bitwise equal" : (std::to_string(c.mismatched) + " differ").c_str(),
                    c.mismatched == 0 ? "" : "  BITS DIFFER");
      } else {
        std::printf("  %-*s %10lld %12.3e %12.3e%s\n", static_cast<int>(width), io::printable(c.name).c_str(),
                    static_cast<long long>(c.numel), c.rel_l2, c.max_abs, ok ? "" : "  ABOVE TOLERANCE");
      }
      if (!ok) status = kExitComparisonFailed;
      if (worst == nullptr || !(c.rel_l2 <= worst->rel_l2)) worst = &c;
    }
    if (worst != nullptr) {
      std::printf("worst %.3e (%s), tolerance %.1e: %s\n", worst->rel_l2, io::printable(worst->name).c_str(), tolerance,
                  status == kExitOk ? "PASS" : "FAIL");
    }
  } else if (rc.expected_fingerprint.empty()) {
    std::printf("(no expected.safetensors nor expected_fingerprint in the case: nothing to compare)\n");
  }
  std::printf("fingerprint %s\n", r.fingerprint.c_str());
  const bool fingerprint_ok = fingerprint_matches(rc, r);
  if (!rc.expected_fingerprint.empty()) {
    std::printf("expected fingerprint %s: %s\n", rc.expected_fingerprint.c_str(), fingerprint_ok ? "MATCH" : "MISMATCH");
  }
  // Per-tensor step counts (no_grad_per_step cases): the fingerprint holds the Task's count only.
  bool tensor_steps_given = false;
  for (const ReplayGroup& g : rc.groups) tensor_steps_given = tensor_steps_given || !g.expected_tensor_steps.empty();
  const std::vector<std::string> step_mismatches = tensor_step_mismatches(rc, r);
  if (tensor_steps_given) {
    std::printf("expected tensor step counts: %s\n", step_mismatches.empty() ? "MATCH" : "MISMATCH");
  }
  if (!o.out.empty()) {
    // Written even when the comparison failed: the result is what one inspects then.
    as_system_failure([&] { write_replay_result(o.out, rc, r); });
    std::printf("wrote %s\n", io::printable(o.out).c_str());
  }
  if (status != kExitOk) {
    std::fprintf(stderr, "renaissance replay: %s: error above tolerance %.1e\n", io::printable(rc.name).c_str(), tolerance);
  }
  if (!fingerprint_ok) {
    // Bits, not a tolerance: the recorded run and this replay did not compute the same state.
    std::fprintf(stderr, "renaissance replay: %s: fingerprint mismatch: expected %s (case.json), got %s\n",
                 io::printable(rc.name).c_str(), rc.expected_fingerprint.c_str(), r.fingerprint.c_str());
    status = kExitComparisonFailed;
  }
  if (!step_mismatches.empty()) {
    std::string list;
    for (size_t i = 0; i < step_mismatches.size() && i < 4; ++i) list += (i ? "; " : "") + io::printable(step_mismatches[i]);
    if (step_mismatches.size() > 4) list += "; ... (" + std::to_string(step_mismatches.size()) + " in all)";
    std::fprintf(stderr, "renaissance replay: %s: tensor step count mismatch: %s\n", io::printable(rc.name).c_str(),
                 list.c_str());
    status = kExitComparisonFailed;
  }
  return status;
}

}  // namespace cli
}  // namespace renaissance
