// Times whole optimizer steps of the CUDA backend: the median of >= 50 CUDA-graph replays, each
// bracketed by CUDA events on the step stream, for the layouts and kinds of issue 4's table,
// with and without the non-finite check, against the floor = ideal bytes / device copy bandwidth.
//
//   cuda_step_timing [LAYOUT_DIR] [REPLAYS]     (LAYOUT_DIR defaults to ../shared/layouts)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend_cuda/cuda_backend.h"
#include "backend_cuda/cuda_check.h"
#include "renaissance/error.h"
#include "renaissance/task.h"

using namespace renaissance;

namespace {

std::vector<ParamSpec> load_layout(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_io("cannot open " + path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  std::vector<ParamSpec> params;
  for (const auto& p : doc.at("params")) {
    ParamSpec spec;
    spec.name = p.at("name").get<std::string>();
    spec.shape = p.at("shape").get<std::vector<int64_t>>();
    const std::string role = p.at("role").get<std::string>();
    if (!parse_role(role.c_str(), &spec.role)) throw_format(path + ": unknown role " + role);
    params.push_back(spec);
  }
  return params;
}

struct Case {
  const char* label;
  const char* layout;
  OptimizerConfig config;
  double bytes_per_param;  // ideal traffic without the check (DESIGN.md §5)
  double target_ms;        // issue 4's target (without the check); 0: none
};

struct Result {
  std::string label, layout;
  bool check = false;
  int64_t params = 0;
  size_t tensors = 0;
  double median_ms = 0, min_ms = 0, floor_ms = 0, target_ms = 0;
};

Result time_case(const Case& c, const std::vector<ParamSpec>& params, bool check, double gbps, int replays) {
  TaskOptions options;
  options.backend = BackendKind::kCuda;
  options.check_finite = check;
  Task task(params, options);
  task.optimizer(c.config);
  task.compile();
  // Weights and gradients from the synthetic generator, never zeros (zeros can time faster).
  task.synthesize_gradients(11, 0, 1.0f);
  const MemoryPlan& plan = task.plan();
  const Span w = plan.region_range(W_BN_BIAS, W_DEEP_CONV);
  const Span g = plan.region_range(G_BN_BIAS, G_DEEP_CONV);
  char* base = static_cast<char*>(task.backend().arena());
  RN_CUDA_CHECK(cudaDeviceSynchronize());
  RN_CUDA_CHECK(cudaMemcpy(base + w.offset, base + g.offset, w.count * sizeof(float), cudaMemcpyDeviceToDevice));
  task.synthesize_gradients(12, 1, 1e-2f);
  auto stream = static_cast<cudaStream_t>(cuda::step_stream(task.backend()));
  for (int i = 0; i < 10; ++i) task.step();  // warm-up: clocks, graph upload, caches
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(replays));
  for (auto& e : events) RN_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < replays; ++i) {
    RN_CUDA_CHECK(cudaEventRecord(events[2 * i], stream));
    task.step();
    RN_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream));
  }
  RN_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < replays; ++i) {
    float t = 0;
    RN_CUDA_CHECK(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]));
    ms.push_back(t);
  }
  for (auto e : events) RN_CUDA_CHECK(cudaEventDestroy(e));
  if (task.skipped_steps() != 0) throw Error(ErrorKind::kBackend, "a timed step was skipped");
  std::sort(ms.begin(), ms.end());
  Result r;
  r.label = c.label;
  r.layout = c.layout;
  r.check = check;
  for (const auto& p : params) r.params += p.numel();
  r.tensors = params.size();
  r.median_ms = ms[ms.size() / 2];
  r.min_ms = ms.front();
  // The floor is the ideal traffic of the step this row runs: the check reads G once more.
  r.floor_ms = static_cast<double>(r.params) * (c.bytes_per_param + (check ? 4.0 : 0.0)) / (gbps * 1e9) * 1e3;
  r.target_ms = check ? 0.0 : c.target_ms;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string dir = argc > 1 ? argv[1] : "../shared/layouts";
    const int replays = argc > 2 ? std::max(50, std::atoi(argv[2])) : 200;
    if (!backend_available(BackendKind::kCuda)) {
      std::printf("SKIP: %s\n", cuda::unavailable_reason().c_str());
      return 0;
    }
    OptimizerConfig adamw;
    adamw.kind = OptimizerKind::kAdamW;
    adamw.lr = 1e-3;
    adamw.weight_decay = 0.01;
    OptimizerConfig momentum;
    momentum.kind = OptimizerKind::kSgdMomentum;
    momentum.lr = 0.1;
    momentum.momentum = 0.9;
    momentum.weight_decay = 1e-4;
    OptimizerConfig lars;
    lars.kind = OptimizerKind::kLars;
    lars.lr = 0.1;
    lars.momentum = 0.9;
    lars.weight_decay = 1e-4;
    const Case cases[] = {
        {"adamw", "resnet50", adamw, 28.0, 0.180},
        {"adamw", "gpt2_small", adamw, 28.0, 0.850},
        {"sgd_momentum", "resnet50", momentum, 20.0, 0.130},
        {"lars", "resnet50", lars, 28.0, 0.220},
    };
    double gbps = 0;
    std::string device;
    std::vector<Result> results;
    for (const Case& c : cases) {
      const auto params = load_layout(dir + "/" + c.layout + ".json");
      for (bool check : {false, true}) {
        if (gbps == 0) {
          TaskOptions options;
          options.backend = BackendKind::kCuda;
          Task probe(params, options);
          probe.optimizer(c.config);
          probe.compile();
          device = probe.backend().describe();
          gbps = probe.backend().copy_bandwidth_gbps(uint64_t{1} << 30);
        }
        results.push_back(time_case(c, params, check, gbps, replays));
        const Result& r = results.back();
        std::printf("%-13s %-11s check=%d  median %.4f ms  min %.4f ms  floor %.4f ms\n", r.label.c_str(),
                    r.layout.c_str(), r.check ? 1 : 0, r.median_ms, r.min_ms, r.floor_ms);
      }
    }
    std::printf("\n%s, device copy bandwidth %.0f GB/s (read + write), median of %d graph replays\n",
                device.c_str(), gbps, replays);
    std::printf("%-13s %-11s %-5s %9s %9s %9s %8s %8s %s\n", "kind", "layout", "check", "params", "median_ms",
                "floor_ms", "%floor", "target", "verdict");
    bool all_met = true;
    for (const Result& r : results) {
      const bool met = r.target_ms == 0 || r.median_ms <= r.target_ms;
      all_met = all_met && met;
      char target[32] = "-";
      if (r.target_ms > 0) std::snprintf(target, sizeof(target), "%.3f", r.target_ms);
      std::printf("%-13s %-11s %-5s %9lld %9.4f %9.4f %7.1f%% %8s %s\n", r.label.c_str(), r.layout.c_str(),
                  r.check ? "on" : "off", static_cast<long long>(r.params), r.median_ms, r.floor_ms,
                  100.0 * r.floor_ms / r.median_ms, target, r.target_ms == 0 ? "" : (met ? "MET" : "MISSED"));
    }
    return all_met ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_step_timing: %s\n", e.what());
    return 1;
  }
}
