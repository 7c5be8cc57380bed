// `renaissance replay CASE_DIR`: re-runs a recorded case (../shared/replay-format.md) on a
// backend, prints the per-tensor error against expected.safetensors and optionally writes the
// result. The whole case is validated before anything runs; output is written atomically.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "renaissance/error.h"
#include "renaissance/replay.h"

namespace renaissance {
namespace cli {

namespace {

// Fails early (before the run) when --out cannot be created, so a typo costs nothing.
void check_out_path(const std::string& out) {
  const size_t slash = out.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : out.substr(0, slash));
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw_invalid("--out " + out + ": folder '" + dir + "' does not exist");
  }
  if (::access(dir.c_str(), W_OK) != 0) throw_invalid("--out " + out + ": folder '" + dir + "' is not writable");
  if (::stat(out.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw_invalid("--out " + out + ": is a folder");
}

}  // namespace

int cmd_replay(const ReplayOptions& o) {
  if (!(o.tolerance >= 0.0)) throw_invalid("--tolerance " + std::to_string(o.tolerance) + ": must be >= 0");
  if (o.threads < 0) throw_invalid("--threads " + std::to_string(o.threads) + ": must be >= 0 (0: all cores)");
  TaskOptions options;
  options.backend = backend_from_option(o.backend);
  options.backend_options.threads = o.threads;
  if (!o.out.empty()) check_out_path(o.out);
  const ReplayCase rc = load_replay_case(o.case_dir);

  const ReplayResult r = run_replay(rc, options);
  std::printf("replay %s: %s, %lld steps (%lld applied, %lld skipped) on %s\n", rc.name.c_str(),
              optimizer_kind_name(rc.config.kind), static_cast<long long>(rc.steps),
              static_cast<long long>(r.steps_applied), static_cast<long long>(r.steps_skipped), r.backend.c_str());
  int status = kExitOk;
  if (rc.has_expected) {
    const std::vector<TensorComparison> cmp = compare_replay(rc, r);
    size_t width = 6;
    for (const TensorComparison& c : cmp) width = std::max(width, c.name.size());
    std::printf("  %-*s %10s %12s %12s\n", static_cast<int>(width), "tensor", "numel", "rel L2 err", "max abs err");
    const TensorComparison* worst = nullptr;
    for (const TensorComparison& c : cmp) {
      const bool ok = c.rel_l2 <= o.tolerance;
      std::printf("  %-*s %10lld %12.3e %12.3e%s\n", static_cast<int>(width), c.name.c_str(),
                  static_cast<long long>(c.numel), c.rel_l2, c.max_abs, ok ? "" : "  ABOVE TOLERANCE");
      if (!ok) status = kExitComparisonFailed;
      if (worst == nullptr || !(c.rel_l2 <= worst->rel_l2)) worst = &c;
    }
    if (worst != nullptr) {
      std::printf("worst %.3e (%s), tolerance %.1e: %s\n", worst->rel_l2, worst->name.c_str(), o.tolerance,
                  status == kExitOk ? "PASS" : "FAIL");
    }
  } else {
    std::printf("(no expected.safetensors in the case: nothing to compare)\n");
  }
  std::printf("fingerprint %s\n", r.fingerprint.c_str());
  if (!o.out.empty()) {
    // Written even when the comparison failed: the result is what one inspects then.
    write_replay_result(o.out, rc, r);
    std::printf("wrote %s\n", o.out.c_str());
  }
  if (status != kExitOk) {
    std::fprintf(stderr, "renaissance replay: %s: error above tolerance %.1e\n", rc.name.c_str(), o.tolerance);
  }
  return status;
}

}  // namespace cli
}  // namespace renaissance
