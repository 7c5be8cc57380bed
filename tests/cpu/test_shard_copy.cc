// A sharded step's cut of the model copy (cut_model_copy): the copy writers run on the cut pieces
// of a group (an element-wise update's moved span with ModelCopy::base, or a tile-wise update's
// part of the whole span) give every element the bits math/precision.h defines for its (seed, t,
// tensor, index in the tensor), for cuts anywhere: inside a 8-element stochastic-rounding block,
// at a tensor's edge, past a vector's width. The expected bits come from the scalar definitions
// and the test's own tensor bookkeeping, not from the tensor table under test.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <random>
#include <string>
#include <vector>

#include "backend_cpu/cpu_ops.h"
#include "renaissance/backend.h"
#include "renaissance/math/precision.h"
#include "renaissance/model_copy_key.h"
#include "renaissance/sharded_step.h"

namespace renaissance {
namespace {

struct Tensor {
  uint64_t begin, numel;
  uint32_t param;
};

// A group of tensors with odd sizes and gaps (padding) between some of them.
const std::vector<Tensor> kTensors = {{0, 5, 3}, {5, 4099, 0}, {4112, 13, 7}, {4125, 70, 1}, {4224, 8200, 2}};
constexpr uint64_t kGroup = 12424;

// The group's tensor table as MemoryPlan writes one: CopyTensor entries, then the chunk index.
std::vector<CopyTensor> table_tensors() {
  std::vector<CopyTensor> list;
  for (const Tensor& t : kTensors) list.push_back({t.begin, t.numel, t.param, 0});
  return list;
}
std::vector<int32_t> table_chunks() { return tensor_chunks(table_tensors(), kGroup); }
// The table written at byte `at` of an arena (through `write(offset, data, bytes)`).
template <class Write>
TensorTable write_table(uint64_t at, Write&& write) {
  const std::vector<CopyTensor> list = table_tensors();
  const std::vector<int32_t> chunks = table_chunks();
  const uint64_t chunks_at = at + list.size() * sizeof(CopyTensor);
  write(at, list.data(), list.size() * sizeof(CopyTensor));
  write(chunks_at, chunks.data(), chunks.size() * sizeof(int32_t));
  return TensorTable{{at, list.size()}, {chunks_at, chunks.size()}};
}
constexpr uint64_t kTableBytes = 5 * sizeof(CopyTensor) + 16 * sizeof(int32_t);
constexpr uint64_t kSeed = 0x1234abcd9876ULL;
constexpr int32_t kT = 17;

uint16_t expected_bits(Precision p, Rounding r, float x, uint32_t param, uint64_t index) {
  if (r == Rounding::kNearest) return p == Precision::kBf16 ? math::f32_to_bf16_rne(x) : math::f32_to_f16_rne(x);
  const uint32_t word = math::sr_random_word(kSeed, static_cast<uint64_t>(kT), param, index);
  return p == Precision::kBf16 ? math::f32_to_bf16_sr(x, word) : math::f32_to_f16_sr(x, word);
}

class CutCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    // Arena: W (floats), then C (2 bytes each), then the tensor table.
    arena_.assign(kGroup * 4 + kGroup * 2 + kTableBytes, 0);
    table_ = write_table(kGroup * 6, [&](uint64_t at, const void* src, uint64_t bytes) {
      std::memcpy(arena_.data() + at, src, bytes);
    });
    std::mt19937 gen(5);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    for (uint64_t i = 0; i < kGroup; ++i) w()[i] = dist(gen) * (i % 7 == 0 ? 1e-5f : 1.0f);
    i32_[kStep] = kT;
    i32_[kHasNonFinite] = 0;
    ctx_.arena = arena_.data();
    ctx_.scalars = ScalarPtrs{nullptr, i32_, nullptr};
  }
  float* w() { return reinterpret_cast<float*>(arena_.data()); }
  uint16_t* c() { return reinterpret_cast<uint16_t*>(arena_.data() + kGroup * 4); }

  GraphNode whole_node(Precision p, Rounding r) const {
    GraphNode node;
    node.span(Family::kW) = Span{0, kGroup};
    node.copy.precision = p;
    node.copy.rounding = r;
    node.copy.seed = kSeed;
    node.copy.c = Span{kGroup * 4, kGroup};
    node.copy.tensors = table_;
    return node;
  }

  // Every element of a tensor holds its defined bits; padding was not written (stays 0xFFFF).
  void expect_defined(Precision p, Rounding r, const std::string& what) {
    uint64_t bad = 0, next = 0;
    for (const Tensor& t : kTensors) {
      for (uint64_t i = next; i < t.begin; ++i) bad += c()[i] != 0xFFFF;
      for (uint64_t i = 0; i < t.numel; ++i) bad += c()[t.begin + i] != expected_bits(p, r, w()[t.begin + i], t.param, i);
      next = t.begin + t.numel;
    }
    EXPECT_EQ(bad, 0u) << what;
  }

  std::vector<char> arena_;
  TensorTable table_;
  int32_t i32_[kNumScalarI32] = {};
  cpu::CpuContext ctx_;
};

TEST_F(CutCopy, EveryCutRoundsTheBitsOfOneDevice) {
  // Cut points: inside SR blocks at every phase, at tensor edges, inside a vector, near a piece.
  const std::vector<uint64_t> cuts = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 64, 4097, 4098, 4103, 4104, 4111, 4113,
                                      4126, 4227, 4230, 8321, 8322, 12423};
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
      const GraphNode whole = whole_node(p, r);
      std::fill(c(), c() + kGroup, uint16_t{0xFFFF});
      cpu::write_model_copy(ctx_, whole, 0, kGroup);
      expect_defined(p, r, "whole group");
      for (bool move : {true, false}) {
        for (size_t a = 0; a < cuts.size(); ++a) {
          // Three ranks: [0, lo), [lo, hi), [hi, kGroup), with hi a few cuts further on.
          const uint64_t lo = cuts[a], hi = cuts[std::min(cuts.size() - 1, a + 3)];
          std::fill(c(), c() + kGroup, uint16_t{0xFFFF});
          for (const auto& part : {std::make_pair(uint64_t{0}, lo), std::make_pair(lo, hi), std::make_pair(hi, kGroup)}) {
            if (move) {  // an element-wise update cut to the part: its spans start there
              GraphNode node = whole;
              node.copy = cut_model_copy(whole.copy, part.first, part.second);
              node.span(Family::kW) = Span{part.first * 4, part.second - part.first};
              cpu::write_model_copy(ctx_, node, 0, part.second - part.first);
            } else {  // a tile-wise update: the whole span, its tiles cover the part
              cpu::write_model_copy(ctx_, whole, part.first, part.second);
            }
          }
          expect_defined(p, r, "cuts at " + std::to_string(lo) + ", " + std::to_string(hi) + (move ? " moved" : " whole span"));
        }
      }
    }
  }
}

// The fused copy writer of update nodes cut to three ranks' slices (CUDA: skipped without a
// device; CPU below): each an UPDATE_SGD node over its slice of the group (spans moved, the copy
// cut by cut_model_copy) with lr 0 and a zero G (the masters stay exactly as they are:
// w * 1 - 0 * 0), give every element the defined bits and leave the padding alone. The cuts lie
// on quads (the CUDA kernels load float4), also 4 past a multiple of 8: a slice then starts
// inside a Philox block and its warp pairs straddle two blocks of the group's grid.
void check_cut_update_nodes(BackendKind kind) {
  std::unique_ptr<Backend> backend = create_backend(kind, BackendOptions{});
  const uint64_t c_off = kGroup * 4, s_off = (c_off + kGroup * 2 + 255) / 256 * 256, f_off = s_off + 256,
                 g_off = f_off + 256, t_off = g_off + kGroup * 4;
  backend->allocate_arena(t_off + kTableBytes);
  const TensorTable table = write_table(t_off, [&](uint64_t at, const void* src, uint64_t bytes) {
    backend->upload(at, src, bytes);
  });
  std::vector<float> w(kGroup);
  std::mt19937 gen(9);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (float& x : w) x = dist(gen);
  backend->upload(0, w.data(), kGroup * 4);
  const int32_t scalars[kNumScalarI32] = {kT, 0};
  backend->upload(s_off, scalars, sizeof(scalars));
  float f32[kNumScalarF32] = {};  // lr 0; the decay factor, 1/loss scale and clip coefficient 1
  f32[kDecayFactor] = 1.0f;
  f32[kInvLossScale] = 1.0f;
  f32[kClipCoefficient] = 1.0f;
  f32[kOneMinusDampening] = 1.0f;
  f32[kMomentumGradFactor] = 1.0f;
  backend->upload(f_off, f32, sizeof(f32));
  const std::vector<float> zeros(kGroup, 0.0f);
  backend->upload(g_off, zeros.data(), kGroup * 4);
  const std::vector<std::pair<uint64_t, uint64_t>> cuts = {{4, 4100}, {12, 4128}, {64, 4224}, {4104, 8324}, {4116, 12420}};
  for (Precision p : {Precision::kBf16, Precision::kFp16}) {
    for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
      ModelCopy whole;
      whole.precision = p;
      whole.rounding = r;
      whole.seed = kSeed;
      whole.c = Span{c_off, kGroup};
      whole.tensors = table;
      for (const auto& cut : cuts) {
        const std::vector<uint16_t> unset(kGroup, 0xFFFF);
        backend->upload(c_off, unset.data(), kGroup * 2);
        CompiledStep step;
        step.scalars_i32 = Span{s_off, kNumScalarI32};
        step.scalars_f32 = Span{f_off, kNumScalarF32};
        for (const auto& part : {std::make_pair(uint64_t{0}, cut.first), cut, std::make_pair(cut.second, kGroup)}) {
          GraphNode node;
          node.kind = NodeKind::kRange;
          node.range_op = RangeOp::UPDATE_SGD;
          node.group = Group::kWeight;
          node.span(Family::kG) = Span{g_off + part.first * 4, part.second - part.first};
          node.span(Family::kW) = Span{part.first * 4, part.second - part.first};
          node.copy = cut_model_copy(whole, part.first, part.second);
          step.graphs[static_cast<int>(GraphId::kOptimizer)].push_back(node);
        }
        backend->prepare(step);
        backend->execute(step);
        backend->synchronize();
        std::vector<uint16_t> c(kGroup);
        backend->download(c_off, c.data(), kGroup * 2);
        uint64_t bad = 0, next = 0;
        for (const Tensor& t : kTensors) {
          for (uint64_t i = next; i < t.begin; ++i) bad += c[i] != 0xFFFF;
          for (uint64_t i = 0; i < t.numel; ++i) bad += c[t.begin + i] != expected_bits(p, r, w[t.begin + i], t.param, i);
          next = t.begin + t.numel;
        }
        EXPECT_EQ(bad, 0u) << precision_name(p) << " rounding " << static_cast<int>(r) << " cuts at " << cut.first
                           << ", " << cut.second;
      }
    }
  }
}

TEST(CutCopyCuda, CutPiecesRoundTheBitsOfOneDevice) {
  if (!backend_available(BackendKind::kCuda)) GTEST_SKIP() << "no CUDA device";
  check_cut_update_nodes(BackendKind::kCuda);
}

// The same cuts on update nodes of the CPU backend (run_elementwise's update-and-copy steps).
TEST(CutCopyCpu, UpdateNodesOnCutListsRoundTheBitsOfOneDevice) { check_cut_update_nodes(BackendKind::kCpu); }

// A cut moves the copy span to its first element and counts it into base (a cut of a cut adds up);
// an empty cut is an empty span; the tensor table stays the group's.
TEST(CutModelCopy, MovesTheSpanAndCountsTheBase) {
  ModelCopy copy;
  copy.precision = Precision::kBf16;  // 2-byte encodings
  copy.c = Span{256, 100};
  copy.tensors = TensorTable{{4096, 2}, {8192, 1}};
  const ModelCopy empty = cut_model_copy(copy, 70, 70);
  EXPECT_EQ(empty.c.count, 0u);
  EXPECT_EQ(empty.c.offset, 256u + 140u);
  EXPECT_EQ(empty.base, 70u);
  const ModelCopy cut = cut_model_copy(copy, 58, 63);
  EXPECT_EQ(cut.c.offset, 256u + 116u);
  EXPECT_EQ(cut.c.count, 5u);
  EXPECT_EQ(cut.base, 58u);
  EXPECT_EQ(cut.tensors.tensors.offset, 4096u);
  EXPECT_EQ(cut.tensors.chunks.count, 1u);
  const ModelCopy twice = cut_model_copy(cut, 2, 4);
  EXPECT_EQ(twice.c.offset, 256u + 120u);
  EXPECT_EQ(twice.c.count, 2u);
  EXPECT_EQ(twice.base, 60u);
}

}  // namespace
}  // namespace renaissance
