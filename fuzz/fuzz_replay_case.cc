// libFuzzer target: the replay case.json parser (parse_replay_case_json, core/src/io/replay_case.cc),
// the part of load_replay_case that reads untrusted text; the safetensors files it goes on to
// open have their own target (fuzz_safetensors). A malformed case must be an Error; an accepted
// one must be self-consistent (per-step lists as long as `steps`, a valid optimizer config).
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "renaissance/error.h"
#include "renaissance/replay_case.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  renaissance::ReplayCase rc;
  const auto parse = [](const std::string& text) { return renaissance::parse_replay_case_json(text, "fuzz-case"); };
  if (!renaissance_fuzz::parsed_text(data, size, parse, &rc)) return 0;  // refused: a malformed case
  if (rc.steps < 0 || rc.groups.empty() || rc.loss_scale_per_step.size() != static_cast<size_t>(rc.steps)) {
    renaissance_fuzz::property_failed("per-step lists disagree with steps, or no group");
  }
  for (const renaissance::ReplayGroup& g : rc.groups) {
    if (g.lr_per_step.size() != static_cast<size_t>(rc.steps)) renaissance_fuzz::property_failed("a group's lr_per_step disagrees with steps");
  }
  try {
    // run_replay hands these to Task, which would throw mid-run on anything invalid.
    for (const renaissance::ReplayGroup& g : rc.groups) {
      g.config.validate();
      for (double lr : g.lr_per_step) renaissance::check_lr(lr);
    }
    for (double s : rc.loss_scale_per_step) renaissance::check_loss_scale(s);
    renaissance::validate_param_specs(rc.params);
  } catch (const renaissance::Error& e) {
    renaissance_fuzz::property_failed(e.what());
  }
  return 0;
}
