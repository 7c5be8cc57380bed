// `renaissance run`: the main job. Runs an optimizer over a model layout on synthetic gradients,
// shows progress, and reports median step time, effective bandwidth and its share of the same-traffic limit, applied/skipped
// steps and the fingerprint (as text, or as one JSON object with --json).
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "core/src/io/file_checks.h"
#include "renaissance/error.h"
#include "renaissance/layout.h"
#include "renaissance/task.h"
#include "tools/program_env.h"
#if RENAISSANCE_WITH_MPI
#include "renaissance/mpi_communicator.h"
#endif
#if RENAISSANCE_WITH_NCCL
#include "renaissance/nccl_communicator.h"
#endif

namespace renaissance {
namespace cli {

namespace {

// Test-only (tests/comm/cli_runs.cmake): RENAISSANCE_TEST_LOSE_RANK="R:T" makes rank R of a sharded
// run die by SIGKILL when batch T starts, as a lost machine would; the launcher must end the job
// and name the rank.
void maybe_lose_rank(int rank, int t) {
  const char* spec = std::getenv("RENAISSANCE_TEST_LOSE_RANK");
  if (spec == nullptr) return;
  int r = -1, step = -1;
  if (std::sscanf(spec, "%d:%d", &r, &step) == 2 && r == rank && step == t) std::raise(SIGKILL);
}

// `mpirun -np K renaissance run ...` without --distributed would run K whole, independent jobs,
// each printing the same report and writing the same --checkpoint/--record files: refused
// before anything runs. The launchers say the world size in the environment of each process
// (Open MPI: OMPI_COMM_WORLD_SIZE; MPICH, Intel MPI and PMI-2 launchers: PMI_SIZE). This also
// covers one rank of an MPMD launch given no --distributed: it exits 2 and mpirun ends the job,
// instead of the other ranks waiting for it.
void refuse_copies_under_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    char* end = nullptr;
    const long size = std::strtol(value, &end, 10);
    if (end == value || *end != '\0' || size <= 1) continue;
    throw_invalid(std::string("this process is one of ") + std::to_string(size) + " started by an MPI launcher (" +
                  name + "=" + value + ") but --distributed is not given: each process would run the whole job " +
                  "alone (" + std::to_string(size) + " copies printing and writing the same outputs). Give every " +
                  "rank --distributed mpi (or nccl) to run one job over the ranks, or start one process");
  }
}

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
  Schedule schedule;
  if (!audit::parse_schedule(s, &schedule)) {
    throw_invalid("--schedule " + io::printable(s) + ": expected constant, cosine or step");
  }
  return schedule;
}

bool given(const RunOptions& o, const std::string& flag) {
  return std::find(o.given.begin(), o.given.end(), flag) != o.given.end();
}

// The shortest text that reads back as the same double (what a user would type).
std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  for (int p = 1; p <= 17; ++p) {
    char b[40];
    std::snprintf(b, sizeof(b), "%.*g", p, v);
    if (std::strtod(b, nullptr) == v) return b;
  }
  return buf;
}

// The run's configuration as resume compares it: one entry per option, the value as text.
struct Setting {
  const char* flag;       // "--lr"
  std::string stored;     // the checkpoint's value
  std::string requested;  // the command's value (meaningful when given)
  bool overridable;       // kind, decay mode and the check-finite flag change the compiled step
};

// A hyperparameter option the kind does not read would be taken and ignored: refused whatever its
// value (the kind's default included), naming the option and the kinds that read it.
void refuse_options_not_read(const RunOptions& o, OptimizerKind kind) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (!given(o, row.flag) || kind_reads(kind, row)) continue;
    // A flag on by default is also typed as --no-NAME (add_hyperparameters): both spellings.
    const std::string flag = row.flag_field != nullptr && row.fixed_default != 0.0
                                 ? std::string(row.flag) + "/--no-" + (row.flag + 2) : std::string(row.flag);
    throw_invalid(flag + ": --optimizer " + optimizer_kind_name(kind) +
                  " does not read it (the kinds that do: " + kinds_reading(row) + ")");
  }
}

// Sets each hyperparameter of the table that the command gave.
void apply_given_hyperparameters(const RunOptions& o, OptimizerConfig* config) {
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (given(o, row.flag)) set_hyper_value(*config, row, o.hyper[static_cast<size_t>(row.id)]);
  }
}

// On --resume: options left out take the checkpoint's values; an option given with another value
// is refused (exit 2, naming every difference) unless --override names it.
void inherit_from_checkpoint(const RunOptions& o, const CheckpointInfo& ck, OptimizerConfig* config,
                             Schedule* schedule, int* schedule_steps, int* warmup, uint64_t* seed, double* loss_scale) {
  // What --override accepts: the table's hyperparameters a resume may change, then the run's
  // settings.
  std::vector<std::string> names;
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.resume_may_change) names.push_back(row.flag + 2);
  }
  for (const char* name : {"schedule", "schedule-steps", "warmup", "seed", "loss-scale"}) names.push_back(name);
  for (const std::string& name : o.overrides) {
    const std::string bare = name.rfind("--", 0) == 0 ? name.substr(2) : name;
    if (std::find(names.begin(), names.end(), bare) == names.end()) {
      std::string list;
      for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
      throw_invalid("--override " + io::printable(name) + ": not an option a resume may change (" + list + ")");
    }
  }
  auto overridden = [&](const char* flag) {
    for (const std::string& name : o.overrides) {
      if (name == flag || "--" + name == flag) return true;
    }
    return false;
  };
  const OptimizerConfig& c = ck.config;
  const std::string mode = c.weight_decay_mode == WeightDecayMode::kL2 ? "l2" : "decoupled";
  // A table row's stored and requested values as text (a flag: on / off).
  auto hyper_setting = [&](const HyperparameterInfo& row) {
    const double requested = o.hyper[static_cast<size_t>(row.id)];
    if (row.number != nullptr) return Setting{row.flag, num(c.*row.number), num(requested), true};
    return Setting{row.flag, c.*row.flag_field ? "on" : "off", requested != 0.0 ? "on" : "off", false};
  };
  std::vector<Setting> settings = {
      {"--optimizer", optimizer_kind_name(c.kind), o.optimizer, false},
      {"--weight-decay-mode", mode, o.weight_decay_mode, false},
  };
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (!row.resume_may_change) settings.push_back(hyper_setting(row));
  }
  settings.insert(settings.end(), {
      {"--no-check-finite", ck.check_finite ? "off" : "on", o.no_check_finite ? "on" : "off", false},
      // The model copy (format version 3's PRECISION; fp32 for a version-2 file): its dtype and
      // rounding decide the compiled step and every later copy bit.
      {"--precision", precision_name(ck.precision.precision), o.precision, false},
      {"--stochastic-rounding", ck.precision.rounding == Rounding::kStochastic ? "on" : "off",
       o.stochastic_rounding ? "on" : "off", false},
  });
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.resume_may_change) settings.push_back(hyper_setting(row));
  }
  settings.insert(settings.end(), {
      {"--schedule", ck.run.schedule, o.schedule, true},
      {"--schedule-steps", std::to_string(ck.run.schedule_steps), std::to_string(o.schedule_steps), true},
      {"--warmup", std::to_string(ck.run.warmup), std::to_string(o.warmup), true},
      {"--seed", std::to_string(ck.run.seed), std::to_string(o.seed), true},
      {"--loss-scale", num(ck.loss_scale), num(o.loss_scale), true},
  });
  std::string differences;
  for (const Setting& st : settings) {
    if (!given(o, st.flag) || st.requested == st.stored) continue;
    if (st.overridable && overridden(st.flag)) continue;
    differences += std::string(differences.empty() ? "" : "; ") + st.flag + " " + io::printable(st.requested) +
                   " (checkpoint: " + io::printable(st.stored) + ")";
  }
  if (!differences.empty()) {
    throw_invalid("--resume " + io::printable(o.resume) + ": the command differs from the checkpoint's configuration: " +
                  differences + ". Leave the option out to continue as saved, or add --override NAME to change it"
                  " (kind, decay mode, maximize, the non-finite check, precision and rounding cannot change)");
  }
  // Start from the checkpoint, then apply what was given (only overridden values differ).
  *config = c;
  apply_given_hyperparameters(o, config);
  *schedule = parse_schedule(given(o, "--schedule") ? o.schedule : ck.run.schedule);
  *schedule_steps = given(o, "--schedule-steps") ? o.schedule_steps : static_cast<int>(ck.run.schedule_steps);
  *warmup = given(o, "--warmup") ? o.warmup : static_cast<int>(ck.run.warmup);
  *seed = given(o, "--seed") ? o.seed : ck.run.seed;
  *loss_scale = given(o, "--loss-scale") ? o.loss_scale : ck.loss_scale;
}

#if RENAISSANCE_WITH_MPI
// A 64-bit FNV-1a digest of the layout's tensors (names, shapes, roles, groups, marks) in hex: two
// layout files of one name but other tensors differ.
std::string layout_digest(const Layout& layout) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](const std::string& text) {
    for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;  // a separator no text ends with
  };
  for (const ParamSpec& p : layout.params) {
    mix(p.name);
    for (int64_t d : p.shape) mix(std::to_string(d));
    mix("role " + std::to_string(static_cast<int>(p.role)) + " group " + std::to_string(p.hyper_group) +
        (p.optimizer == ParamOptimizer::kAdamW ? " optimizer adamw" : ""));
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The whole configuration of a sharded run as "--option=value" lines, in one fixed order, from
// the values that will run (after a resume's inheritance, the engine's backend): every rank must
// hold the same text, or the ranks would run a mixed state or wait for each other's collectives
// forever. Left out, because they may differ without changing a bit: --threads (the bits do not
// depend on it), --json (only rank 0 prints), --override (its effect is in the values).
std::string configuration_text(const RunOptions& o, const SyntheticRun& run, const Layout& layout,
                               const CheckpointInfo& ck) {
  std::string text;
  auto add = [&text](const std::string& flag, const std::string& value) {
    text += flag + "=" + io::printable(value) + "\n";
  };
  add("--model", layout.name + " (" + std::to_string(layout.params.size()) + " tensors, " +
                     std::to_string(layout.total_numel()) + " elements, digest " + layout_digest(layout) + ")");
  add("--optimizer", optimizer_kind_name(run.config.kind));
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.number != nullptr) add(row.flag, num(run.config.*row.number));
  }
  add("--weight-decay-mode", run.config.weight_decay_mode == WeightDecayMode::kL2 ? "l2" : "decoupled");
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.flag_field != nullptr) add(row.flag, run.config.*row.flag_field ? "on" : "off");
  }
  add("--steps", std::to_string(run.steps));
  add("--schedule", schedule_name(run.schedule));
  add("--schedule-steps", std::to_string(run.schedule_steps));
  add("--warmup", std::to_string(run.warmup));
  add("--loss-scale", num(run.loss_scale));
  std::string nan_at;
  for (int64_t t : run.nan_at) nan_at += (nan_at.empty() ? "" : ",") + std::to_string(t);
  add("--nan-at", nan_at.empty() ? "(none)" : nan_at);
  add("--seed", std::to_string(run.seed));
  add("--no-check-finite", run.check_finite ? "off" : "on");
  add("--precision", precision_name(run.precision.precision));
  add("--stochastic-rounding", run.precision.rounding == Rounding::kStochastic ? "on" : "off");
  add("--grad-dtype", run.precision.model_dtype_gradients ? "model" : "fp32");
  add("--distributed", o.distributed);
  add("--grad-reduce", grad_reduce_name(run.grad_reduce));
  add("--backend", backend_kind_name(run.backend));
  add("--checkpoint", run.checkpoint.empty() ? "(none)" : run.checkpoint);
  add("--checkpoint-every", std::to_string(run.checkpoint_every));
  add("--resume", run.resume.empty() ? "(none)"
                                     : run.resume + " (at step " + std::to_string(ck.step) + ", " +
                                           std::to_string(ck.skipped) + " skipped)");
  return text;
}

// "rank 3" or "ranks 0, 2, 5" (the first 8, then how many more).
std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 8) s += " and " + std::to_string(ranks.size() - 8) + " more";
  return s;
}

// Compares the ranks' configuration texts (in rank order): "" when they are all the same, else
// the first option that differs with each of its values and the ranks that hold it, then the
// names of the other options that differ.
std::string configuration_difference(const std::vector<std::string>& texts) {
  using Setting = std::pair<std::string, std::string>;  // (option, value)
  std::vector<std::vector<Setting>> ranks;
  size_t lines = 0;
  for (const std::string& text : texts) {
    std::vector<Setting> settings;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(start, end - start);
      const size_t eq = line.find('=');
      settings.emplace_back(line.substr(0, eq), eq == std::string::npos ? "" : line.substr(eq + 1));
      start = end + 1;
    }
    lines = std::max(lines, settings.size());
    ranks.push_back(std::move(settings));
  }
  std::string first, others;
  for (size_t i = 0; i < lines; ++i) {
    // The values of line i with the ranks that hold each, in order of first appearance (a rank
    // whose line names another option, another build's text, counts as another value).
    std::string flag;
    std::vector<std::pair<std::string, std::vector<int>>> values;
    for (size_t r = 0; r < ranks.size(); ++r) {
      const Setting s = i < ranks[r].size() ? ranks[r][i] : Setting{"", ""};
      if (flag.empty()) flag = s.first;
      const std::string value = s.first == flag ? s.second : s.first + "=" + s.second;
      auto it = std::find_if(values.begin(), values.end(), [&](const auto& v) { return v.first == value; });
      if (it == values.end()) values.push_back({value, {static_cast<int>(r)}});
      else it->second.push_back(static_cast<int>(r));
    }
    if (values.size() < 2) continue;
    if (!first.empty()) {
      others += (others.empty() ? "" : ", ") + flag;
      continue;
    }
    first = flag + " differs:";
    for (size_t v = 0; v < values.size(); ++v) {
      first += (v ? "; " : " ") + values[v].first + " on " + ranks_text(values[v].second);
    }
  }
  if (first.empty()) return "";
  return first + (others.empty() ? "" : " (also differing: " + others + ")");
}
#endif  // RENAISSANCE_WITH_MPI

}  // namespace

BackendKind backend_from_option(const std::string& text) {
  BackendKind kind;
  if (!parse_backend_kind(text, &kind)) throw_invalid("--backend " + text + ": expected cpu, cuda or auto");
  if (kind == BackendKind::kCuda && !backend_available(BackendKind::kCuda)) {
    throw_invalid("--backend cuda: CUDA is not available here (this build has no CUDA backend or there is no CUDA device)");
  }
  return resolve_backend(kind);
}

void check_threads_option(int threads) {
  // The parser already bounds it by 1024; OpenMP may allow fewer (OMP_THREAD_LIMIT).
  const int limit = omp_get_thread_limit();
  if (threads > limit) {
    throw_invalid("--threads " + std::to_string(threads) + ": more than OpenMP may start here (" + std::to_string(limit) +
                  ", OMP_THREAD_LIMIT)");
  }
}

namespace {

// The optimizer, schedule and run settings a run uses: the options as given, or after --resume
// the checkpoint's with any --override (inherit_from_checkpoint).
struct RunSettingsChosen {
  OptimizerKind kind;
  OptimizerConfig config;
  Schedule schedule;
  int schedule_steps;
  int warmup;
  uint64_t seed;
  double loss_scale;
  bool check_finite;
  CheckpointInfo ck;  // the resumed checkpoint's (empty without --resume)
};

RunSettingsChosen choose_run_settings(const RunOptions& o) {
  RunSettingsChosen c;
  if (!parse_optimizer_kind(o.optimizer, &c.kind)) {
    throw_invalid("--optimizer " + io::printable(o.optimizer) + ": unknown kind (expected " + optimizer_kind_names() + ")");
  }
  refuse_options_not_read(o, c.kind);
  c.config = default_config(c.kind);
  apply_given_hyperparameters(o, &c.config);
  if (o.weight_decay_mode == "l2") c.config.weight_decay_mode = WeightDecayMode::kL2;
  else if (o.weight_decay_mode == "decoupled") c.config.weight_decay_mode = WeightDecayMode::kDecoupled;
  else if (!o.weight_decay_mode.empty()) throw_invalid("--weight-decay-mode " + io::printable(o.weight_decay_mode) + ": expected decoupled or l2");
  if (given(o, "--momentum") && c.config.momentum == 0.0 && kind_info(c.kind).needs_momentum) {
    throw_invalid("--momentum 0: " + o.optimizer + " needs momentum > 0");
  }
  c.schedule = parse_schedule(o.schedule);
  c.schedule_steps = o.schedule_steps > 0 ? o.schedule_steps : o.steps;
  c.warmup = o.warmup;
  c.seed = o.seed;
  c.loss_scale = o.loss_scale;
  c.check_finite = !o.no_check_finite;
  if (!o.resume.empty()) {
    c.ck = read_checkpoint_info(o.resume);
    refuse_options_not_read(o, c.ck.config.kind);  // a resume runs the checkpoint's kind
    inherit_from_checkpoint(o, c.ck, &c.config, &c.schedule, &c.schedule_steps, &c.warmup, &c.seed, &c.loss_scale);
    c.kind = c.config.kind;
    c.check_finite = c.ck.check_finite;
  }
  c.config.validate();  // names the hyperparameter and the value
  check_loss_scale(c.loss_scale);
  if (c.warmup > c.schedule_steps) {
    throw_invalid("--warmup " + std::to_string(c.warmup) + ": must be at most the schedule's horizon (" +
                  std::to_string(c.schedule_steps) + ", --schedule-steps)");
  }
  for (int64_t t : o.nan_at) {
    if (t < 0 || t >= o.steps) {
      throw_invalid("--nan-at " + std::to_string(t) + ": steps are numbered 0.." + std::to_string(o.steps - 1));
    }
  }
  return c;
}

// Sharded runs (docs/distributed.md): checked before MPI starts, the same on every rank. Returns
// the gradient reduction (ordered unless --grad-reduce says otherwise).
GradReduce check_distributed_options(const RunOptions& o) {
  GradReduce grad_reduce = GradReduce::kOrdered;
  if (!o.grad_reduce.empty() && o.distributed.empty()) {
    throw_invalid("--grad-reduce " + io::printable(o.grad_reduce) + ": needs --distributed mpi or nccl (a one-process run has no ranks to reduce over)");
  }
  if (!o.grad_reduce.empty() && !parse_grad_reduce(o.grad_reduce, &grad_reduce)) {
    throw_invalid("--grad-reduce " + io::printable(o.grad_reduce) + ": expected replicated, ordered or fast");
  }
  const bool distributed = !o.distributed.empty();
  const bool nccl = o.distributed == "nccl";  // CUDA ranks; mpi: CPU ranks
  if (!distributed) refuse_copies_under_launcher();
  if (!distributed) return grad_reduce;
  if (!nccl && o.distributed != "mpi") {
    throw_invalid("--distributed " + io::printable(o.distributed) + ": expected mpi (CPU ranks) or nccl (CUDA ranks)");
  }
  if (o.simulate_ranks > 0) {
    throw_invalid("--simulate-ranks: the one-process audit of a sharded run; it cannot be combined with --distributed");
  }
  BackendKind requested = BackendKind::kAuto;
  const bool parsed = parse_backend_kind(o.backend, &requested);
  if (!nccl && parsed && requested == BackendKind::kCuda) {
    throw_invalid("--distributed mpi --backend cuda: MPI ranks run the CPU backend; CUDA ranks run with --distributed nccl");
  }
  if (nccl && parsed && requested == BackendKind::kCpu) {
    throw_invalid("--distributed nccl --backend cpu: NCCL ranks run the CUDA backend; CPU ranks run with --distributed mpi");
  }
  // NCCL first: a build without MPI has no NCCL either, and the NCCL line says what it needs.
#if !RENAISSANCE_WITH_NCCL
  if (nccl) {
    throw_invalid("--distributed nccl: this build has no NCCL communicator (configure with CUDA, MPI and NCCL found: "
                  "-DRENAISSANCE_NCCL=AUTO or ON, NCCL_ROOT=...)");
  }
#endif
#if !RENAISSANCE_WITH_MPI
  throw_invalid("--distributed " + o.distributed + ": this build has no MPI communicator (install libopenmpi-dev and "
                "configure with -DRENAISSANCE_MPI=AUTO or ON)");
#endif
  return grad_reduce;
}

// The model copy and gradient encoding of the run: --precision, --stochastic-rounding and
// --grad-dtype, or after --resume the checkpoint's copy.
PrecisionOptions choose_precision(const RunOptions& o, const RunSettingsChosen& c) {
  PrecisionOptions p;
  if (!parse_precision(o.precision, &p.precision)) {
    throw_invalid("--precision " + io::printable(o.precision) + ": expected " + precision_names_text(false));
  }
  p.rounding = o.stochastic_rounding ? Rounding::kStochastic : Rounding::kNearest;
  p.seed = c.seed;
  // A resume continues the saved copy: dtype, rounding and the rounding key's seed come from the
  // file (a conflicting --precision / --stochastic-rounding was refused above; --seed
  // --override changes the synthetic gradients only).
  if (!o.resume.empty()) p = c.ck.precision;
  if (o.stochastic_rounding && p.precision == Precision::kFp32) {
    throw_invalid("--stochastic-rounding needs --precision " + precision_names_text(true));
  }
  // Not stored in a checkpoint (G is not part of it): a resume takes the flag as given.
  p.model_dtype_gradients = o.grad_dtype == "model";
  if (p.model_dtype_gradients && p.precision == Precision::kFp32) {
    throw_invalid("--grad-dtype model needs --precision " + precision_names_text(true));
  }
  return p;
}

// What a finished run measured, as both result formats print it.
struct RunMeasures {
  int threads;
  double ms;                    // median step time
  double gbps;                  // effective bandwidth
  double share;                 // of the same-traffic limit
  double step_bytes_per_param;  // traffic per parameter of one step
};

void print_json_result(const RunOptions& o, const Layout& layout, const SyntheticRun& run, const SyntheticResult& r,
                       const Communicator* comm, const RunMeasures& m) {
  const OptimizerConfig& config = run.config;
  nlohmann::json j = {
      {"model", io::printable(layout.name)},
      {"tensors", layout.params.size()},
      {"params", layout.total_numel()},
      {"optimizer", optimizer_kind_name(config.kind)},
      {"weight_decay_mode", config.weight_decay_mode == WeightDecayMode::kL2 ? "l2" : "decoupled"},
      // The total gradient norm of the last step (0 without clipping: it is not computed).
      {"last_grad_norm", r.last_grad_norm},
      {"schedule", schedule_name(run.schedule)},
      {"schedule_steps", run.schedule_steps},
      {"warmup", run.warmup},
      {"loss_scale", run.loss_scale},
      {"seed", run.seed},
      {"check_finite", run.check_finite},
      {"precision", precision_name(run.precision.precision)},
      {"rounding", rounding_name(run.precision.rounding)},
      {"grad_dtype", precision_name(gradient_precision(run.precision))},
      {"backend", backend_kind_name(r.backend)},
      {"backend_description", r.backend_description},
      {"threads", m.threads},
      {"steps", o.steps},
      {"steps_applied", r.steps_applied},
      {"steps_skipped", r.steps_skipped},
      {"ms_per_step", m.ms},
      {"ms_per_step_min", r.step_ms.empty() ? 0.0 : *std::min_element(r.step_ms.begin(), r.step_ms.end())},
      {"first_step", r.first_step},
      {"bytes_per_param", m.step_bytes_per_param},
      {"gb_per_s", m.gbps},
      {"limit_gb_per_s", r.limit_gb_per_s},
      {"share_of_limit", m.share},
      {"fingerprint", r.fingerprint},
      // Bytes of this process's arena; a sharded run's rank holds W and G whole, M and V of its
      // slice (docs/distributed.md, "Memory per rank"), rank 0's figure.
      {"arena_bytes_per_rank", r.arena_bytes},
  };
  // The hyperparameters that ran (after a resume: the checkpoint's, with any --override).
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.number != nullptr) j[row.name] = config.*row.number;
    else j[row.name] = config.*row.flag_field;
  }
  if (comm) {
    j["world_size"] = comm->size();
    j["grad_reduce"] = grad_reduce_name(run.grad_reduce);
    j["comm_ms_per_step"] = r.comm_ms_per_step;
  }
  if (o.simulate_ranks > 0) j["simulate_ranks"] = o.simulate_ranks;
  std::printf("%s\n", j.dump().c_str());
}

void print_text_result(const RunOptions& o, const SyntheticRun& run, const SyntheticResult& r, const Communicator* comm,
                       const RunMeasures& m) {
  std::printf("backend        %s\n", r.backend_description.c_str());
  if (comm) {
    std::printf("ranks          %d over %s, --grad-reduce %s, %.3f ms/step in collectives\n", comm->size(),
                comm->describe().c_str(), grad_reduce_name(run.grad_reduce), r.comm_ms_per_step);
  }
  if (o.simulate_ranks > 0) std::printf("simulated      %d ranks, gradients summed in rank order\n", o.simulate_ranks);
  std::printf("arena          %llu bytes%s\n", static_cast<unsigned long long>(r.arena_bytes),
              comm ? " on rank 0 (W, G whole; M, V of its slice)" : "");
  std::printf("step time      %.3f ms (median of %d)\n", m.ms, o.steps);
  std::printf("bandwidth      %.1f GB/s effective (%.0f B/param), same-traffic limit %.1f GB/s measured now: %.0f%% of limit\n",
              m.gbps, m.step_bytes_per_param, r.limit_gb_per_s, 100.0 * m.share);
  std::printf("steps          %lld applied, %lld skipped\n", static_cast<long long>(r.steps_applied),
              static_cast<long long>(r.steps_skipped));
  if (run.config.max_grad_norm > 0.0) {
    std::printf("grad norm      %.9g (last step; clipped to %.9g)\n", r.last_grad_norm, run.config.max_grad_norm);
  }
  std::printf("fingerprint    %s\n", r.fingerprint.c_str());
}

// The synthetic run of these choices over `layout`, on the ranks of `comm` (null: one process).
void fill_run(const RunOptions& o, const RunSettingsChosen& c, const Layout& layout, GradReduce grad_reduce,
              Communicator* comm, SyntheticRun* run) {
  const bool distributed = !o.distributed.empty();
  const bool nccl = o.distributed == "nccl";
  run->params = layout.params;
  run->config = c.config;
  run->steps = o.steps;
  run->backend = distributed ? (nccl ? BackendKind::kCuda : BackendKind::kCpu) : backend_from_option(o.backend);
  run->comm = comm;
  run->before_sharded_step = maybe_lose_rank;
  run->grad_reduce = grad_reduce;
  run->simulate_ranks = o.simulate_ranks;
  run->threads = o.threads;
  run->schedule = c.schedule;
  run->schedule_steps = c.schedule_steps;
  run->warmup = c.warmup;
  run->loss_scale = c.loss_scale;
  run->nan_at = o.nan_at;
  run->seed = c.seed;
  run->check_finite = c.check_finite;
  run->precision = choose_precision(o, c);
  if (o.checkpoint_every > 0 && o.checkpoint.empty()) throw_invalid("--checkpoint-every needs --checkpoint PATH");
  run->checkpoint = o.checkpoint;
  run->checkpoint_every = o.checkpoint_every;
  run->resume = o.resume;
}

}  // namespace

int cmd_run(const RunOptions& o) {
  // Everything the user typed is checked before any memory is allocated or work is done.
  check_threads_option(o.threads);
  // Output safety first: a bad --checkpoint must not cost a whole run.
  if (!o.checkpoint.empty()) io::check_output_path(o.checkpoint, "--checkpoint");
  const RunSettingsChosen c = choose_run_settings(o);
  const GradReduce grad_reduce = check_distributed_options(o);
  // Read only by the MPI and NCCL builds' branches below.
  [[maybe_unused]] const bool distributed = !o.distributed.empty();
  [[maybe_unused]] const bool nccl = o.distributed == "nccl";  // CUDA ranks; mpi: CPU ranks
  std::unique_ptr<Communicator> comm;
#if RENAISSANCE_WITH_NCCL
  if (nccl) comm = make_nccl_communicator();  // before the task: it picks this rank's GPU
#endif
#if RENAISSANCE_WITH_MPI
  if (distributed && !nccl) comm = make_mpi_communicator();
#endif
  const bool lead = comm == nullptr || comm->rank() == 0;  // only rank 0 prints

  SyntheticRun run;
  const Layout layout = resolve_layout(o.model);
  // Never write to a file this invocation reads (by device and inode, after symlinks), except
  // the checkpoint it resumed from: the atomic rename keeps that one until the new one is whole.
  io::FileId out_id, in_id;
  if (!o.checkpoint.empty() && io::file_id(o.checkpoint, &out_id) && !has_builtin_layout(o.model) &&
      io::file_id(o.model, &in_id) && in_id == out_id) {
    throw_invalid("--checkpoint " + io::printable(o.checkpoint) + ": is the layout file given as --model; it would be overwritten");
  }
  fill_run(o, c, layout, grad_reduce, comm.get(), &run);
#if RENAISSANCE_WITH_MPI
  // Every rank must run the same configuration: each one gathers every rank's (the first
  // collective after MPI starts, so no rank waits behind another's different sequence) and all
  // find the same difference. They then end MPI together and exit 2, before any step.
  if (comm) {
    const std::string difference =
        configuration_difference(mpi_all_gather_text(configuration_text(o, run, layout, c.ck)));
    if (!difference.empty()) {
      run.comm = nullptr;
      comm.reset();  // MPI_Finalize on every rank: a clean end, not an abort by mpirun
      throw_invalid("--distributed " + o.distributed + ": the ranks were given different configurations: " +
                    difference + ". Give every rank the same options (--threads and --json may differ)");
    }
  }
#endif

  const int64_t numel = layout.total_numel();
  // The kind's traffic (and the check's read of G), plus the model copy's 2-byte write per
  // parameter, less 2 B per read of G with --grad-dtype model.
  RunMeasures m{};
  m.step_bytes_per_param = bytes_per_param(c.kind, c.check_finite, run.precision);
  const double bytes_per_step = static_cast<double>(numel) * m.step_bytes_per_param;
  Progress progress(o.steps, bytes_per_step, /*plain_lines=*/!o.json);
  if (lead) run.on_step = [&](int done, double ms) { progress.update(done, ms); };
  if (!o.json && lead) {
    std::printf("renaissance run: %s (%zu tensors, %.2f M params), %s, %d steps on %s\n", io::printable(layout.name).c_str(),
                layout.params.size(), static_cast<double>(numel) / 1e6, optimizer_kind_name(c.kind), o.steps,
                backend_kind_name(run.backend));
    std::fflush(stdout);
  }

  // The CPU backend's switches (RENAISSANCE_CPU_*), read where the backend used to read them:
  // just before the task is made.
  run.cpu = program_env::cpu_tuning_for(run.backend);
  SyntheticResult r = run_synthetic(run);
  m.threads = r.backend == BackendKind::kCpu ? (o.threads > 0 ? o.threads : omp_get_num_procs()) : o.threads;
  m.ms = median(r.step_ms);
  m.gbps = m.ms > 0 ? bytes_per_step / (m.ms * 1e-3) / 1e9 : 0.0;
  m.share = r.limit_gb_per_s > 0 ? m.gbps / r.limit_gb_per_s : 0.0;

  if (!lead) return kExitOk;
  if (o.json) print_json_result(o, layout, run, r, comm.get(), m);
  else print_text_result(o, run, r, comm.get(), m);
  return kExitOk;
}

}  // namespace cli
}  // namespace renaissance
