// `renaissance run`: the main job. Runs an optimizer over a model layout on synthetic gradients,
// shows progress, and reports median step time, effective and copy bandwidth, applied/skipped
// steps and the fingerprint (as text, or as one JSON object with --json).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "renaissance/error.h"
#include "renaissance/layout.h"

namespace renaissance {
namespace cli {

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Progress on stderr (stdout stays clean for --json): a redrawn bar on a terminal, a plain line
// about every tenth of the run otherwise (logs and CI).
class Progress {
 public:
  Progress(int steps, double bytes_per_step, bool plain_lines)
      : steps_(steps), bytes_(bytes_per_step), tty_(isatty(STDERR_FILENO) == 1), plain_(plain_lines) {}

  void update(int done, double ms) {
    recent_.push_back(ms);
    if (recent_.size() > 16) recent_.erase(recent_.begin());
    const double m = median(recent_);
    const double gbps = m > 0 ? bytes_ / (m * 1e-3) / 1e9 : 0.0;
    const auto now = std::chrono::steady_clock::now();
    if (tty_) {
      if (done < steps_ && now - last_ < std::chrono::milliseconds(100)) return;
      last_ = now;
      constexpr int kWidth = 30;
      const int filled = static_cast<int>(static_cast<double>(kWidth) * done / steps_);
      std::string bar(static_cast<size_t>(filled), '#');
      bar.append(static_cast<size_t>(kWidth - filled), '.');
      std::fprintf(stderr, "\r[%s] step %d/%d  %8.3f ms/step  %7.1f GB/s", bar.c_str(), done, steps_, m, gbps);
      if (done == steps_) std::fputc('\n', stderr);
      std::fflush(stderr);
    } else if (plain_) {
      const int every = std::max(1, steps_ / 10);
      if (done % every == 0 || done == steps_) {
        std::fprintf(stderr, "step %d/%d: %.3f ms/step, %.1f GB/s\n", done, steps_, m, gbps);
      }
    }
  }

 private:
  int steps_;
  double bytes_;
  bool tty_;
  bool plain_;
  std::vector<double> recent_;
  std::chrono::steady_clock::time_point last_{};
};

Schedule parse_schedule(const std::string& s) {
  if (s == "constant") return Schedule::kConstant;
  if (s == "cosine") return Schedule::kCosine;
  if (s == "step") return Schedule::kStep;
  throw_invalid("--schedule " + s + ": expected constant, cosine or step");
}

}  // namespace

int cmd_run(const RunOptions& o) {
  // Everything the user typed is checked before any memory is allocated or work is done.
  OptimizerKind kind;
  if (!parse_optimizer_kind(o.optimizer, &kind)) {
    throw_invalid("--optimizer " + o.optimizer + ": unknown kind (expected " + optimizer_kind_names() + ")");
  }
  OptimizerConfig config = default_config(kind);
  if (o.lr_given) config.lr = o.lr;
  if (o.weight_decay_given) config.weight_decay = o.weight_decay;
  if (o.momentum_given) config.momentum = o.momentum;
  if (o.beta1_given) config.beta1 = o.beta1;
  if (o.beta2_given) config.beta2 = o.beta2;
  if (o.eps_given) config.eps = o.eps;
  if (o.trust_coefficient_given) config.trust_coefficient = o.trust_coefficient;
  if (o.weight_decay_mode == "l2") config.weight_decay_mode = WeightDecayMode::kL2;
  else if (o.weight_decay_mode == "decoupled") config.weight_decay_mode = WeightDecayMode::kDecoupled;
  else if (!o.weight_decay_mode.empty()) throw_invalid("--weight-decay-mode " + o.weight_decay_mode + ": expected decoupled or l2");
  if (o.momentum_given && o.momentum == 0.0 && kind_info(kind).needs_momentum) {
    throw_invalid("--momentum 0: " + o.optimizer + " needs momentum > 0");
  }
  config.validate();  // names the hyperparameter and the value
  check_loss_scale(o.loss_scale);
  if (o.steps < 1) throw_invalid("--steps " + std::to_string(o.steps) + ": must be >= 1");
  if (o.warmup < 0 || o.warmup > o.steps) {
    throw_invalid("--warmup " + std::to_string(o.warmup) + ": must be between 0 and --steps (" + std::to_string(o.steps) + ")");
  }
  for (int64_t t : o.nan_at) {
    if (t < 0 || t >= o.steps) {
      throw_invalid("--nan-at " + std::to_string(t) + ": steps are numbered 0.." + std::to_string(o.steps - 1));
    }
  }
  if (o.threads < 0) throw_invalid("--threads " + std::to_string(o.threads) + ": must be >= 0 (0: all cores)");

  SyntheticRun run;
  const Layout layout = resolve_layout(o.model);
  run.params = layout.params;
  run.config = config;
  run.steps = o.steps;
  run.backend = backend_from_option(o.backend);
  run.threads = o.threads;
  run.schedule = parse_schedule(o.schedule);
  run.warmup = o.warmup;
  run.loss_scale = o.loss_scale;
  run.nan_at = o.nan_at;
  run.seed = o.seed;
  run.check_finite = !o.no_check_finite;
  if (o.checkpoint_every > 0 && o.checkpoint.empty()) throw_invalid("--checkpoint-every needs --checkpoint PATH");
  run.checkpoint = o.checkpoint;
  run.checkpoint_every = o.checkpoint_every;
  run.resume = o.resume;

  const int64_t numel = layout.total_numel();
  const double step_bytes_per_param = bytes_per_param(kind, !o.no_check_finite);
  const double bytes_per_step = static_cast<double>(numel) * step_bytes_per_param;
  Progress progress(o.steps, bytes_per_step, /*plain_lines=*/!o.json);
  run.on_step = [&](int done, double ms) { progress.update(done, ms); };
  if (!o.json) {
    std::printf("renaissance run: %s (%zu tensors, %.2f M params), %s, %d steps on %s\n", layout.name.c_str(),
                layout.params.size(), static_cast<double>(numel) / 1e6, optimizer_kind_name(kind), o.steps,
                backend_kind_name(run.backend));
    std::fflush(stdout);
  }

  SyntheticResult r = run_synthetic(run);
  const int threads = r.backend == BackendKind::kCpu ? (o.threads > 0 ? o.threads : omp_get_num_procs()) : o.threads;
  const double ms = median(r.step_ms);
  const double gbps = ms > 0 ? bytes_per_step / (ms * 1e-3) / 1e9 : 0.0;
  const double share = r.copy_gb_per_s > 0 ? gbps / r.copy_gb_per_s : 0.0;

  if (o.json) {
    nlohmann::json j = {
        {"model", layout.name},
        {"tensors", layout.params.size()},
        {"params", numel},
        {"optimizer", optimizer_kind_name(kind)},
        {"lr", config.lr},
        {"weight_decay", config.weight_decay},
        {"schedule", o.schedule},
        {"warmup", o.warmup},
        {"loss_scale", o.loss_scale},
        {"seed", o.seed},
        {"backend", backend_kind_name(r.backend)},
        {"backend_description", r.backend_description},
        {"threads", threads},
        {"steps", o.steps},
        {"steps_applied", r.steps_applied},
        {"steps_skipped", r.steps_skipped},
        {"ms_per_step", ms},
        {"ms_per_step_min", r.step_ms.empty() ? 0.0 : *std::min_element(r.step_ms.begin(), r.step_ms.end())},
        {"first_step", r.first_step},
        {"bytes_per_param", step_bytes_per_param},
        {"gb_per_s", gbps},
        {"copy_gb_per_s", r.copy_gb_per_s},
        {"copy_share", share},
        {"fingerprint", r.fingerprint},
    };
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("backend        %s\n", r.backend_description.c_str());
    std::printf("step time      %.3f ms (median of %d)\n", ms, o.steps);
    std::printf("bandwidth      %.1f GB/s effective (%.0f B/param), copy %.1f GB/s measured now: %.0f%% of copy\n", gbps,
                step_bytes_per_param, r.copy_gb_per_s, 100.0 * share);
    std::printf("steps          %lld applied, %lld skipped\n", static_cast<long long>(r.steps_applied),
                static_cast<long long>(r.steps_skipped));
    std::printf("fingerprint    %s\n", r.fingerprint.c_str());
  }
  return kExitOk;
}

}  // namespace cli
}  // namespace renaissance
