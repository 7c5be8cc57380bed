// libFuzzer target: the layout JSON parser (parse_layout, core/src/io/layout.cc) on arbitrary text.
// A malformed layout must be an Error; an accepted one must satisfy what the rest of the
// library assumes of it (valid names and shapes, a total size that callers such as
// `renaissance run` can compute without overflow).
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "renaissance/error.h"
#include "renaissance/layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  renaissance::Layout layout;
  const auto parse = [](const std::string& text) { return renaissance::parse_layout(text, "fuzz.json"); };
  if (!renaissance_fuzz::parsed_text(data, size, parse, &layout)) return 0;  // refused: a malformed layout
  // The CLI sizes the arena from this; UBSan catches a signed overflow inside it.
  if (layout.total_numel() < 0) renaissance_fuzz::property_failed("an accepted layout has a negative total size");
  // Accepted parameter lists must pass the library's own check, which Task relies on.
  try {
    renaissance::validate_param_specs(layout.params);
  } catch (const renaissance::Error& e) {
    renaissance_fuzz::property_failed(e.what());
  }
  return 0;
}
