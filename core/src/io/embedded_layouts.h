// The table of layouts compiled into the library: generated at build time by
// data/embed_layouts.cmake from data/layouts/*.json, read by layout.cc.
#pragma once

#include <cstddef>

namespace renaissance {
namespace detail {

struct EmbeddedLayout {
  const char* name;           // the file name without .json
  const unsigned char* text;  // the JSON text, `size` bytes (plus a terminating 0)
  size_t size;
};
extern const EmbeddedLayout kEmbeddedLayouts[];
extern const size_t kNumEmbeddedLayouts;

}  // namespace detail
}  // namespace renaissance
