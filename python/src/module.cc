// renaissance._core: the Task-level C++ API on numpy arrays (nanobind). python/renaissance
// re-exports it; docs/python.md describes it. Arrays must be float32, C-contiguous, on the host
// and of the parameter's exact shape: anything else raises before the task is touched, so a
// failed call never changes weights, state or counters (no silent dtype conversion either: a
// float64 array would round, and the library's promise is bits).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/kinds.h"
#include "renaissance/layout.h"
#include "renaissance/math/precision.h"
#include "renaissance/optimizer.h"
#include "renaissance/precision.h"
#include "renaissance/replay.h"
#include "renaissance/scalars.h"
#include "renaissance/task.h"
#include "tools/program_env.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace renaissance {

// The keywords a kind reads (tables.cc, where the kind table's dicts list them too).
std::vector<std::string> family_hyperparameters(const KindInfo& k);
// A dict of (key, value) pairs, in the order given (tables.cc).
nb::dict dict_of(std::initializer_list<std::pair<const char*, nb::object>> items);

// An optimizer-state family by name (M, V, VMAX: kFamilyTable's optimizer_state rows), for
// set_state and the sharded step's read_state (torch_dist.cc); `what` names the caller.
Family optimizer_state_family(const std::string& name, const char* what) {
  Family f;
  if (!parse_family(name.c_str(), &f) || !family_info(f).optimizer_state) {
    throw_invalid(std::string(what) + ": family '" + name + "': expected M, V or VMAX");
  }
  return f;
}

namespace {

using PyParam = std::tuple<std::string, std::vector<int64_t>, std::string>;

// The CPU backend's thread count, taken as a 64-bit int so that a value out of int's range is
// this ValueError rather than nanobind's signature mismatch.
int checked_threads(int64_t threads) {
  if (threads < 0 || threads > INT32_MAX) {
    throw_invalid("threads " + std::to_string(threads) + ": must be in [0, 2**31) (0: all cores)");
  }
  return static_cast<int>(threads);
}

// The table's flags a kind reads, joined for messages (", maximize", ", maximize, amsgrad").
std::string flag_names(OptimizerKind kind) {
  std::string s;
  for (const HyperparameterInfo& row : kHyperparameterTable) {
    if (row.flag_field != nullptr && kind_reads(kind, row)) s += std::string(", ") + row.name;
  }
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

BackendKind parse_backend(const std::string& name) {
  BackendKind b;
  if (!parse_backend_kind(name, &b)) throw_invalid("backend '" + name + "': expected cpu, cuda or auto");
  return b;
}

std::vector<ParamSpec> to_specs(const std::vector<PyParam>& params) {
  std::vector<ParamSpec> specs;
  for (const PyParam& p : params) {
    ParamSpec s;
    s.name = std::get<0>(p);
    s.shape = std::get<1>(p);
    if (!parse_role(std::get<2>(p).c_str(), &s.role))
      throw_invalid("parameter '" + s.name + "': unknown role '" + std::get<2>(p) + "'");
    specs.push_back(std::move(s));
  }
  return specs;
}

nb::list from_specs(const std::vector<ParamSpec>& specs) {
  nb::list out;
  for (const ParamSpec& s : specs) out.append(nb::make_tuple(s.name, nb::tuple(nb::cast(s.shape)), role_name(s.role)));
  return out;
}

// A fresh numpy float32 array that owns a copy of `data`.
nb::ndarray<nb::numpy, float> numpy_from(std::vector<float> data, const std::vector<int64_t>& shape) {
  auto* owned = new std::vector<float>(std::move(data));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  std::vector<size_t> dims(shape.begin(), shape.end());
  return nb::ndarray<nb::numpy, float>(owned->data(), dims.size(), dims.data(), owner);
}

class PyTask {
 public:
  // `groups`: each parameter's hyperparameter group (ParamSpec::hyper_group); empty: all 0.
  // `precision` "fp32" | "bf16" | "fp16", `rounding` "nearest" | "stochastic", `seed` and
  // `model_dtype_gradients`: TaskOptions::precision (renaissance/precision.h); compile() refuses
  // the combinations the core does not take (stochastic or model-dtype gradients with fp32).
  PyTask(const std::vector<PyParam>& params, const std::string& backend, int64_t threads, bool check_finite,
         const std::vector<int>& groups, bool tensor_mask, const std::string& precision, const std::string& rounding,
         uint64_t seed, bool model_dtype_gradients, const std::vector<int>& state_shard, bool gradient_table) {
    TaskOptions o;
    o.backend = parse_backend(backend);
    o.backend_options.threads = checked_threads(threads);
    // The CPU backend's switches from RENAISSANCE_CPU_* (tools/program_env.h), as for the CLI.
    o.backend_options.cpu = program_env::cpu_tuning_for(o.backend);
    o.check_finite = check_finite;
    o.tensor_mask = tensor_mask;
    o.gradient_table = gradient_table;
    if (!parse_precision(precision, &o.precision.precision))
      throw_invalid("precision '" + precision + "': expected fp32, bf16 or fp16");
    if (rounding == "nearest") o.precision.rounding = Rounding::kNearest;
    else if (rounding == "stochastic") o.precision.rounding = Rounding::kStochastic;
    else throw_invalid("rounding '" + rounding + "': expected nearest or stochastic");
    o.precision.seed = seed;
    o.precision.model_dtype_gradients = model_dtype_gradients;
    // TaskOptions::state_shard: {rank, K} holds M and V for that rank's slice only (a task under
    // a process group, python/renaissance/_torch_dist.py); empty: whole.
    if (!state_shard.empty()) {
      if (state_shard.size() != 2) throw_invalid("state_shard: expected (rank, world_size)");
      o.state_shard.rank = state_shard[0];
      o.state_shard.world_size = state_shard[1];
    }
    std::vector<ParamSpec> specs = to_specs(params);
    if (!groups.empty()) {
      if (groups.size() != specs.size()) {
        throw_invalid("groups: " + std::to_string(groups.size()) + " entries for " + std::to_string(specs.size()) +
                      " parameters");
      }
      for (size_t i = 0; i < specs.size(); ++i) specs[i].hyper_group = groups[i];
    }
    precision_ = o.precision;
    task_ = std::make_unique<Task>(std::move(specs), o);
  }

  void optimizer(const std::string& kind_name, const nb::kwargs& hyper) { task_->optimizer(config_of(kind_name, hyper)); }

  // One configuration per hyperparameter group (Task::optimizer_groups), each a dict of keywords.
  void optimizer_groups(const std::string& kind_name, const std::vector<nb::dict>& hypers) {
    std::vector<OptimizerConfig> configs;
    for (const nb::dict& h : hypers) configs.push_back(config_of(kind_name, h));
    task_->optimizer_groups(configs);
  }

  void set_group_hyper(int group, const std::string& kind_name, const nb::kwargs& hyper) {
    task_->set_group_hyper(group, config_of(kind_name, hyper));
  }

  // Builds the whole configuration first, so that a bad keyword leaves the task as it was.
  OptimizerConfig config_of(const std::string& kind_name, const nb::dict& hyper) {
    OptimizerKind kind;
    if (!parse_optimizer_kind(kind_name, &kind))
      throw_invalid("unknown optimizer kind '" + kind_name + "' (known: " + optimizer_kind_names() + ")");
    const KindInfo& info = kind_info(kind);
    const std::vector<std::string> allowed = family_hyperparameters(info);
    OptimizerConfig c = default_config(kind);
    for (auto [key, value] : hyper) {
      const std::string name = nb::cast<std::string>(key);
      const HyperparameterInfo* row = find_hyperparameter(name);
      if (row != nullptr && row->flag_field != nullptr && kind_reads(kind, *row)) {  // a bool (torch's maximize)
        if (!nb::isinstance<nb::bool_>(value)) {
          throw nb::type_error(("optimizer(): " + name + " must be True or False").c_str());
        }
        c.*row->flag_field = nb::cast<bool>(value);
        continue;
      }
      bool ok = false;
      for (const std::string& a : allowed) ok = ok || a == name;
      if (!ok) {
        throw nb::type_error(("optimizer('" + kind_name + "'): unexpected keyword '" + name +
                              "' (this kind reads: " + join(allowed) + flag_names(kind) + ")").c_str());
      }
      if (name == "weight_decay_mode") {
        const std::string mode = nb::cast<std::string>(value);
        if (mode == "decoupled") c.weight_decay_mode = WeightDecayMode::kDecoupled;
        else if (mode == "l2") c.weight_decay_mode = WeightDecayMode::kL2;
        else throw_invalid("weight_decay_mode '" + mode + "': expected 'decoupled' or 'l2'");
        continue;
      }
      if (!nb::isinstance<nb::float_>(value) && !nb::isinstance<nb::int_>(value))
        throw nb::type_error(("optimizer(): " + name + " must be a number").c_str());
      const double v = nb::cast<double>(value);
      check_hyperparameter(name.c_str(), v);
      c.*row->number = v;
    }
    c.validate();
    return c;
  }

  size_t id_of(const nb::handle& which) const {
    if (nb::isinstance<nb::str>(which)) return task_->find(nb::cast<std::string>(which));
    if (nb::isinstance<nb::int_>(which) && !nb::isinstance<nb::bool_>(which)) {
      const int64_t i = nb::cast<int64_t>(which);
      if (i < 0 || static_cast<uint64_t>(i) >= task_->num_params())
        throw nb::index_error(("parameter index " + std::to_string(i) + " out of range (the task has " +
                               std::to_string(task_->num_params()) + ")").c_str());
      return static_cast<size_t>(i);
    }
    throw nb::type_error("a parameter is named by its index (int) or its name (str)");
  }

  // Checks dtype, device, layout and shape; returns the host pointer.
  const float* checked(size_t id, const nb::ndarray<nb::ro>& a, const char* what) const {
    const ParamSpec& p = task_->param(id);
    const std::string who = std::string(what) + "('" + p.name + "')";
    if (a.dtype() != nb::dtype<float>()) throw nb::type_error((who + ": the array must be float32").c_str());
    if (a.device_type() != nb::device::cpu::value) throw nb::type_error((who + ": the array must be on the host").c_str());
    bool same = a.ndim() == p.shape.size();
    for (size_t d = 0; same && d < a.ndim(); ++d) same = static_cast<int64_t>(a.shape(d)) == p.shape[d];
    if (!same) {
      std::string got;
      for (size_t d = 0; d < a.ndim(); ++d) got += (d ? ", " : "") + std::to_string(a.shape(d));
      std::string want;
      for (size_t d = 0; d < p.shape.size(); ++d) want += (d ? ", " : "") + std::to_string(p.shape[d]);
      throw nb::value_error((who + ": shape (" + got + ") where the parameter is (" + want + ")").c_str());
    }
    int64_t expect = 1;  // C order: strides in elements, extents of 1 may carry any stride
    for (size_t d = a.ndim(); d-- > 0;) {
      if (a.shape(d) != 1 && a.stride(d) != expect)
        throw nb::value_error((who + ": the array must be C-contiguous").c_str());
      expect *= static_cast<int64_t>(a.shape(d));
    }
    return static_cast<const float*>(a.data());
  }

  void write(Family f, const nb::handle& which, const nb::ndarray<nb::ro>& a, const char* what) {
    const size_t id = id_of(which);
    task_->write(f, id, checked(id, a, what));
  }

  nb::ndarray<nb::numpy, float> read(Family f, const nb::handle& which) {
    const size_t id = id_of(which);
    const ParamSpec& p = task_->param(id);
    std::vector<float> data(static_cast<size_t>(p.numel()));
    task_->read(f, id, data.data());
    return numpy_from(std::move(data), p.shape);
  }

  Task& task() { return *task_; }
  const PrecisionOptions& precision_options() const { return precision_; }

  // --- arena views for renaissance.torch (P) ---
  // A DLPack tensor over `count` elements at byte `offset` of the arena, on the backend's device
  // (CUDA: device `device_id`, which the caller made current when it built the task). `self`
  // owns it: the tensor keeps the task (and so the arena) alive.
  template <class T>
  nb::ndarray<nb::pytorch, T> arena_view(nb::handle self, uint64_t offset, const std::vector<int64_t>& shape,
                                         int device_id, int64_t stride = 1) {
    return nb::ndarray<nb::pytorch, T>(typed_view(self, offset, shape, device_id, sizeof(T), nb::dtype<T>(), stride));
  }

  // The DLPack dtype of an encoding of precision.h's table: torch's bfloat16 / float16 for the
  // encodings with those codecs (bf16, fp16), else an unsigned integer of the row's bytes (uint8 for
  // a 1-byte encoding), which torch takes whatever its version; renaissance.torch reinterprets it as
  // the row's torch dtype.
  static nb::dlpack::dtype encoding_dtype(Precision p) {
    const PrecisionRow& row = precision_row(p);
    nb::dlpack::dtype d;
    d.code = static_cast<uint8_t>(row.codec == Precision::kBf16   ? nb::dlpack::dtype_code::Bfloat
                                  : row.codec == Precision::kFp16 ? nb::dlpack::dtype_code::Float
                                                                  : nb::dlpack::dtype_code::UInt);
    d.bits = static_cast<uint8_t>(8 * row.bytes);
    d.lanes = 1;
    return d;
  }

  // The untyped view under arena_view: `elem` bytes per element of DLPack type `dtype`.
  nb::ndarray<nb::pytorch> typed_view(nb::handle self, uint64_t offset, const std::vector<int64_t>& shape, int device_id,
                                      size_t elem, nb::dlpack::dtype dtype, int64_t stride = 1) {
    Task& t = *task_;
    if (!t.compiled()) throw_invalid("view(): the task is not compiled; call compile() first");
    uint64_t count = 1;
    for (int64_t d : shape) count *= static_cast<uint64_t>(d);
    // A strided view (one dimension) spans (count - 1) * stride + 1 elements.
    if (stride != 1 && count > 0) count = (count - 1) * static_cast<uint64_t>(stride) + 1;
    if (offset + count * elem > t.plan().arena_bytes()) throw_invalid("view(): outside the arena");
    const bool cuda = t.backend().kind() == BackendKind::kCuda;
    std::vector<size_t> dims(shape.begin(), shape.end());
    void* data = static_cast<char*>(t.backend().arena()) + offset;
    const int64_t strides[1] = {stride};
    return nb::ndarray<nb::pytorch>(data, dims.size(), dims.data(), self, stride != 1 ? strides : nullptr, dtype,
                                    cuda ? nb::device::cuda::value : nb::device::cpu::value, cuda ? device_id : 0);
  }

  // Parameter `which` of a per-element family ("W", "G", "M", "V", "VMAX": float32; G in the model dtype when the
  // task holds model-dtype gradients), or "C", the bf16/fp16 model copy, with its shape.
  nb::ndarray<nb::pytorch> tensor_view(nb::handle self, const std::string& family, const nb::handle& which,
                                       int device_id) {
    const size_t id = id_of(which);
    if (!task_->compiled()) throw_invalid("view(): the task is not compiled; call compile() first");
    const std::vector<int64_t>& shape = task_->param(id).shape;
    if (family == "C") {
      if (!task_->plan().has_model_copy()) throw_invalid("view(): this task has no model copy (precision fp32)");
      const Precision copy = task_->plan().config().precision;
      return typed_view(self, task_->plan().model_copy_offset(id), shape, device_id, precision_bytes(copy),
                        encoding_dtype(copy));
    }
    // The per-element families of kFamilyTable (region.h), by name.
    Family f = Family::kW;
    if (!parse_family(family.c_str(), &f) || family_info(f).extent != FamilyExtent::kPerElement) {
      std::string names;
      for (const FamilyInfo& info : kFamilyTable) {
        if (info.extent == FamilyExtent::kPerElement) names += std::string(names.empty() ? "" : ", ") + info.name;
      }
      throw_invalid("view(): family '" + family + "': expected " + names + " or C");
    }
    if (!task_->plan().has_family(f)) throw_invalid("view(): this optimizer keeps no " + family);
    // A sliced task's optimizer state holds only its slice: no whole-tensor view (ShardedStep reads it).
    if (family_info(f).optimizer_state && task_->plan().state_sliced())
      throw_invalid("view(): this task holds only a slice of " + family + " (state_shard); read it through its sharded step");
    if (f == Family::kG && task_->grad_dtype() != Precision::kFp32) {
      return typed_view(self, task_->plan().tensor_offset(f, id), shape, device_id, precision_bytes(task_->grad_dtype()),
                        encoding_dtype(task_->grad_dtype()));
    }
    return typed_view(self, task_->plan().tensor_offset(f, id), shape, device_id, sizeof(float), nb::dtype<float>());
  }

  // The whole family as one flat tensor, padding included (padding is zero and stays zero under
  // zero_()): zero_grad() clears every gradient of the task with one op.
  // With model-dtype gradients G's view is in the model dtype (the encoding's bytes an element).
  nb::ndarray<nb::pytorch> family_view(nb::handle self, const std::string& family, int device_id) {
    Family f;
    if (family == "W") f = Family::kW;
    else if (family == "G") f = Family::kG;
    else throw_invalid("family_view(): family '" + family + "': expected W or G");
    if (!task_->compiled()) throw_invalid("family_view(): the task is not compiled; call compile() first");
    const Span span = task_->plan().region_range(family_region(f, static_cast<Role>(0)),
                                                 family_region(f, static_cast<Role>(kNumRoles - 1)));
    if (f == Family::kG && task_->grad_dtype() != Precision::kFp32) {
      return typed_view(self, span.offset, {static_cast<int64_t>(span.count)}, device_id,
                        precision_bytes(task_->grad_dtype()), encoding_dtype(task_->grad_dtype()));
    }
    return typed_view(self, span.offset, {static_cast<int64_t>(span.count)}, device_id, sizeof(float), nb::dtype<float>());
  }

  // Host copies of encodings: the model copy ("C") or model-dtype G, as numpy unsigned integers of
  // the encoding's bytes (uint16 for bf16 / fp16, uint8 for a 1-byte encoding), the bits as stored.
  nb::ndarray<nb::numpy> read_encoded(const std::string& family, const nb::handle& which) {
    const size_t id = id_of(which);
    const ParamSpec& p = task_->param(id);
    std::vector<uint16_t> bits(static_cast<size_t>(p.numel()));
    Precision enc = Precision::kFp32;
    if (family == "C") {
      task_->read_model_copy(id, bits.data());
      enc = task_->plan().config().precision;
    } else if (family == "G") {
      task_->read_grad_encoded(id, bits.data());
      enc = task_->grad_dtype();
    } else {
      throw_invalid("read_encoded(): family '" + family + "': expected C or G");
    }
    auto* owned = new std::vector<char>(bits.size() * precision_bytes(enc));
    nb::capsule owner(owned, [](void* q) noexcept { delete static_cast<std::vector<char>*>(q); });
    for (size_t i = 0; i < bits.size(); ++i) math::store_encoding(enc, owned->data(), i, bits[i]);
    nb::dlpack::dtype d;
    d.code = static_cast<uint8_t>(nb::dlpack::dtype_code::UInt);
    d.bits = static_cast<uint8_t>(8 * precision_bytes(enc));
    d.lanes = 1;
    std::vector<size_t> dims(p.shape.begin(), p.shape.end());
    return nb::ndarray<nb::numpy>(owned->data(), dims.size(), dims.data(), owner, nullptr, d);
  }

  // One scalar slot as a one-element tensor: "inv_loss_scale" (float32, what set_loss_scale
  // writes: float(1/scale)), "step" and "has_non_finite" (int32, the device's step state).
  nb::object scalar_view(nb::handle self, const std::string& name, int device_id) {
    if (!task_->compiled()) throw_invalid("scalar_view(): the task is not compiled; call compile() first");
    const MemoryPlan& plan = task_->plan();
    if (name == "inv_loss_scale") {
      // One slot per hyperparameter group (scalars.h: task-wide scalars sit in every block): a
      // strided view of H elements; copy_ from a one-element tensor broadcasts into all (a
      // maximizing group's blocks need -1/scale: renaissance.torch multiplies by each block's sign).
      const int64_t h = task_->plan().scalar_blocks();  // H, or one block per tensor (tensor_mask)
      return nb::cast(arena_view<float>(self, plan.region(S_SCALAR_FP32).offset + kInvLossScale * sizeof(float), {h},
                                        device_id, kNumScalarF32));
    }
    if (name == "step")
      return nb::cast(arena_view<int32_t>(self, plan.region(S_SCALAR_INT32).offset + kStep * sizeof(int32_t), {1}, device_id));
    if (name == "has_non_finite")
      return nb::cast(arena_view<int32_t>(self, plan.region(S_SCALAR_INT32).offset + kHasNonFinite * sizeof(int32_t), {1}, device_id));
    if (name == "tensor_mask") {
      // TaskOptions::tensor_mask: the int32 per parameter the step reads (nonzero: skip it). Who
      // writes through the view says what it wrote with tensor_mask_written (Task::tensor_mask
      // is not called: the task would then assume a set mask and run the masked program).
      if (!plan.config().tensor_mask) throw_invalid("scalar_view('tensor_mask'): the task was built without tensor_mask");
      return nb::cast(arena_view<int32_t>(self, plan.region(S_TENSOR_INT32).offset,
                                          {static_cast<int64_t>(task_->num_params())}, device_id));
    }
    if (name == "gradient_table") {
      // TaskOptions::gradient_table: the address per parameter the step reads its gradient from,
      // as int64 (torch has no uint64 through DLPack; addresses are below 2^63).
      if (!plan.config().gradient_table) throw_invalid("scalar_view('gradient_table'): the task was built without gradient_table");
      return nb::cast(arena_view<int64_t>(self, plan.region(S_GRAD_TABLE).offset,
                                          {static_cast<int64_t>(task_->num_params())}, device_id));
    }
    throw_invalid("scalar_view(): unknown slot '" + name + "' (inv_loss_scale, step, has_non_finite, tensor_mask, gradient_table)");
  }

  // Sets the applied-step count t (a torch state_dict's `step`). The bias corrections need no
  // write: every applied step forms them from t+1 before its update (ADVANCE_STEP runs first).
  void set_step_count(int64_t t) {
    if (!task_->compiled()) throw_invalid("set_step_count(): the task is not compiled; call compile() first");
    if (t < 0 || t > INT32_MAX) throw_invalid("set_step_count(): " + std::to_string(t) + " is out of range");
    const int32_t v = static_cast<int32_t>(t);
    task_->backend().upload(task_->plan().region(S_SCALAR_INT32).offset + kStep * sizeof(int32_t), &v, sizeof(v));
  }

 private:
  std::unique_ptr<Task> task_;
  PrecisionOptions precision_;
};

nb::list comparisons(const std::vector<TensorComparison>& cmp, double tolerance, bool* all_ok) {
  nb::list out;
  for (const TensorComparison& c : cmp) {
    const bool ok = c.rel_l2 <= tolerance;  // NaN fails, as in `renaissance replay`
    *all_ok = *all_ok && ok;
    out.append(dict_of({{"name", nb::cast(c.name)}, {"numel", nb::cast(c.numel)}, {"rel_l2", nb::cast(c.rel_l2)},
                        {"max_abs", nb::cast(c.max_abs)}, {"finite", nb::cast(c.finite)}, {"passed", nb::cast(ok)}}));
  }
  return out;
}

// `renaissance replay CASE` as a function: runs the case and compares with expected.safetensors.
// tolerance None: the case's own (case.json's `tolerance`), else 1e-6.
nb::dict replay(const std::string& case_dir, const std::string& backend, int64_t threads,
                std::optional<double> requested) {
  if (requested && !(*requested >= 0.0)) throw_invalid("tolerance " + std::to_string(*requested) + ": must be >= 0");
  TaskOptions o;
  o.backend = parse_backend(backend);
  o.backend_options.threads = checked_threads(threads);
  const ReplayCase rc = load_replay_case(case_dir);
  const double tolerance = replay_tolerance(rc, requested ? *requested : -1.0);
  o.backend_options.cpu = program_env::cpu_tuning_for(o.backend);  // RENAISSANCE_CPU_*
  ReplayResult r;
  {
    nb::gil_scoped_release release;
    r = run_replay(rc, o);
  }
  // "kind": the first group's in format 2.
  nb::dict d = dict_of({{"name", nb::cast(rc.name)}, {"kind", nb::cast(optimizer_kind_name(rc.groups.front().config.kind))},
                        {"steps", nb::cast(rc.steps)}, {"steps_applied", nb::cast(r.steps_applied)},
                        {"steps_skipped", nb::cast(r.steps_skipped)}, {"backend", nb::cast(r.backend)},
                        {"fingerprint", nb::cast(r.fingerprint)}, {"tolerance", nb::cast(tolerance)}});
  bool ok = true;
  d["tensors"] = comparisons(compare_replay(rc, r), tolerance, &ok);
  // None when the case has no expected.safetensors: nothing was compared.
  d["passed"] = rc.has_expected ? nb::object(nb::bool_(ok)) : nb::none();
  // Each parameter's final applied-step count (per-tensor where the case masks), and the
  // ones that differ from case.json's expected_tensor_steps (empty: all match, or none given).
  nb::dict steps;
  for (size_t id = 0; id < rc.params.size(); ++id) steps[rc.params[id].name.c_str()] = r.tensor_steps[id];
  d["tensor_steps"] = steps;
  d["tensor_step_mismatches"] = nb::cast(tensor_step_mismatches(rc, r));
  return d;
}

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    switch (e.kind()) {
      case ErrorKind::kInvalidArgument:
      case ErrorKind::kFormat: PyErr_SetString(PyExc_ValueError, e.what()); break;
      case ErrorKind::kIo: PyErr_SetString(PyExc_OSError, e.what()); break;
      case ErrorKind::kBackend: PyErr_SetString(PyExc_RuntimeError, e.what()); break;
    }
  }
}

}  // namespace

namespace {
// `task` as the PyTask it must be, or a TypeError naming what it is.
PyTask& checked_py_task(nb::handle task) {
  if (!nb::isinstance<PyTask>(task)) {
    throw nb::type_error(("expected a renaissance._core.Task, got " + std::string(nb::type_name(task.type()).c_str())).c_str());
  }
  return nb::cast<PyTask&>(task);
}
}  // namespace

// The core Task of a renaissance._core.Task object, and a host copy of one of its tensors (for
// torch_dist.cc and replay_bindings.cc).
Task& py_task_of(nb::handle task) { return checked_py_task(task).task(); }
nb::ndarray<nb::numpy, float> py_task_read(nb::handle task, Family family, nb::handle which) {
  return checked_py_task(task).read(family, which);
}

}  // namespace renaissance

NB_MODULE(_core, m) {
  using namespace renaissance;
  m.doc() = "Renaissance fused optimizers: the Task API on numpy float32 arrays (docs/python.md)";
  m.attr("__version__") = RENAISSANCE_VERSION;
  m.attr("with_cuda") = bool(RENAISSANCE_WITH_CUDA);
  nb::register_exception_translator(translate);
  // A Task lives as long as any arena view torch holds (param.data, .grad, optimizer state), and
  // torch does not free every tensor before interpreter exit: the Tasks still alive then are
  // owned, not leaked, so nanobind's shutdown leak report would only alarm users.
  nb::set_leak_warnings(false);
  void renaissance_register_replay(nanobind::module_&); renaissance_register_replay(m);  // replay (R): replay_bindings.cc
  void renaissance_register_dist(nanobind::module_&); renaissance_register_dist(m);  // torch.distributed (T): torch_dist.cc
  void renaissance_register_tables(nanobind::module_&); renaissance_register_tables(m);  // kinds(), hyperparameters(): tables.cc

  m.def("layouts", &builtin_layout_names, "The names of the model layouts compiled into the library.");
  m.def("layout", [](const std::string& name_or_path) { return from_specs(resolve_layout(name_or_path).params); },
        "name_or_path"_a, "A layout's parameters as (name, shape, role) tuples: a built-in name or a JSON file.");
  m.def("precisions", [] {
          std::vector<nb::dict> rows;
          for (const PrecisionRow& row : kPrecisionRows) {
            nb::dict d;
            d["name"] = row.name;
            d["bytes"] = row.bytes;
            d["torch_dtype"] = row.torch_dtype;
            d["safetensors"] = row.safetensors;
            rows.push_back(d);
          }
          return rows;
        },
        "The precision table (renaissance/precision.h), one dict per row in its order: name (\"bf16\"), bytes "
        "(of one element), torch_dtype (torch's dtype name) and safetensors (the file's dtype string).");
  m.def("replay", &replay, "case_dir"_a, "backend"_a = "cpu", "threads"_a = 0, "tolerance"_a = nb::none(),
        "Runs a replay case (docs/replay-format.md) and compares it with its expected tensors.");

  nb::class_<PyTask>(m, "Task")
      .def(nb::init<const std::vector<PyParam>&, const std::string&, int64_t, bool, const std::vector<int>&, bool,
                    const std::string&, const std::string&, uint64_t, bool, const std::vector<int>&, bool>(), "params"_a,
           "backend"_a = "cpu", "threads"_a = 0, "check_finite"_a = true, "groups"_a = std::vector<int>(),
           "tensor_mask"_a = false, "precision"_a = "fp32", "rounding"_a = "nearest", "seed"_a = 0,
           "model_dtype_gradients"_a = false, "state_shard"_a = std::vector<int>(), "gradient_table"_a = false)
      .def_prop_ro("arena_bytes", [](PyTask& t) { return t.task().plan().arena_bytes(); },
                   "Bytes of the task's arena (a state_shard task: M and V of its slice only).")
      .def("set_state", [](PyTask& t, const std::string& family, nb::handle w, nb::ndarray<nb::ro> a) {
             t.write(optimizer_state_family(family, "set_state()"), w, a, "set_state");
           }, "family"_a, "param"_a, "values"_a,
           "Writes one parameter's M, V or VMAX (float32, its shape); a state_shard task keeps the part in its slice.")
      .def_prop_ro("precision", [](PyTask& t) { return std::string(precision_name(t.precision_options().precision)); })
      .def_prop_ro("rounding", [](PyTask& t) { return std::string(rounding_name(t.precision_options().rounding)); })
      .def_prop_ro("seed", [](PyTask& t) { return t.precision_options().seed; })
      .def_prop_ro("grad_dtype", [](PyTask& t) {
             return std::string(t.task().compiled() ? precision_name(t.task().grad_dtype())
                                                    : t.precision_options().model_dtype_gradients
                                                          ? precision_name(t.precision_options().precision) : "fp32");
           })
      .def("get_model_copy", [](PyTask& t, nb::handle w) { return t.read_encoded("C", w); }, "param"_a,
           "A host copy of the model copy of one parameter (numpy uint16 encodings; uint8 for a 1-byte encoding).")
      .def("get_grad_encoded", [](PyTask& t, nb::handle w) { return t.read_encoded("G", w); }, "param"_a,
           "Model-dtype gradients: a host copy of one parameter's gradient encodings (numpy uint16; uint8 for a "
           "1-byte encoding).")
      .def("optimizer_groups", [](PyTask& t, const std::string& kind, const std::vector<nb::dict>& hypers) -> PyTask& {
             t.optimizer_groups(kind, hypers);
             return t;
           }, "kind"_a, "hypers"_a, nb::rv_policy::reference,
           "One configuration (a dict of keywords) per hyperparameter group (Task::optimizer_groups).")
      .def("set_group_hyper", [](PyTask& t, int group, const std::string& kind, const nb::kwargs& h) {
             t.set_group_hyper(group, kind, h);
           }, "group"_a, "kind"_a, "hyper"_a)
      .def("check_hyper", [](PyTask& t, const std::string& kind, const nb::kwargs& h) { t.config_of(kind, h); },
           "kind"_a, "hyper"_a, "Validates a configuration as set_group_hyper does, changing nothing.")
      .def("set_group_lr", [](PyTask& t, int group, double lr) { t.task().set_lr(group, lr); }, "group"_a, "lr"_a)
      .def("set_group_lrs", [](PyTask& t, const std::vector<double>& lrs) { t.task().set_group_lrs(lrs); }, "lrs"_a)
      .def_prop_ro("hyper_groups", [](PyTask& t) { return t.task().hyper_groups(); })
      .def("fingerprint_of", [](PyTask& t, const std::vector<size_t>& ids) { return t.task().fingerprint(ids); },
           "ids"_a, "The fingerprint of the tensors `ids` only, in that order (Task::fingerprint(ids)).")
      .def("optimizer", [](PyTask& t, const std::string& kind, const nb::kwargs& h) -> PyTask& {
             t.optimizer(kind, h);
             return t;
           }, "kind"_a, "hyper"_a, nb::rv_policy::reference)
      .def("compile", [](PyTask& t) { t.task().compile(); })
      .def_prop_ro("compiled", [](PyTask& t) { return t.task().compiled(); })
      .def_prop_ro("params", [](PyTask& t) {
             std::vector<ParamSpec> specs;
             for (size_t i = 0; i < t.task().num_params(); ++i) specs.push_back(t.task().param(i));
             return from_specs(specs);
           })
      .def("index", [](PyTask& t, const std::string& name) { return t.task().find(name); }, "name"_a)
      .def("set_weight", [](PyTask& t, nb::handle w, nb::ndarray<nb::ro> a) { t.write(Family::kW, w, a, "set_weight"); },
           "param"_a, "array"_a.noconvert())
      .def("set_grad", [](PyTask& t, nb::handle w, nb::ndarray<nb::ro> a) { t.write(Family::kG, w, a, "set_grad"); },
           "param"_a, "array"_a.noconvert())
      .def("get_weight", [](PyTask& t, nb::handle w) { return t.read(Family::kW, w); }, "param"_a)
      .def("get_grad", [](PyTask& t, nb::handle w) { return t.read(Family::kG, w); }, "param"_a)
      .def("set_lr", [](PyTask& t, double lr) { t.task().set_lr(lr); }, "lr"_a)
      .def("set_loss_scale", [](PyTask& t, double s) { t.task().set_loss_scale(s); }, "scale"_a)
      .def_prop_ro("lr", [](PyTask& t) { return t.task().lr(); })
      .def_prop_ro("loss_scale", [](PyTask& t) { return t.task().loss_scale(); })
      .def("step", [](PyTask& t) { t.task().step(); }, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("step_count", [](PyTask& t) { return t.task().step_count(); })
      .def_prop_ro("skipped_steps", [](PyTask& t) { return t.task().skipped_steps(); })
      .def("count_skipped_step", [](PyTask& t) { t.task().count_skipped_step(); })
      .def_prop_ro("last_step_skipped", [](PyTask& t) { return t.task().last_step_skipped(); })
      .def("fingerprint", [](PyTask& t) { return t.task().fingerprint(); })
      .def("save", [](PyTask& t, const std::string& path) { t.task().save(path); }, "path"_a)
      .def("load", [](PyTask& t, const std::string& path) { t.task().load(path); }, "path"_a)
      .def_prop_ro("backend", [](PyTask& t) { return t.task().backend().describe(); })
      // renaissance.torch (P): zero-copy views, the step count and the caller's CUDA stream.
      .def("view", [](nb::handle self, const std::string& family, nb::handle which, int device_id) {
             return nb::cast<PyTask&>(self).tensor_view(self, family, which, device_id);
           }, "family"_a, "param"_a, "device_id"_a = 0)
      .def("scalar_view", [](nb::handle self, const std::string& name, int device_id) {
             return nb::cast<PyTask&>(self).scalar_view(self, name, device_id);
           }, "name"_a, "device_id"_a = 0)
      .def("family_view", [](nb::handle self, const std::string& family, int device_id) {
             return nb::cast<PyTask&>(self).family_view(self, family, device_id);
           }, "family"_a, "device_id"_a = 0)
      .def("set_step_count", [](PyTask& t, int64_t n) { t.set_step_count(n); }, "step"_a)
      // tensor_mask: each parameter's applied-step count, and setting them (with their bias
      // corrections), e.g. from a torch state_dict whose parameters are at different steps.
      .def_prop_ro("tensor_steps", [](PyTask& t) { return t.task().tensor_steps(); })
      .def("set_tensor_steps", [](PyTask& t, const std::vector<int64_t>& s) { t.task().set_tensor_steps(s); }, "steps"_a)
      .def("tensor_mask_written", [](PyTask& t, bool any_set) { t.task().tensor_mask_written(any_set); }, "any_set"_a,
           "After writing the tensor_mask view: whether any entry is nonzero (Task::tensor_mask_written)")
      .def_prop_ro("masked_program_next", [](PyTask& t) { return t.task().masked_program_next(); })
      .def("set_stream", [](PyTask& t, uintptr_t stream) { t.task().set_launch_stream(reinterpret_cast<void*>(stream)); },
           "stream"_a, "CUDA: order each step with this cudaStream_t handle (torch's cuda_stream); 0: none");
}
