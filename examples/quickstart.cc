// A minimal program: three parameters, AdamW, a few steps with synthetic gradients.
#include <cstdio>
#include <vector>

#include "renaissance/task.h"

int main() {
  using namespace renaissance;
  std::vector<ParamSpec> params = {
      {"conv.weight", {16, 3, 3, 3}, Role::kFirstConv},
      {"bn.weight", {16}, Role::kBnWeight},
      {"fc.bias", {10}, Role::kFcBias},
  };
  TaskOptions options;
  options.backend = BackendKind::kAuto;
  Task task(params, options);
  task.optimizer(AdamW().lr(1e-3).weight_decay(0.01));
  task.compile();
  for (size_t id = 0; id < task.num_params(); ++id) {
    std::vector<float> w(static_cast<size_t>(task.param(id).numel()), 0.5f);
    task.set_weight(id, w.data());
  }
  for (int step = 0; step < 5; ++step) {
    for (size_t id = 0; id < task.num_params(); ++id) {
      std::vector<float> g(static_cast<size_t>(task.param(id).numel()));
      for (size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * static_cast<float>((i + step) % 7) - 0.03f;
      task.set_grad(id, g.data());
    }
    task.step();
  }
  std::vector<float> w(static_cast<size_t>(task.param(0).numel()));
  task.get_weight(0, w.data());
  std::printf("backend %s: %lld steps, conv.weight[0] = %.9g, fingerprint %s\n",
              task.backend().describe().c_str(), static_cast<long long>(task.step_count()), w[0],
              task.fingerprint().c_str());
  return 0;
}
