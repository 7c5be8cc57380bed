// Step timing for any backend, through the public Task API: for each layout x kind x (with,
// without the non-finite check) it times >= 50 steps (CUDA: events around each graph replay;
// CPU: a steady clock) and prints one JSON object per line with the median, GB/s at the ideal
// traffic of docs/design.md, the backend's copy bandwidth measured in the same run and the share.
// bench/compare_torch.py drives it; it is also the "CUDA benchmark binary" of the bench issue.
//
//   bench_step --backend cuda --layouts resnet50,gpt2_small --kinds adamw,lars --replays 100
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/layout.h"
#include "renaissance/task.h"

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times optimizer steps on one backend; prints one JSON object per configuration."};
  std::string backend_name = "auto", layouts = "resnet50,bert_base,gpt2_small";
  std::string kinds = optimizer_kind_names(","), check = "both";
  int replays = 100, warmup = 5, threads = 0;
  app.add_option("--backend", backend_name, "cpu, cuda or auto")->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--layouts", layouts, "comma-separated built-in layouts or JSON files");
  app.add_option("--kinds", kinds, "comma-separated optimizer kinds");
  app.add_option("--check", check, "non-finite check: on, off or both")->check(CLI::IsMember({"on", "off", "both"}));
  app.add_option("--replays", replays, "timed steps per configuration (median reported)")->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::Range(0, 1000));
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 4096));
  CLI11_PARSE(app, argc, argv);

  try {
    BackendKind backend;
    parse_backend_kind(backend_name, &backend);
    std::vector<bool> checks;
    if (check != "off") checks.push_back(true);
    if (check != "on") checks.push_back(false);
    double copy_gbps = 0.0;
    for (const std::string& layout_name : split(layouts)) {
      const std::vector<ParamSpec> params = resolve_layout(layout_name).params;
      uint64_t param_count = 0;
      for (const ParamSpec& p : params) param_count += static_cast<uint64_t>(p.numel());
      for (const std::string& kind_name : split(kinds)) {
        OptimizerKind kind;
        if (!parse_optimizer_kind(kind_name, &kind)) throw_invalid("unknown optimizer kind '" + kind_name + "'");
        for (bool with_check : checks) {
          TaskOptions options;
          options.backend = backend;
          options.backend_options.threads = threads;
          options.check_finite = with_check;
          Task task(params, options);
          task.optimizer(bench_config(kind));
          task.compile();
          task.synthesize_gradients(1, 0, 1e-3f);
          if (copy_gbps == 0.0) copy_gbps = task.backend().copy_bandwidth_gbps(param_count * 28);
          task.timed_steps(warmup);
          const double ms = median(task.timed_steps(replays));
          const double bytes = bytes_per_param(kind, with_check) * static_cast<double>(param_count);
          const double gbps = bytes / (ms * 1e-3) / 1e9;
          nlohmann::json row = {{"layout", layout_name},
                                {"optimizer", kind_name},
                                {"backend", task.backend().describe()},
                                {"check_finite", with_check},
                                {"params", param_count},
                                {"replays", replays},
                                {"ms_per_step", ms},
                                {"gb_per_s", gbps},
                                {"copy_gb_per_s", copy_gbps},
                                {"copy_share", gbps / copy_gbps},
                                {"floor_ms", bytes / (copy_gbps * 1e9) * 1e3},
                                {"launches_per_step", task.backend().launches_per_step()},
                                {"steps_applied", task.step_count()}};
          std::cout << row.dump() << std::endl;
        }
      }
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_step: %s\n", e.what());
    return 2;
  }
  return 0;
}
