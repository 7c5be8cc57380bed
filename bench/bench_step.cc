// Step timing for any backend, through the public Task API: for each layout x kind x (with,
// without the non-finite check) it times steps two ways (Backend::timed_steps): enqueued (N
// steps back to back, CUDA events around each, one synchronisation at the end: the headline)
// and synced (a synchronisation after every step: what a loop with host work sees). It prints
// one JSON object per line with the medians, GB/s at the ideal traffic of docs/design.md, the
// backend's same-traffic limit measured in the same run over the task's own arena
// (Backend::same_traffic_gbps) and the share of it. On the CPU both methods are one.
// bench/compare_torch.py drives it; it is also the "CUDA benchmark binary" of the bench issue.
//
//   bench_step --backend cuda --layouts resnet50,gpt2_small --kinds adamw,lars --replays 100
//   bench_step --backend cuda --kinds sgd_momentum --weight-decay-mode l2   (torch.optim.SGD's decay)
//   bench_step --layouts bench/traffic_layout.json --verify-traffic   (a ctest: no timing, see below)
//   bench_step --backend cuda --kinds adamw --tensor-mask clear   (renaissance.torch's Task, no None grad)
//   bench_step --backend cuda --kinds muon --muon-mode fast --layouts muon_layout.json --muon-phases
//     (after each Muon row, a table of the step's phases: cuda::phase_times, CUDA events between
//     the nodes and Newton-Schulz's phases, run outside the graph; medians over --replays steps.
//     bench/bench_torch_muon.py --phases runs it on layouts whose embeddings take the aux AdamW)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/backend.h"
#include "renaissance/kinds.h"
#include "renaissance/layout.h"
#include "renaissance/task.h"
#include "tools/program_env.h"
#if RENAISSANCE_WITH_CUDA
#include "backend_cuda/cuda_backend.h"
#endif

namespace {

using namespace renaissance;

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// --muon-phases: cuda::phase_times of the task's step, printed as a table after its JSON row (a
// warm-up step first: the first eager launches of a kernel load its module).
void print_phases(Backend& b, const CompiledStep& step, int replays, const std::string& title, double step_ms) {
#if RENAISSANCE_WITH_CUDA
  (void)cuda::phase_times(b, step, 1);
  const std::vector<cuda::PhaseTime> phases = cuda::phase_times(b, step, replays);
  double sum = 0.0;
  for (const cuda::PhaseTime& p : phases) sum += p.ms;
  std::printf("muon phases: %s; ms per step, medians of %d steps (CUDA events; one stream, no graph)\n", title.c_str(),
              replays);
  for (const cuda::PhaseTime& p : phases) {
    std::printf("  %-52s %9.4f %6.1f %%\n", p.name.c_str(), p.ms, sum > 0.0 ? 100.0 * p.ms / sum : 0.0);
  }
  std::printf("  %-52s %9.4f\n", "sum of the phases", sum);
  if (step_ms > 0.0) std::printf("  %-52s %9.4f\n", "the whole step as a CUDA graph (ms_per_step)", step_ms);
  std::fflush(stdout);
#else
  (void)b, (void)step, (void)replays, (void)title, (void)step_ms;
  throw_invalid("--muon-phases needs a build with the CUDA backend");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times optimizer steps on one backend; prints one JSON object per configuration."};
  std::string backend_name = "auto", layouts = "resnet50,bert_base,gpt2_small";
  std::string kinds = optimizer_kind_names(","), check = "both";
  std::string timing = "both", wd_mode = "decoupled";
  bool verify_traffic = false;
  int replays = 100, warmup = 5, threads = 0;
  double max_grad_norm = 0.0;  // clipping on every configuration when > 0 (compare_torch's clip rows)
  std::string precision = "fp32";  // bf16/fp16: the model copy written by every step
  bool stochastic_rounding = false;
  std::string grad_dtype = "fp32";  // model: gradients in the model dtype (2 B/param per read of G)
  std::string tensor_mask = "none";
  bool muon_batches = BackendOptions{}.cuda_muon_batches;
  std::string muon_mode = "exact";
  bool muon_phases = false;
  app.add_option("--backend", backend_name, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--layouts", layouts, "comma-separated built-in layouts or JSON files");
  app.add_option("--kinds", kinds, "comma-separated optimizer kinds");
  app.add_option("--check", check, "non-finite check: on, off or both")->check(CLI::IsMember({"on", "off", "both"}));
  app.add_option("--replays", replays, "timed steps per configuration (median reported)")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::Range(0, 1000));
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 4096));
  app.add_option("--timing", timing, "enqueued (one sync at the end), synced (a sync per step) or both")
      ->check(CLI::IsMember({"enqueued", "synced", "both"}));
  app.add_option("--weight-decay-mode", wd_mode, "decoupled, or l2 (torch.optim.SGD) for the kinds that allow it")
      ->check(CLI::IsMember({"decoupled", "l2"}));
  app.add_option("--max-grad-norm", max_grad_norm, "clip the global gradient norm to X (0: off)")->check(CLI::Range(0.0, 1e30));
  app.add_option("--precision", precision, "model copy: fp32 (none), bf16 or fp16")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_flag("--stochastic-rounding", stochastic_rounding, "round the model copy stochastically (needs bf16 or fp16)");
  app.add_option("--grad-dtype", grad_dtype, "fp32, or model: gradients in the model dtype (needs bf16 or fp16)")
      ->check(CLI::IsMember({"fp32", "model"}));
  app.add_flag("--verify-traffic", verify_traffic,
               "instead of timing: check that the same-traffic passes move bytes_per_param x params (a layout of "
               "weight-group tensors of multiples of 64 elements) and leave the state bit for bit as it was");
  // TaskOptions::tensor_mask (what renaissance.torch builds): none (without it), clear (with it,
  // nothing masked: the unmasked program) or set (the masked program over a mask of zeros).
  app.add_option("--tensor-mask", tensor_mask, "none, clear or set: the per-tensor mask's programs (default none)")
      ->check(CLI::IsMember({"none", "clear", "set"}));
  app.add_option("--muon-mode", muon_mode, "muon: Newton-Schulz products, exact or fast")
      ->check(CLI::IsMember({"exact", "fast"}));
  app.add_flag("--cuda-muon-batches,!--no-cuda-muon-batches", muon_batches,
               "CUDA: Muon's Newton-Schulz as cuBLASLt batches per shape class, or one matrix after another "
               "(BackendOptions::cuda_muon_batches; default on)");
  app.add_flag("--muon-phases", muon_phases,
               "CUDA, kind muon: after each row, the step's phases as a table (momentum, each Newton-Schulz "
               "phase per shape class, the update, the aux AdamW...): CUDA events between them, outside the "
               "graph, medians over --replays steps");
  CLI11_PARSE(app, argc, argv);

  bool failed = false;
  try {
    BackendKind backend;
    parse_backend_kind(backend_name, &backend);
    if (muon_phases && resolve_backend(backend) != BackendKind::kCuda) {
      throw_invalid("--muon-phases needs the CUDA backend");
    }
    std::vector<bool> checks;
    if (check != "off") checks.push_back(true);
    if (check != "on") checks.push_back(false);
    for (const std::string& layout_name : split(layouts)) {
      const std::vector<ParamSpec> params = resolve_layout(layout_name).params;
      uint64_t param_count = 0;
      for (const ParamSpec& p : params) param_count += static_cast<uint64_t>(p.numel());
      for (const std::string& kind_name : split(kinds)) {
        OptimizerKind kind;
        if (!parse_optimizer_kind(kind_name, &kind)) throw_invalid("unknown optimizer kind '" + kind_name + "'");
        OptimizerConfig config = bench_config(kind);
        const bool l2 = wd_mode == "l2" && kind_info(kind).allows_l2;
        if (l2) config.weight_decay_mode = WeightDecayMode::kL2;
        config.max_grad_norm = max_grad_norm;
        if (kind == OptimizerKind::kMuon) config.muon_mode = muon_mode == "fast" ? 1.0 : 0.0;
        if (tensor_mask != "none" && (kind_info(kind).norm == NormPass::kLambTrustRatio || max_grad_norm > 0.0)) {
          std::fprintf(stderr, "bench_step: %s: no per-tensor mask with LAMB or clipping yet; skipped\n", kind_name.c_str());
          continue;
        }
        for (bool with_check : checks) {
          TaskOptions options;
          options.backend = backend;
          options.backend_options.threads = threads;
          options.backend_options.cpu = program_env::cpu_tuning_for(backend);  // RENAISSANCE_CPU_*
          options.check_finite = with_check;
          parse_precision(precision, &options.precision.precision);
          options.precision.rounding = stochastic_rounding ? Rounding::kStochastic : Rounding::kNearest;
          options.precision.model_dtype_gradients = grad_dtype == "model";
          options.tensor_mask = tensor_mask != "none";
          options.backend_options.cuda_muon_batches = muon_batches;
          Task task(params, options);
          task.optimizer(config);
          task.compile();
          task.synthesize_gradients(1, 0, 1e-3f);
          if (tensor_mask == "set") task.tensor_mask_written(true);
          // One step through the task: it prepares the program it runs (Task::step_program).
          if (options.tensor_mask && !verify_traffic) task.step();
          Backend& b = task.backend();
          if (verify_traffic) {
            // The limit is only a limit of this step if it moves what the step moves, and it may
            // run between a user's steps only if it changes nothing.
            const std::vector<TrafficPass> passes = same_traffic_passes(task.plan(), kind, with_check);
            const double want = bytes_per_param(kind, with_check) * static_cast<double>(param_count);
            const double got = traffic_bytes(passes);
            task.synthesize_weights(2, 0, 0.05f);  // non-zero state, so any change of a bit shows
            const std::string before = task.fingerprint();
            b.same_traffic_gbps(passes, 2);
            const std::string after = task.fingerprint();
            std::printf("%s %s check=%d: same-traffic passes move %.0f bytes, the step %.0f; fingerprint %s -> %s\n",
                        layout_name.c_str(), kind_name.c_str(), with_check ? 1 : 0, got, want, before.c_str(), after.c_str());
            if (got != want || before != after) {
              std::fprintf(stderr, "bench_step: %s %s check=%d: %s\n", layout_name.c_str(), kind_name.c_str(), with_check ? 1 : 0,
                           got != want ? "the same-traffic passes do not move the step's bytes" : "the same-traffic passes changed the state");
              failed = true;
            }
            continue;
          }
          // The limit of this very step's access pattern, over this task's arena.
          const double limit_gbps = b.same_traffic_gbps(same_traffic_passes(task.plan(), kind, with_check), 20);
          // + the model copy's 2 B write, - 2 B per read of model-dtype gradients
          const double bytes = bytes_per_param(kind, with_check, options.precision) * static_cast<double>(param_count);
          nlohmann::json row = {{"layout", layout_name},
                                {"optimizer", kind_name},
                                {"weight_decay_mode", l2 ? "l2" : "decoupled"},
                                {"max_grad_norm", max_grad_norm},
                                {"backend", b.describe()},
                                {"check_finite", with_check},
                                {"precision", precision},
                                {"rounding", stochastic_rounding ? "stochastic" : "nearest"},
                                {"grad_dtype", grad_dtype == "model" ? precision : "fp32"},
                                {"tensor_mask", tensor_mask},
                                {"cuda_muon_batches", muon_batches},
                                {"muon_mode", muon_mode},
                                {"params", param_count},
                                {"replays", replays},
                                {"limit_gb_per_s", limit_gbps},
                                {"floor_ms", bytes / (limit_gbps * 1e9) * 1e3},
                                {"launches_per_step", b.launches_per_step()}};
          for (bool synced : {false, true}) {
            if (timing != "both" && (timing == "synced") != synced) continue;
            b.timed_steps(task.step_program(), warmup, synced);
            const double ms = median(b.timed_steps(task.step_program(), replays, synced));
            const double gbps = bytes / (ms * 1e-3) / 1e9;
            const std::string suffix = synced ? "_synced" : "";
            row["ms_per_step" + suffix] = ms;
            row["gb_per_s" + suffix] = gbps;
            row["share_of_limit" + suffix] = gbps / limit_gbps;
          }
          row["steps_applied"] = task.step_count();
          std::cout << row.dump() << std::endl;
          if (muon_phases && kind == OptimizerKind::kMuon) {
            const std::string title = layout_name + ", muon " + muon_mode + ", batches " +
                                      (muon_batches ? "on" : "off") + ", check " + (with_check ? "on" : "off") +
                                      ", " + b.describe();
            print_phases(b, task.step_program(), replays, title, row.value("ms_per_step", 0.0));
          }
        }
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_step: %s\n", e.what());
    return 2;
  }
  return failed ? 1 : 0;
}
