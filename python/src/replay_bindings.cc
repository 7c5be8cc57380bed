// renaissance._core's replay helpers, for renaissance.torch.Recorder (python/renaissance/recorder.py)
// and format-2 replay cases (docs/replay-format.md): the multi-group fingerprint (defined once in
// the core), a task's optimizer configuration and state as the core holds them, and the core's
// atomic safetensors writer. Registered from NB_MODULE (module.cc) through
// renaissance_register_replay.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/fingerprint.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/kinds.h"
#include "renaissance/precision.h"
#include "renaissance/safetensors.h"
#include "renaissance/task.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace renaissance {

// Defined in module.cc next to its PyTask: the core Task of a renaissance._core.Task object and a
// host copy (numpy float32) of one of its tensors.
Task& py_task_of(nb::handle task);
nb::ndarray<nb::numpy, float> py_task_read(nb::handle task, Family family, nb::handle which);

}  // namespace renaissance

namespace renaissance {
namespace {

Family replay_family(const std::string& name) {
  if (name == "W") return Family::kW;
  if (name == "G") return Family::kG;
  if (name == "M") return Family::kM;
  if (name == "V") return Family::kV;
  throw_invalid("family '" + name + "': expected W, G, M or V");
}

// The optimizer configuration in replay case.json's keys (exact doubles: Python's json writes
// them back bit for bit).
nb::dict task_config(nb::handle task, int group) {
  const OptimizerConfig& c = py_task_of(task).group_config(group);
  nb::dict d;
  d["kind"] = optimizer_kind_name(c.kind);
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.number != nullptr) d[row.name] = c.*row.number;
  }
  d["weight_decay_mode"] = c.weight_decay_mode == WeightDecayMode::kL2 ? "l2" : "decoupled";
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.flag_field != nullptr) d[row.name] = c.*row.flag_field;
  }
  return d;
}

using HostArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

// The numpy dtypes of the table's encodings' sizes, 1 or 2 bytes ("uint16", or "uint8 or uint16"), for messages.
std::string unsigned_names_text() {
  std::string text;
  for (size_t bytes : {1u, 2u}) {
    bool any = false;
    for (const PrecisionRow& row : kPrecisionRows) any = any || (row.value != Precision::kFp32 && row.bytes == bytes);
    if (any) text += std::string(text.empty() ? "" : " or ") + "uint" + std::to_string(8 * bytes);
  }
  return text;
}

// float32 arrays are written as F32; unsigned-integer arrays (encodings: a model copy, model-dtype
// gradients) need their dtype in `dtypes` under their name: the safetensors dtype of a precision.h
// row whose bytes are the array's item size (uint16: BF16 or F16).
std::string encoding_dtypes_text(size_t bytes) {
  std::string text;
  for (const PrecisionRow& row : kPrecisionRows) {
    if (row.value == Precision::kFp32 || row.bytes != bytes) continue;
    text += std::string(text.empty() ? "" : " or ") + row.safetensors;
  }
  return text;
}

void py_write_safetensors(const std::string& path, const std::vector<std::pair<std::string, HostArray>>& tensors,
                          const std::map<std::string, std::string>& metadata,
                          const std::map<std::string, std::string>& dtypes) {
  std::vector<StTensorView> views;
  for (const auto& [name, a] : tensors) {
    std::vector<int64_t> shape;
    for (size_t d = 0; d < a.ndim(); ++d) shape.push_back(static_cast<int64_t>(a.shape(d)));
    const auto named = dtypes.find(name);
    StDtype dt = StDtype::kF32;
    if (a.dtype() == nb::dtype<float>()) {
      if (named != dtypes.end() && named->second != "F32")
        throw_invalid("_write_safetensors: '" + name + "' is float32 but named " + named->second);
    } else if (a.dtype().code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) && a.dtype().lanes == 1 &&
               !encoding_dtypes_text(a.dtype().bits / 8).empty()) {
      const size_t bytes = a.dtype().bits / 8;
      const PrecisionRow* row = nullptr;
      for (const PrecisionRow& r : kPrecisionRows) {
        if (r.value != Precision::kFp32 && r.bytes == bytes && named != dtypes.end() && named->second == r.safetensors)
          row = &r;
      }
      if (row == nullptr)
        throw_invalid("_write_safetensors: '" + name + "' holds uint" + std::to_string(8 * bytes) +
                      " encodings: its dtype (" + encoding_dtypes_text(bytes) + ") must be given");
      dt = st_dtype_of(row->value);
    } else {
      throw_invalid("_write_safetensors: '" + name + "' must be float32 or " + unsigned_names_text());
    }
    views.push_back({name, dt, shape, a.data()});
  }
  nb::gil_scoped_release release;
  write_safetensors(path, views, metadata);
}

}  // namespace
}  // namespace renaissance

void renaissance_register_replay(nb::module_& m) {
  using namespace renaissance;
  m.def("combine_fingerprints", &combine_fingerprints, "fingerprints"_a,
        "The fingerprint of several tasks (one per parameter group): one group's own, unchanged; several: XXH3-64 "
        "of the 16-hex fingerprints joined by newlines (renaissance/fingerprint.h).");
  m.def("_task_config", &task_config, "task"_a, "group"_a = 0,
        "The task's optimizer configuration (of one hyperparameter group) as replay case.json keys.");
  m.def("_task_families", [](nb::handle task) {
          const Task& t = py_task_of(task);
          std::vector<std::string> f;
          for (const char* n : {"M", "V"}) {
            if (t.compiled() && t.plan().has_family(replay_family(n))) f.push_back(n);
          }
          return f;
        }, "task"_a, "The state families (M, V) the task's kind keeps.");
  m.def("_task_read", [](nb::handle task, const std::string& family, nb::handle which) {
          return py_task_read(task, replay_family(family), which);
        }, "task"_a, "family"_a, "param"_a, "A host copy (numpy float32) of one tensor of family W, G, M or V.");
  m.def("_write_safetensors", &py_write_safetensors, "path"_a, "tensors"_a, "metadata"_a,
        "dtypes"_a = std::map<std::string, std::string>(),
        "Writes (name, array) pairs as safetensors, atomically (the core's writer): float32 as F32, encodings "
        "(uint16; uint8 for a 1-byte encoding) as the precision table's dtype that `dtypes` names (BF16, F16, ...).");
}
