// renaissance._core's sharded step for renaissance.torch (docs/distributed.md,
// "torch.distributed"): a Communicator whose collectives are methods of a Python object
// (python/renaissance/_torch_dist.py runs them with torch.distributed on views of the buffers
// the core passes), and the core's ShardedStep over it. The core keeps the partition, the
// reduction order and the canonical norm combination; Python only moves bytes, so a torch
// process group gives the bits the MPI communicator gives.
//
// Every call arrives from Python holding the GIL (the sharded step is not run with the GIL
// released: its collectives call back into Python).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "renaissance/communicator.h"
#include "renaissance/error.h"
#include "renaissance/math/rank_reduction.h"
#include "renaissance/precision.h"
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace renaissance {

// Defined in module.cc next to its PyTask: the core Task of a renaissance._core.Task object.
Task& py_task_of(nb::handle task);
Family optimizer_state_family(const std::string& name, const char* what);  // module.cc

namespace {

uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Forwards each collective to impl's method of the same name with addresses (ints) and byte
// ranges; impl raises on failure (the exception reaches the Python caller of step()).
class PyCommunicator final : public Communicator {
 public:
  PyCommunicator(nb::object impl, int rank, int size, bool device)
      : impl_(std::move(impl)), rank_(rank), size_(size), device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return nb::cast<std::string>(impl_.attr("describe")()); }
  void all_gather_v(void* buffer, const std::vector<uint64_t>& offsets, const std::vector<uint64_t>& counts) override {
    impl_.attr("all_gather_v")(address(buffer), offsets, counts);
  }
  void all_to_all_v(const void* send, const std::vector<uint64_t>& send_offsets, const std::vector<uint64_t>& send_counts,
                    void* recv, const std::vector<uint64_t>& recv_offsets,
                    const std::vector<uint64_t>& recv_counts) override {
    impl_.attr("all_to_all_v")(address(send), send_offsets, send_counts, address(recv), recv_offsets, recv_counts);
  }
  void reduce_scatter_sum_f32(const float* send, float* recv, const std::vector<uint64_t>& counts) override {
    impl_.attr("reduce_scatter_sum_f32")(address(send), address(recv), counts);
  }
  void all_reduce_max_i32(int32_t* values, uint64_t count) override {
    impl_.attr("all_reduce_max_i32")(address(values), count);
  }
  void barrier() override { impl_.attr("barrier")(); }
  bool device_memory() const override { return device_; }
  // Host memory: the base class's memcpy. Device memory: torch copies (impl.copy).
  void copy_to_host(void* dst, const void* src, uint64_t bytes) override {
    if (!device_) return Communicator::copy_to_host(dst, src, bytes);
    if (bytes != 0) impl_.attr("copy")(address(dst), false, address(src), true, bytes);
  }
  void copy_from_host(void* dst, const void* src, uint64_t bytes) override {
    if (!device_) return Communicator::copy_from_host(dst, src, bytes);
    if (bytes != 0) impl_.attr("copy")(address(dst), true, address(src), false, bytes);
  }
  void copy(void* dst, const void* src, uint64_t bytes) override {
    if (!device_) return Communicator::copy(dst, src, bytes);
    if (bytes != 0) impl_.attr("copy")(address(dst), true, address(src), true, bytes);
  }
  // Device memory: torch's collectives and copies run on torch's streams, not the backend's.
  void wait() override {
    if (device_) impl_.attr("synchronize")();
  }
  // impl's, host memory too: impl lends views of it to torch.distributed and must know where it is.
  void* workspace(uint64_t bytes) override {
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(impl_.attr("workspace")(bytes)));
  }

 private:
  nb::object impl_;
  int rank_, size_;
  bool device_;
};

// A ShardedStep with the communicator it runs over; keeps the Python Task object (and so the
// arena) alive.
class PyShardedStep {
 public:
  PyShardedStep(nb::object task, nb::object impl, int rank, int size, const std::string& mode)
      : task_obj_(task), task_(py_task_of(task)) {
    if (size < 1 || rank < 0 || rank >= size)
      throw_invalid("sharded step: rank " + std::to_string(rank) + " of a world of " + std::to_string(size));
    GradReduce m;
    if (!parse_grad_reduce(mode, &m)) throw_invalid("grad_reduce '" + mode + "': expected replicated, ordered or fast");
    comm_ = std::make_unique<PyCommunicator>(std::move(impl), rank, size,
                                             task_.backend().kind() == BackendKind::kCuda);
    step_ = std::make_unique<ShardedStep>(task_, *comm_, m);
  }
  ShardedStep& sharded() { return *step_; }
  Task& task() { return task_; }

 private:
  nb::object task_obj_;
  Task& task_;
  std::unique_ptr<PyCommunicator> comm_;
  std::unique_ptr<ShardedStep> step_;  // after comm_: destroyed first
};

// `nbytes` bytes at `ptr` as a flat uint8 torch tensor (device_id < 0: host memory, else that
// CUDA device) that owns nothing: valid only during the collective that received `ptr`.
nb::ndarray<nb::pytorch, uint8_t> raw_view(uintptr_t ptr, uint64_t nbytes, int device_id) {
  const size_t dims[1] = {static_cast<size_t>(nbytes)};
  const bool cuda = device_id >= 0;
  return nb::ndarray<nb::pytorch, uint8_t>(reinterpret_cast<void*>(ptr), 1, dims, nb::handle(), nullptr,
                                           nb::dtype<uint8_t>(), cuda ? nb::device::cuda::value : nb::device::cpu::value,
                                           cuda ? device_id : 0);
}

// grad_reduce="ordered"'s gradient of one parameter from its K ranks' gradients (host arrays of
// the same length: float32, or the encodings of a model-dtype gradient as unsigned integers of the
// encoding's bytes, uint16 for bf16 / fp16): the core's own
// math::rank_reduce_element, as Backend::reduce_ranks runs it (the rank-order fp32 sum divided by
// K, stored in the gradient's encoding). renaissance.torch.Recorder records it under a process group.
nb::object rank_order_mean(const std::vector<nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>>& ranks,
                             const std::string& precision) {
  Precision dtype;
  if (!parse_precision(precision, &dtype)) throw_invalid("ordered_rank_mean: precision '" + precision + "'");
  if (ranks.empty()) throw_invalid("ordered_rank_mean: no rank's gradient");
  const bool f32 = dtype == Precision::kFp32;
  const size_t elem = precision_bytes(dtype);
  const size_t n = ranks[0].size();
  std::vector<char> blocks(ranks.size() * n * elem);
  // An encoding travels as the unsigned integer of its bytes (uint16; uint8 for a 1-byte one).
  nb::dlpack::dtype encoded;
  encoded.code = static_cast<uint8_t>(nb::dlpack::dtype_code::UInt);
  encoded.bits = static_cast<uint8_t>(8 * elem);
  encoded.lanes = 1;
  const nb::dlpack::dtype want = f32 ? nb::dtype<float>() : encoded;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].size() != n || ranks[r].dtype() != want) {
      throw_invalid("ordered_rank_mean: every rank's gradient must hold " + std::to_string(n) + " " +
                    (f32 ? std::string("float32 values") : "uint" + std::to_string(8 * elem) + " encodings"));
    }
    if (n > 0) std::memcpy(blocks.data() + r * n * elem, ranks[r].data(), n * elem);
  }
  auto* out = new std::vector<char>(n * elem);
  nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<char>*>(p); });
  math::RankReduce op;
  op.blocks = blocks.data();
  op.stride = n;
  op.count = n;
  op.summands = static_cast<int>(ranks.size());
  op.divisor = static_cast<int>(ranks.size());
  op.in = op.out = dtype;
  op.dst = out->data();
  for (uint64_t i = 0; i < n; ++i) math::rank_reduce_element(op, i);
  const size_t dims[1] = {n};
  if (f32) return nb::cast(nb::ndarray<nb::numpy, float>(reinterpret_cast<float*>(out->data()), 1, dims, owner));
  return nb::cast(nb::ndarray<nb::numpy>(out->data(), 1, dims, owner, nullptr, encoded));
}

}  // namespace
}  // namespace renaissance

void renaissance_register_dist(nb::module_& m) {
  using namespace renaissance;
  // rv_policy::reference: without an owner nanobind would otherwise hand torch a copy.
  m.def("_raw_view", &raw_view, "ptr"_a, "nbytes"_a, "device_id"_a, nb::rv_policy::reference,
        "A non-owning uint8 torch view of nbytes at ptr (device_id < 0: host): for a Communicator's collectives.");
  m.def("_ordered_rank_mean", &rank_order_mean, "ranks"_a, "precision"_a,
        "grad_reduce='ordered''s gradient of one parameter from each rank's (flat host arrays: float32, or the "
        "encodings as uint16, uint8 for a 1-byte encoding), by the core's math/rank_reduction.h.");
  nb::class_<PyShardedStep>(m, "_ShardedStep")
      .def(nb::init<nb::object, nb::object, int, int, const std::string&>(), "task"_a, "comm"_a, "rank"_a, "size"_a,
           "grad_reduce"_a)
      .def("step", [](PyShardedStep& s) { s.sharded().step(); })
      .def("gather_state", [](PyShardedStep& s) { s.sharded().gather_state(); })
      .def("fingerprint", [](PyShardedStep& s) { return s.sharded().fingerprint(); })
      .def("fingerprint_of", [](PyShardedStep& s, const std::vector<size_t>& ids) { return s.sharded().fingerprint(ids); },
           "ids"_a, "The fingerprint of the tensors `ids` only, in that order (collective; ShardedStep::fingerprint(ids)).")
      .def_prop_ro("arena", [](PyShardedStep& s) {
             return std::make_tuple(reinterpret_cast<uintptr_t>(s.task().backend().arena()), s.task().plan().arena_bytes());
           }, "(address, bytes) of the task's arena: the communicator lends cached views of it (_torch_dist.py).")
      // Collective: every rank calls it for the same (family, id) in the same order.
      .def("read_state", [](PyShardedStep& s, const std::string& family, size_t id) {
             const Family f = optimizer_state_family(family, "read_state()");
             if (id >= s.task().num_params()) throw_invalid("read_state(): parameter id out of range");
             const std::vector<int64_t>& shape = s.task().param(id).shape;
             uint64_t n = 1;
             for (int64_t d : shape) n *= static_cast<uint64_t>(d);
             auto* owned = new std::vector<float>(static_cast<size_t>(n));
             nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
             s.sharded().read_state(f, id, 0, n, owned->data());
             std::vector<size_t> dims(shape.begin(), shape.end());
             return nb::ndarray<nb::numpy, float>(owned->data(), dims.size(), dims.data(), owner);
           }, "family"_a, "param"_a, "One parameter's whole M, V or VMAX gathered from the ranks that hold it (collective).")
      .def("save", [](PyShardedStep& s, const std::string& path) { s.sharded().save(path); }, "path"_a,
           "Task::save of the whole state, written by rank 0 (collective).")
      .def("set_reduce_chunk", [](PyShardedStep& s, uint64_t n) { s.sharded().set_reduce_chunk(n); }, "elements"_a)
      .def_prop_ro("comm_seconds", [](PyShardedStep& s) { return s.sharded().comm_seconds(); })
      .def_prop_ro("layout", [](PyShardedStep& s) {
        std::vector<std::tuple<uint64_t, uint64_t>> r;
        for (const RankShard& x : s.sharded().layout().ranks) r.emplace_back(x.begin, x.end);
        return r;
      }, "Each rank's element range [begin, end) of every family (make_shard_layout).")
      .def_prop_ro("muon_matrices", [](PyShardedStep& s) {
        std::vector<std::tuple<int64_t, int64_t>> r;
        for (const RankShard& x : s.sharded().layout().ranks) r.emplace_back(x.muon_matrix_begin, x.muon_matrix_end);
        return r;
      }, "Muon: each rank's matrices [begin, end) in plan order, the ones it owns (orthogonalises and holds the "
         "momentum of, whole; make_shard_layout). Empty ranges on other kinds.");
}
