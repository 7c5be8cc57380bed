// Model layouts: the parameter list of a model (name, shape, role) as JSON, in the format of
// data/layouts/*.json: {"name": ..., "params": [{"name", "shape", "role"}, ...]}; a parameter may
// add "optimizer": "adamw" (or "muon", the default of a weight role): which optimizer of a muon
// task steps it (ParamOptimizer; other kinds ignore it). The five
// layouts of data/layouts/ are compiled into the library, so `renaissance run --model resnet50`
// works on a machine that has only the binary.
#pragma once

#include <string>
#include <vector>

#include "renaissance/param.h"

namespace renaissance {

// Limits of a layout, the same wherever a layout is read (parse_layout) and on both sides of a
// checkpoint (Task::save, Task::load), so that no accepted layout writes an unloadable file.
constexpr size_t kMaxParamRank = 64;
constexpr size_t kMaxParamNameBytes = 4096;
constexpr size_t kMaxParams = size_t{1} << 20;

// Throws Error(kInvalidArgument) naming the parameter when `params` exceeds a limit above.
void check_layout_limits(const std::vector<ParamSpec>& params);

struct Layout {
  std::string name;
  std::vector<ParamSpec> params;

  int64_t total_numel() const;
};

// Parses layout JSON text; `source` names it in errors (a path or "builtin:resnet50"). Throws
// Error(kFormat) naming the source, the parameter and the key for anything malformed:
// invalid JSON, unknown keys, a bad shape or role, duplicate names.
Layout parse_layout(const std::string& json_text, const std::string& source);
// Reads and parses a layout file; Error(kIo) when it cannot be read.
Layout load_layout_file(const std::string& path);

// The layouts compiled into the library, sorted by name.
std::vector<std::string> builtin_layout_names();
bool has_builtin_layout(const std::string& name);
// Throws Error(kInvalidArgument) listing the known names when there is no such layout.
Layout builtin_layout(const std::string& name);

// A built-in name, or else a path to a JSON file ("resnet50", "my_model.json").
Layout resolve_layout(const std::string& name_or_path);

}  // namespace renaissance
