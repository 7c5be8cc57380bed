// Task's access to the arena's tensors from the host: weights, gradients (fp32 or model-dtype
// encodings), the optimizer state (through the state slice of a sharded rank), the model copy,
// and the synthetic gradients and weights of tests and benchmarks.
#include "renaissance/task.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/math/precision.h"
#include "renaissance/math/update_rules.h"

namespace renaissance {
namespace {

// The host API passes one encoding per uint16_t; in the arena an encoding takes its precision's
// bytes (math/precision.h's store_encoding / load_encoding: a 1-byte one is the low byte).
void upload_encodings(Backend& backend, uint64_t offset, const uint16_t* src, uint64_t count, Precision p) {
  if (count == 0) return;
  if (precision_bytes(p) == sizeof(uint16_t)) return backend.upload(offset, src, count * sizeof(uint16_t));
  std::vector<char> bytes(count * precision_bytes(p));
  for (uint64_t i = 0; i < count; ++i) math::store_encoding(p, bytes.data(), i, src[i]);
  backend.upload(offset, bytes.data(), bytes.size());
}
void download_encodings(Backend& backend, uint64_t offset, uint16_t* dst, uint64_t count, Precision p) {
  if (count == 0) return;
  if (precision_bytes(p) == sizeof(uint16_t)) return backend.download(offset, dst, count * sizeof(uint16_t));
  std::vector<char> bytes(count * precision_bytes(p));
  backend.download(offset, bytes.data(), bytes.size());
  for (uint64_t i = 0; i < count; ++i) dst[i] = math::load_encoding(p, bytes.data(), i);
}

}  // namespace

size_t Task::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return i;
  }
  throw_invalid("no parameter named '" + name + "'");
}

float* Task::weight(size_t id) {
  require_compiled("weight()");
  return reinterpret_cast<float*>(static_cast<char*>(backend_->arena()) + plan_.tensor_offset(Family::kW, id));
}

float* Task::grad(size_t id) {
  require_compiled("grad()");
  if (grad_dtype() != Precision::kFp32) {
    throw_invalid("grad(): the gradients are held in the model dtype (" + std::string(precision_name(grad_dtype())) +
                  "); use grad_data()");
  }
  return static_cast<float*>(grad_data(id));
}

void* Task::grad_data(size_t id) {
  require_compiled("grad_data()");
  return static_cast<char*>(backend_->arena()) + plan_.tensor_offset(Family::kG, id);
}

Precision Task::grad_dtype() const {
  return gradient_precision(options_.precision);
}

uint16_t Task::round_to_grad_dtype(float value) const {
  return math::f32_to_encoded_rne(grad_dtype(), value);
}

void Task::write_grad_encoded(size_t id, const uint16_t* src) {
  require_compiled("write_grad_encoded()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  if (grad_dtype() == Precision::kFp32) throw_invalid("write_grad_encoded(): the gradients are fp32 (use write)");
  const uint64_t count = static_cast<uint64_t>(plan_.tensor(id).numel);
  upload_encodings(*backend_, plan_.tensor_offset(Family::kG, id), src, count, grad_dtype());
}

void Task::read_grad_encoded(size_t id, uint16_t* dst) {
  require_compiled("read_grad_encoded()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  if (grad_dtype() == Precision::kFp32) throw_invalid("read_grad_encoded(): the gradients are fp32 (use read)");
  const uint64_t count = static_cast<uint64_t>(plan_.tensor(id).numel);
  download_encodings(*backend_, plan_.tensor_offset(Family::kG, id), dst, count, grad_dtype());
}

void Task::write(Family family, size_t id, const float* src) {
  require_compiled("write()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  const uint64_t count = family_info(family).extent == FamilyExtent::kPerTensor ? 1 : static_cast<uint64_t>(plan_.tensor(id).numel);
  if (count == 0) return;
  if (family_info(family).optimizer_state) {
    return write_state_part(family, id, 0, count, src);
  }
  if (family == Family::kG && grad_dtype() != Precision::kFp32) {
    // Model-dtype gradients: each float rounded to nearest even in the model dtype.
    std::vector<uint16_t> h(count);
    for (uint64_t i = 0; i < count; ++i) h[i] = round_to_grad_dtype(src[i]);
    return write_grad_encoded(id, h.data());
  }
  backend_->upload(plan_.tensor_offset(family, id), src, count * sizeof(float));
  if (family == Family::kW) refresh_model_copy(id);
}

// The copy of freshly written masters: rounded to nearest even on the host (math/precision.h).
void Task::refresh_model_copy(size_t id) {
  if (!plan_.has_model_copy()) return;
  const size_t n = static_cast<size_t>(plan_.tensor(id).numel);
  std::vector<float> w(n);
  std::vector<uint16_t> c(n);
  read(Family::kW, id, w.data());
  const Precision p = options_.precision.precision;
  for (size_t i = 0; i < n; ++i) c[i] = math::f32_to_encoded_rne(p, w[i]);
  upload_encodings(*backend_, plan_.model_copy_offset(id), c.data(), n, p);
}

void Task::read_model_copy(size_t id, uint16_t* dst) {
  require_compiled("read_model_copy()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  if (!plan_.has_model_copy()) throw_invalid("read_model_copy(): the task has no model copy (precision fp32)");
  const uint64_t count = static_cast<uint64_t>(plan_.tensor(id).numel);
  download_encodings(*backend_, plan_.model_copy_offset(id), dst, count, options_.precision.precision);
}

void Task::read(Family family, size_t id, float* dst) {
  require_compiled("read()");
  if (id >= params_.size()) throw_invalid("parameter id " + std::to_string(id) + " is out of range");
  const uint64_t count = family_info(family).extent == FamilyExtent::kPerTensor ? 1 : static_cast<uint64_t>(plan_.tensor(id).numel);
  if (count == 0) return;
  if (family_info(family).optimizer_state &&
      !plan_.holds_state(plan_.tensor(id).offset_in_family, count)) {
    throw_invalid(std::string("read(") + family_name(family) + ", '" + params_[id].name + "'): the tensor lies outside "
                  "the slice [" + std::to_string(plan_.state_begin()) + ", " + std::to_string(plan_.state_end()) +
                  ") of the optimizer state this rank holds; ShardedStep::read_state gathers it");
  }
  if (family == Family::kG && grad_dtype() != Precision::kFp32) {
    // Model-dtype gradients widen exactly (math/precision.h).
    std::vector<uint16_t> h(count);
    read_grad_encoded(id, h.data());
    for (uint64_t i = 0; i < count; ++i) dst[i] = math::encoded_to_f32(grad_dtype(), h[i]);
    return;
  }
  backend_->download(plan_.tensor_offset(family, id), dst, count * sizeof(float));
}

// Fills every tensor of `family` with math::synthetic_gradient(seed, step, id, i, amplitude) on
// the backend (no host copy); padding stays zero.
void Task::synthesize(Family family, uint64_t seed, uint64_t step, float amplitude) {
  std::vector<GradientTarget> targets;
  targets.reserve(params_.size());
  for (size_t id = 0; id < params_.size(); ++id) {
    const uint64_t count = static_cast<uint64_t>(plan_.tensor(id).numel);
    if (count > 0) {
      targets.push_back({plan_.tensor_offset(family, id), count, id,
                         family == Family::kG ? grad_dtype() : Precision::kFp32});
    }
  }
  backend_->fill_synthetic_gradients(targets, seed, step, amplitude);
  if (family == Family::kW) {
    for (size_t id = 0; id < params_.size(); ++id) refresh_model_copy(id);
  }
}

void Task::synthesize_gradients(uint64_t seed, uint64_t step, float amplitude) {
  require_compiled("synthesize_gradients()");
  synthesize(Family::kG, seed, step, amplitude);
}

void Task::synthesize_weights(uint64_t seed, uint64_t step, float amplitude) {
  require_compiled("synthesize_weights()");
  // The gradient generator aimed at W: the same counter-based values, produced on the backend.
  synthesize(Family::kW, seed, step, amplitude);
}

void Task::poison_gradient(size_t id, uint64_t index, float value) {
  require_compiled("poison_gradient()");
  const uint64_t numel = static_cast<uint64_t>(param(id).numel());
  if (index >= numel) {
    throw_invalid("poison_gradient(): index " + std::to_string(index) + " is outside parameter '" + param(id).name +
                  "' (" + std::to_string(numel) + " elements)");
  }
  if (grad_dtype() != Precision::kFp32) {
    const uint16_t h = round_to_grad_dtype(value);
    return upload_encodings(*backend_, plan_.tensor_offset(Family::kG, id) + index * precision_bytes(grad_dtype()), &h,
                            1, grad_dtype());
  }
  backend_->upload(plan_.tensor_offset(Family::kG, id) + index * sizeof(float), &value, sizeof(value));
}

}  // namespace renaissance
