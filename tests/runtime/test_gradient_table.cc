// TaskOptions::gradient_table: the step reads each parameter's gradient through a
// per-parameter address table instead of the arena's G. For every kind x {fp32, bf16 and fp16
// model-dtype G} x {mask off, on} x {clipping off, on} on every backend of the build (CUDA skips
// without a device): a Task whose table points at gradients held elsewhere (in the G of two
// "donor" Tasks whose layouts put the tensors off 4-element boundaries, back to back, so a
// neighbour's values sit right after each tensor) ends every step with the fingerprint of a Task
// without the flag fed the same gradient bits in its own G. The pointers move between steps,
// step 0 runs on the table's initial arena addresses, a masked tensor's source holds NaN (never
// read) and one step carries an Inf (both skip). The expected values come from the Task without
// the flag, never from the table path; W, M and V are compared padding included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "renaissance/error.h"
#include "renaissance/math/precision.h"
#include "renaissance/model_copy_key.h"
#include "renaissance/task.h"
#include "support/mask_test_util.h"
#include "support/optimizer_cases.h"
#include "support/test_util.h"

namespace renaissance {
namespace {

using testing_util::KindCase;

// Both groups, odd sizes (the arena pads each run to 64 elements), a tensor over several norm
// tiles and chunks, a scalar.
std::vector<ParamSpec> table_params() {
  return {
      {"conv1", {7, 3, 5, 5}, Role::kFirstConv}, {"bn1.w", {37}, Role::kBnWeight}, {"bn1.b", {37}, Role::kBnBias},
      {"conv2", {9001}, Role::kDeepConv},        {"fc.b", {10}, Role::kFcBias},    {"bn2.w", {}, Role::kBnWeight},
      {"fc.w", {3, 67}, Role::kFcWeight},
  };
}
constexpr int kSteps = 5;
constexpr int kInfStep = 3;  // an unmasked tensor's gradient holds +Inf: the step is skipped
bool masked(size_t id, int step) { return (id + static_cast<size_t>(step)) % 3 == 1; }  // never id 3 at kInfStep

struct TableCase {
  KindCase kind;
  Precision precision;  // kFp32, or the model dtype of the gradients
  bool mask;
  bool clip;
  BackendKind backend;
};
void PrintTo(const TableCase& c, std::ostream* os) {
  *os << c.kind.name << "/" << precision_name(c.precision) << (c.mask ? "/mask" : "") << (c.clip ? "/clip" : "") << "/"
      << backend_kind_name(c.backend);
}

TaskOptions options_for(const TableCase& c, bool table, bool mask) {
  TaskOptions o;
  o.backend = c.backend;
  o.backend_options.threads = 2;
  o.tensor_mask = mask;
  o.gradient_table = table;
  o.precision.precision = c.precision;
  o.precision.model_dtype_gradients = c.precision != Precision::kFp32;
  return o;
}

// The gradient bits of one tensor in G's encoding: 4-byte floats, or 2-byte encodings (rounded
// to nearest even), as raw bytes.
std::vector<uint8_t> encode(const TableCase& c, const std::vector<float>& g) {
  if (c.precision == Precision::kFp32) {
    std::vector<uint8_t> out(g.size() * sizeof(float));
    if (!g.empty()) std::memcpy(out.data(), g.data(), out.size());
    return out;
  }
  std::vector<uint8_t> out(g.size() * sizeof(uint16_t));
  for (size_t i = 0; i < g.size(); ++i) {
    const uint16_t h = math::f32_to_half_rne(c.precision == Precision::kBf16, g[i]);
    std::memcpy(out.data() + i * sizeof(uint16_t), &h, sizeof(h));
  }
  return out;
}

// Writes encoded gradient bits into tensor id of a task's own G.
void write_bits(const TableCase& c, Task& task, size_t id, const std::vector<uint8_t>& bits) {
  if (c.precision == Precision::kFp32) {
    std::vector<float> f(bits.size() / sizeof(float));
    if (!f.empty()) std::memcpy(f.data(), bits.data(), bits.size());
    task.set_grad(id, f.data());
  } else {
    std::vector<uint16_t> h(bits.size() / sizeof(uint16_t));
    if (!h.empty()) std::memcpy(h.data(), bits.data(), bits.size());
    task.write_grad_encoded(id, h.data());
  }
}

// A donor: a Task whose G holds the gradients the table points at. Every tensor is a deep conv
// (one role region, tensors back to back: each starts where the previous ended, so off 4-element
// and 16-byte boundaries), after a filler of `lead` elements, in the order `order`.
struct Donor {
  std::unique_ptr<Task> task;
  std::vector<size_t> slot;  // slot[id]: the donor tensor holding parameter id's gradient
};
Donor make_donor(const TableCase& c, const std::vector<ParamSpec>& params, int64_t lead, bool reversed) {
  std::vector<ParamSpec> specs = {{"lead", {lead}, Role::kDeepConv}};
  Donor d;
  d.slot.resize(params.size());
  for (size_t k = 0; k < params.size(); ++k) {
    const size_t id = reversed ? params.size() - 1 - k : k;
    d.slot[id] = specs.size();
    specs.push_back({"g" + std::to_string(id), params[id].shape, Role::kDeepConv});
    specs.push_back({"odd" + std::to_string(k), {static_cast<int64_t>(2 * k + 1)}, Role::kDeepConv});
  }
  d.task = std::make_unique<Task>(specs, options_for(c, false, false));
  d.task->optimizer(SGD().lr(0.1));
  d.task->compile();
  // The neighbours of every tensor hold large finite values: a read past a tensor's end changes
  // the bits (and the clip norm), a read of them as padding would too.
  for (size_t k = 0; k < specs.size(); ++k) {
    write_bits(c, *d.task, k, encode(c, std::vector<float>(static_cast<size_t>(specs[k].numel()), 3.0f)));
  }
  return d;
}

class GradientTableTest : public ::testing::TestWithParam<TableCase> {};

TEST_P(GradientTableTest, TableReadsMatchArenaReadsBitForBit) {
  const TableCase c = GetParam();
  RN_SKIP_IF_UNAVAILABLE(c.backend);
  const std::vector<ParamSpec> params = table_params();
  OptimizerConfig config = c.kind.config;
  if (c.clip) config.max_grad_norm = 1.0;  // far under the gradients' norm: the coefficient is < 1
  Task arena(params, options_for(c, false, c.mask));
  Task table(params, options_for(c, true, c.mask));
  for (Task* t : {&arena, &table}) {
    t->optimizer(config);
    t->compile();
    t->set_loss_scale(4.0);
    for (size_t id = 0; id < params.size(); ++id) t->set_weight(id, testing_util::named_weights(params[id]).data());
  }
  ASSERT_EQ(arena.fingerprint(), table.fingerprint());
  Donor donors[2] = {make_donor(c, params, 3, false), make_donor(c, params, 1, true)};
  const float nan = std::nanf("");
  int applied = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int32_t> mask(params.size(), 0);
    std::vector<uint64_t> addresses(params.size());
    for (size_t id = 0; id < params.size(); ++id) {
      mask[id] = c.mask && masked(id, step) ? 1 : 0;
      std::vector<float> g = testing_util::named_grads(params[id], step);
      if (mask[id]) g.assign(g.size(), nan);  // a masked tensor's gradient is never looked at
      if (step == kInfStep && id == 3) g[4321] = INFINITY;
      const std::vector<uint8_t> bits = encode(c, g);
      write_bits(c, arena, id, bits);
      if (step == 0) {
        write_bits(c, table, id, bits);  // step 0: the table as compile() left it (the arena's G)
        continue;
      }
      // The source of each parameter moves between the donors from step to step.
      Donor& d = donors[(id + static_cast<size_t>(step)) % 2];
      write_bits(c, *d.task, d.slot[id], bits);
      addresses[id] = reinterpret_cast<uintptr_t>(d.task->grad_data(d.slot[id]));
    }
    if (step > 0) table.set_gradient_table(addresses);
    if (c.mask) {
      arena.set_tensor_mask(mask);
      table.set_tensor_mask(mask);
    }
    const std::string before = arena.fingerprint();
    arena.step();
    table.step();
    ASSERT_EQ(arena.last_step_skipped(), step == kInfStep) << "step " << step;
    EXPECT_EQ(table.last_step_skipped(), arena.last_step_skipped()) << "step " << step;
    if (step != kInfStep) {
      ++applied;
      ASSERT_NE(arena.fingerprint(), before) << "step " << step << " changed nothing";
    }
    ASSERT_EQ(table.fingerprint(), arena.fingerprint()) << "step " << step;
    if (c.clip) {
      EXPECT_EQ(table.last_grad_norm(), arena.last_grad_norm()) << "step " << step;
    }
  }
  EXPECT_EQ(table.step_count(), applied);
  // The whole W, M and V families, padding included: a padding element must read +0.0 (as the
  // arena's padding G does), else the update moves padding W (which no fingerprint hashes).
  for (Family f : {Family::kW, Family::kM, Family::kV}) {
    if (!arena.plan().has_family(f)) continue;
    const Span all = arena.plan().region_range(family_region(f, Role::kBnBias), family_region(f, Role::kDeepConv));
    ASSERT_EQ(all.offset, table.plan().region_range(family_region(f, Role::kBnBias), family_region(f, Role::kDeepConv)).offset);
    std::vector<float> a(all.count), b(all.count);
    arena.backend().download(all.offset, a.data(), a.size() * sizeof(float));
    table.backend().download(all.offset, b.data(), b.size() * sizeof(float));
    EXPECT_TRUE(testing_util::same_bits(a, b)) << family_name(f) << " with padding";
  }
  for (size_t id = 0; id < params.size(); ++id) {
    EXPECT_TRUE(testing_util::same_snapshot(testing_util::snapshot_tensor(table, id),
                                            testing_util::snapshot_tensor(arena, id)))
        << params[id].name;
  }
}

std::vector<TableCase> table_cases() {
  std::vector<TableCase> cases;
  for (BackendKind b : testing_util::backends_under_test()) {
    for (const KindCase& k : testing_util::all_kind_cases()) {
      for (Precision p : {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
        for (bool mask : {false, true}) {
          for (bool clip : {false, true}) cases.push_back({k, p, mask, clip, b});
        }
      }
    }
  }
  return cases;
}
std::string table_case_name(const ::testing::TestParamInfo<TableCase>& info) {
  const TableCase& c = info.param;
  return c.kind.name + "_" + precision_name(c.precision) + (c.mask ? "_mask" : "") + (c.clip ? "_clip" : "") + "_" +
         backend_kind_name(c.backend);
}
INSTANTIATE_TEST_SUITE_P(Kinds, GradientTableTest, ::testing::ValuesIn(table_cases()), table_case_name);

// GradTableRef (model_copy_key.h), the lookup the CUDA readers run on the device and the CPU's
// fast path, on the host against a brute-force scan: tensors straddling chunk boundaries, empty
// tensors, padding between tensors and at the end, a tensor cut (first > 0), and one layout whose
// span ends inside its last tensor. Also the CUDA readers' chunk addresses (chunk_at, as
// backend_cuda/grad_chunks.cu fills them with chunk_address): every chunk's address against the
// scan, and the readers' chunked_address / chunked_quad against address for every element.
void check_lookup(const std::vector<CopyTensor>& tensors, uint64_t span) {
  const std::vector<int32_t> chunks = tensor_chunks(tensors, span);
  std::vector<uint64_t> table(tensors.size());
  for (size_t k = 0; k < table.size(); ++k) table[k] = (uint64_t{1} << 40) * (k + 1);
  GradTableRef ref{CopyLookup{tensors.data(), chunks.data(), static_cast<uint32_t>(tensors.size())}, table.data(),
                   nullptr};
  // The tensor holding element e by a scan (nullptr: padding).
  auto holder = [&](uint64_t e) -> const CopyTensor* {
    for (const CopyTensor& t : tensors) {
      if (e >= t.begin && e < t.begin + t.numel) return &t;
    }
    return nullptr;
  };
  for (uint32_t elem : {4u, 2u}) {
    for (uint64_t e = 0; e < span; ++e) {
      uint64_t want = 0, want_run = 0;
      if (const CopyTensor* t = holder(e)) {
        want = table[t->param] + (t->first + e - t->begin) * elem;
        if (e + 4 <= t->begin + t->numel) want_run = want;
      }
      ASSERT_EQ(ref.address(e, elem), want) << "element " << e;
      ASSERT_EQ(ref.run_address(e, 4, elem), want_run) << "element " << e;
    }
    // Chunk k's address: nonzero exactly when one tensor holds all of its elements below the
    // span (rounded up to a quad).
    const uint64_t count = grad_chunk_count(span), end = (span + 3) / 4 * 4;
    std::vector<uint64_t> chunk_at(count);
    int in_one = 0, mixed = 0;
    for (uint64_t k = 0; k < count; ++k) {
      const CopyTensor* t = holder(k * kCopyChunk);
      for (uint64_t e = k * kCopyChunk; e < std::min(end, (k + 1) * kCopyChunk) && t != nullptr; ++e) {
        if (holder(e) != t) t = nullptr;
      }
      const uint64_t want = t == nullptr ? 0 : table[t->param] + (t->first + k * kCopyChunk - t->begin) * elem;
      chunk_at[k] = ref.chunk_address(k, span, elem);
      ASSERT_EQ(chunk_at[k], want) << "chunk " << k;
      ++(want != 0 ? in_one : mixed);
    }
    EXPECT_EQ(ref.chunk_address(count, span, elem), 0u);
    EXPECT_GT(in_one, 0);  // both paths of the readers are taken
    EXPECT_GT(mixed, 0);
    ref.chunk_at = chunk_at.data();
    for (uint64_t e = 0; e < span; ++e) {
      ASSERT_EQ(ref.chunked_address(e, elem), ref.address(e, elem)) << "element " << e;
      if (e % 4 != 0) continue;
      const uint64_t quad = ref.chunked_quad(e, elem);
      if (quad == 0) continue;
      for (uint64_t j = 0; j < 4; ++j) ASSERT_EQ(quad + j * elem, ref.address(e + j, elem)) << "quad " << e << "+" << j;
    }
    ref.chunk_at = nullptr;
  }
}

TEST(GradTableLookup, AddressesMatchABruteForceScan) {
  std::vector<CopyTensor> tensors;
  uint64_t at = 3;  // padding first
  for (uint64_t numel : {1000u, 0u, 1u, 2049u, 4u, 0u, 77u, 1024u, 3000u}) {
    tensors.push_back({at, numel, static_cast<uint32_t>(tensors.size()), tensors.size() == 3 ? 5u : 0u});
    at += numel + (numel % 3);  // sometimes back to back, sometimes a gap
  }
  check_lookup(tensors, at + 61);
  // The span ends with its last tensor, inside a chunk: that chunk still lies in one tensor.
  check_lookup(tensors, tensors.back().begin + tensors.back().numel);
  // The span ends inside the last tensor (cut, first > 0): the last chunk is that tensor's up to
  // the span's end, though the tensor goes on.
  tensors.back().first = 7;
  check_lookup(tensors, tensors.back().begin + 1500);
}

// The refusals: the accessors of a task built without the flag, a table of the wrong size or with
// a null address, and a state shard (a sharded step reduces gradients in the arena's G).
TEST(GradientTableRefusals, WhereTheTableCannotHold) {
  const std::vector<ParamSpec> params = table_params();
  Task plain(params, testing_util::cpu_task_options());
  plain.optimizer(AdamW());
  plain.compile();
  EXPECT_THROW(plain.gradient_table(), Error);
  EXPECT_THROW(plain.set_gradient_table(std::vector<uint64_t>(params.size(), 64)), Error);
  TaskOptions o = testing_util::cpu_task_options();
  o.gradient_table = true;
  Task table(params, o);
  table.optimizer(AdamW());
  table.compile();
  EXPECT_THROW(table.set_gradient_table(std::vector<uint64_t>(params.size() - 1, 64)), Error);
  std::vector<uint64_t> null_entry(params.size(), reinterpret_cast<uintptr_t>(table.grad_data(0)));
  null_entry[0] = 0;
  EXPECT_THROW(table.set_gradient_table(null_entry), Error);
  // compile() leaves the arena's own addresses in the table.
  for (size_t id = 0; id < params.size(); ++id) {
    EXPECT_EQ(table.gradient_table()[id], reinterpret_cast<uintptr_t>(table.grad_data(id))) << id;
  }
  o.state_shard = {0, 2};
  Task sharded(params, o);
  sharded.optimizer(AdamW());
  EXPECT_THROW(sharded.compile(), Error);
}

}  // namespace
}  // namespace renaissance
