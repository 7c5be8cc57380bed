// The fused update-and-copy path of the CPU element-wise updates (backend_cpu/fused_update.h)
// against the scalar definitions (update_rules.inc with the scalar policy,
// math/precision.h's widen and rounding, sr_random_word), under every Highway target compiled in
// and supported here. Every element-wise kind (sgd, sgd_momentum, sgd_nesterov in decoupled and
// L2 mode, adam, adamw, lion), both groups, bf16 and fp16 copies, nearest and stochastic
// rounding, fp32 and model-dtype G, on a span whose tensors start and end off vector multiples
// (adjacent tensors, one-element tensors, padding between them, a tensor piece starting 5 into
// its tensor, indices whose Philox counter's low word wraps and past 2^35), with hyperparameter
// groups, a tensor mask and per-tensor steps, with chunks and prefetch steps cutting tensors. The
// inputs mix ordinary values with NaN payloads, infinities, signed zeros, fp16 subnormals and
// overflow, and (a learning rate of 0, so w reaches the copy unchanged) bf16/fp16 ties.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backend_cpu/cpu_ops.h"
#include "renaissance/math/precision.h"
#include "renaissance/math/update_rules.h"
#include "renaissance/model_copy_key.h"
#include "renaissance/scalars.h"
#include "support/simd_targets.h"

namespace renaissance {
namespace {

constexpr uint64_t kSpan = 4096;  // elements of the group span
constexpr int kBlocks = 6;        // hyperparameter blocks (one per tensor, as with tensor_mask)

// The span's tensors (begin, numel, param, first): boundaries off every vector width, a piece of
// a sharded tensor, a wrap of the Philox counter's low word, an index past 2^35.
std::vector<CopyTensor> layout_tensors() {
  return {{0, 37, 0, 0},
          {64, 1000, 1, 5},
          {1064, 17, 2, 0},
          {1081, 1, 3, 0},
          {1152, 2500, 4, (0xffffffffull - 40) * 8 + 3},
          {3652, 300, 5, (1ull << 35) + 1}};
}

float from_bits(uint32_t b) { return math::f32_from_bits(b); }
uint32_t to_bits(float f) { return math::f32_bits(f); }

// Float edge patterns mixed into ordinary values.
const uint32_t kFloatEdges[] = {
    0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7fc12345u,
    0xffc00001u, 0x7f800001u, 0x7f7fffffu, 0x3f800000u, 0x00800000u,
    0x3f808000u, 0x3f818000u, 0x3f801000u, 0x3f803000u,               // bf16 and fp16 ties
    0x33000000u, 0x33000001u, 0x387fffffu, 0x38800000u, 0x37800000u,  // fp16 subnormal range
    0x477fefffu, 0x477ff000u, 0x477fffffu, 0x47800000u,               // fp16 overflow edges
    0x7f7f8000u, 0x7f7f7fffu,                                         // bf16 tie to inf
};

std::vector<float> float_inputs(uint32_t seed, float scale, bool non_negative, int edge_every) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(kSpan);
  for (uint64_t i = 0; i < kSpan; ++i) {
    x[i] = rng() % edge_every == 0 ? from_bits(kFloatEdges[rng() % (sizeof kFloatEdges / sizeof kFloatEdges[0])])
                                   : normal(rng);
    if (non_negative && x[i] < 0.0f) x[i] = -x[i];
  }
  return x;
}

// The G encodings: ordinary gradients rounded to the format, with NaN (quiet and signalling
// payloads), infinities, zeros, subnormals and the largest finite values mixed in.
std::vector<uint16_t> half_inputs(Precision p, uint32_t seed) {
  const bool bf16 = p == Precision::kBf16;
  const uint16_t edges_bf16[] = {0x0000, 0x8000, 0x0001, 0x007f, 0x0080, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffa5, 0x7f7f};
  const uint16_t edges_f16[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfd23, 0x7bff, 0x8001};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<uint16_t> g(kSpan);
  for (uint64_t i = 0; i < kSpan; ++i) {
    if (rng() % 9 == 0) {
      g[i] = bf16 ? edges_bf16[rng() % 11] : edges_f16[rng() % 12];
    } else if (rng() % 5 == 0) {
      g[i] = static_cast<uint16_t>(rng());  // any encoding
    } else {
      g[i] = math::f32_to_half_rne(bf16, normal(rng));
    }
  }
  return g;
}

struct Case {
  RangeOp op = RangeOp::UPDATE_ADAMW;
  bool l2 = false;
  Group group = Group::kWeight;
  Precision copy = Precision::kBf16;
  Rounding rounding = Rounding::kNearest;
  bool model_grads = true;
  bool hyper = false;  // H > 1 items (one block per tensor) with a tensor mask and per-tensor steps
  bool zero_lr = false;
  uint64_t chunk = cpu::kChunkElements;
  uint64_t prefetch = 256;
};

std::string describe(const Case& c) {
  return std::string(range_op_name(c.op)) + (c.l2 ? " l2" : "") + (c.group == Group::kWeight ? " weight" : " bias") +
         " copy " + precision_name(c.copy) + " " + rounding_name(c.rounding) + (c.model_grads ? " g=model" : " g=fp32") +
         (c.hyper ? " hyper+mask" : "") + (c.zero_lr ? " lr=0" : "") + " chunk " + std::to_string(c.chunk) +
         " prefetch " + std::to_string(c.prefetch);
}

bool has_m(RangeOp op) { return op != RangeOp::UPDATE_SGD; }
bool has_v(RangeOp op) { return op == RangeOp::UPDATE_ADAM || op == RangeOp::UPDATE_ADAMW; }

// One task-like arena: the node's spans and the inputs, and its scalars.
struct FusedSetup {
  std::vector<uint64_t> storage;  // 8-byte aligned (the arena is 256-byte aligned below)
  char* arena = nullptr;
  GraphNode node;
  std::vector<float> f32;
  std::vector<int32_t> i32;
  std::vector<HyperItem> items;

  uint64_t w_at = 0, g_at = 0, m_at = 0, v_at = 0, c_at = 0, items_at = 0, state_at = 0, list_at = 0, chunks_at = 0,
           bytes = 0;

  explicit FusedSetup(const Case& k) {
    auto region = [&](uint64_t size) {
      const uint64_t at = bytes;
      bytes += (size + 255) / 256 * 256;
      return at;
    };
    const Precision g_dtype = k.model_grads ? k.copy : Precision::kFp32;
    w_at = region(kSpan * 4);
    g_at = region(kSpan * precision_bytes(g_dtype));
    m_at = region(kSpan * 4);
    v_at = region(kSpan * 4);
    c_at = region(kSpan * 2);
    const std::vector<CopyTensor> tensors = layout_tensors();
    if (k.hyper) {
      // One item per tensor with the padding after it, block = param; tensor 2 masked.
      for (size_t t = 0; t < tensors.size(); ++t) {
        const uint64_t b = tensors[t].begin;
        const uint64_t e = t + 1 < tensors.size() ? tensors[t + 1].begin : kSpan;
        items.push_back({static_cast<int64_t>(b), static_cast<int32_t>(e - b), static_cast<int32_t>(t)});
      }
    }
    items_at = region(items.size() * sizeof(HyperItem));
    state_at = region(2 * kBlocks * sizeof(int32_t));
    // The copy's tensor table, as MemoryPlan lays one out (T_TENSOR_LIST, T_TENSOR_CHUNKS).
    const std::vector<int32_t> chunks = tensor_chunks(tensors, kSpan);
    list_at = region(tensors.size() * sizeof(CopyTensor));
    chunks_at = region(chunks.size() * sizeof(int32_t));
    storage.assign(bytes / 8 + 32, 0);
    arena = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(storage.data()) + 255) / 256 * 256);

    const std::vector<float> w = float_inputs(11, 0.05f, false, k.zero_lr ? 2 : 7);
    const std::vector<float> m = float_inputs(12, 1e-3f, false, 7);
    const std::vector<float> v = float_inputs(13, 1e-6f, true, 7);
    std::memcpy(arena + w_at, w.data(), kSpan * 4);
    if (has_m(k.op)) std::memcpy(arena + m_at, m.data(), kSpan * 4);
    if (has_v(k.op)) std::memcpy(arena + v_at, v.data(), kSpan * 4);
    if (g_dtype == Precision::kFp32) {
      const std::vector<float> g = float_inputs(14, 1e-2f, false, 9);
      std::memcpy(arena + g_at, g.data(), kSpan * 4);
    } else {
      const std::vector<uint16_t> g = half_inputs(g_dtype, 14);
      std::memcpy(arena + g_at, g.data(), kSpan * 2);
    }
    // The copy's padding holds a marker that no path may overwrite.
    std::vector<uint16_t> c(kSpan, 0xdeadu);
    std::memcpy(arena + c_at, c.data(), kSpan * 2);
    // (Without hyperparameter groups the list is empty: memcpy from its null data() is undefined.)
    if (!items.empty()) std::memcpy(arena + items_at, items.data(), items.size() * sizeof(HyperItem));
    std::memcpy(arena + list_at, tensors.data(), tensors.size() * sizeof(CopyTensor));
    std::memcpy(arena + chunks_at, chunks.data(), chunks.size() * sizeof(int32_t));
    int32_t* state = reinterpret_cast<int32_t*>(arena + state_at);
    for (int b = 0; b < kBlocks; ++b) {
      state[b] = b == 2 ? 1 : 0;  // mask
      state[kBlocks + b] = 100 + 3 * b;  // steps
    }

    f32.assign(kBlocks * kNumScalarF32, 0.0f);
    for (int b = 0; b < kBlocks; ++b) {
      float* s = f32.data() + b * kNumScalarF32;
      const float lr = k.zero_lr ? 0.0f : 1e-3f * static_cast<float>(1 + b);
      const float wd = k.zero_lr ? 0.0f : 0.1f;
      s[kLr] = lr;
      s[kWeightDecay] = wd;
      s[kDecayFactor] = static_cast<float>(1.0 - static_cast<double>(lr) * wd);
      s[kMomentum] = 0.9f;
      s[kBeta1] = 0.9f;
      s[kBeta2] = 0.999f;
      s[kOneMinusBeta1] = static_cast<float>(1.0 - 0.9);
      s[kOneMinusBeta2] = static_cast<float>(1.0 - 0.999);
      s[kEps] = 1e-8f;
      s[kInvLossScale] = 1.0f / 1024.0f;
      s[kBiasCorrection1] = 1.5f;
      s[kBiasCorrection2] = 7.25f;
      s[kClipCoefficient] = 1.0f;
      s[kOneMinusDampening] = 1.0f;
      s[kMomentumGradFactor] = 1.0f;
    }
    i32.assign(kNumScalarI32, 0);
    i32[kStep] = 9;

    node.kind = NodeKind::kRange;
    node.range_op = k.op;
    node.group = k.group;
    node.flags.weight_decay_mode = k.l2 || k.op == RangeOp::UPDATE_ADAM ? WeightDecayMode::kL2 : WeightDecayMode::kDecoupled;
    node.span(Family::kW) = {w_at, kSpan};
    node.span(Family::kG) = {g_at, kSpan};
    if (has_m(k.op)) node.span(Family::kM) = {m_at, kSpan};
    if (has_v(k.op)) node.span(Family::kV) = {v_at, kSpan};
    node.grad.encoding = g_dtype;
    node.copy.precision = k.copy;
    node.copy.rounding = k.rounding;
    node.copy.seed = 0x0123456789abcdefull;
    node.copy.c = {c_at, kSpan};
    node.copy.tensors = TensorTable{{list_at, tensors.size()}, {chunks_at, chunks.size()}};
    if (k.hyper) {
      node.work.hyper_groups = kBlocks;
      node.work.hyper_items = {items_at, items.size()};
      node.work.tensor_state = {state_at, 2 * kBlocks};
    }
  }

  // Runs the node's op on a 256-byte aligned copy of the arena (so that the fused loop's
  // non-temporal copy stores are taken where a piece's vectors are aligned); returns the arena's
  // bytes afterwards.
  std::vector<char> run(const Case& k) {
    std::vector<uint64_t> copy(storage.size(), 0);
    char* a = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(copy.data()) + 255) / 256 * 256);
    std::memcpy(a, arena, bytes);
    cpu::CpuContext ctx;
    ctx.arena = a;
    ctx.threads = 2;
    ctx.tuning.chunk_elements = k.chunk;
    ctx.tuning.prefetch_elements = k.prefetch;
    std::vector<float> f32_copy(f32);
    std::vector<int32_t> i32_copy(i32);
    ctx.scalars = ScalarPtrs{f32_copy.data(), i32_copy.data(), nullptr};
    switch (k.op) {
      case RangeOp::UPDATE_SGD: cpu::run_UPDATE_SGD(ctx, node); break;
      case RangeOp::UPDATE_SGD_MOMENTUM: cpu::run_UPDATE_SGD_MOMENTUM(ctx, node); break;
      case RangeOp::UPDATE_SGD_NESTEROV: cpu::run_UPDATE_SGD_NESTEROV(ctx, node); break;
      case RangeOp::UPDATE_ADAM: cpu::run_UPDATE_ADAM(ctx, node); break;
      case RangeOp::UPDATE_ADAMW: cpu::run_UPDATE_ADAMW(ctx, node); break;
      case RangeOp::UPDATE_LION: cpu::run_UPDATE_LION(ctx, node); break;
      default: ADD_FAILURE() << "not an element-wise op";
    }
    return std::vector<char>(a, a + bytes);
  }

  // The scalar definition of the node's op on the arena `a` (in place).
  void reference(const Case& k, char* a) const {
    float* w = reinterpret_cast<float*>(a + w_at);
    float* m = reinterpret_cast<float*>(a + m_at);
    float* v = reinterpret_cast<float*>(a + v_at);
    uint16_t* c = reinterpret_cast<uint16_t*>(a + c_at);
    const std::vector<CopyTensor> tensors = layout_tensors();
    for (uint64_t e = 0; e < kSpan; ++e) {
      int block = 0;
      if (k.hyper) {
        for (const HyperItem& it : items) {
          if (static_cast<uint64_t>(it.start) <= e && e < static_cast<uint64_t>(it.start + it.count)) block = it.block;
        }
        if (block == 2) continue;  // masked
      }
      const float* s = f32.data() + block * kNumScalarF32;
      const auto co = math::make_coeffs<float>(s, k.group == Group::kWeight ? CoeffSet::kWeight : CoeffSet::kBiasLike,
                                               [](float x) { return x; });
      float g = 0.0f;
      if (node.grad.encoding == Precision::kFp32) {
        std::memcpy(&g, a + g_at + e * 4, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, a + g_at + e * 2, 2);
        g = math::half_to_f32(node.grad.encoding == Precision::kBf16, h);
      }
      using P = math::ScalarPolicy;
      const bool l2 = node.flags.weight_decay_mode == WeightDecayMode::kL2;
      switch (k.op) {
        case RangeOp::UPDATE_SGD: l2 ? math::sgd<P, true>(w[e], g, co) : math::sgd<P, false>(w[e], g, co); break;
        case RangeOp::UPDATE_SGD_MOMENTUM:
          l2 ? math::sgd_momentum<P, true>(w[e], g, m[e], co) : math::sgd_momentum<P, false>(w[e], g, m[e], co);
          break;
        case RangeOp::UPDATE_SGD_NESTEROV:
          l2 ? math::sgd_nesterov<P, true>(w[e], g, m[e], co) : math::sgd_nesterov<P, false>(w[e], g, m[e], co);
          break;
        case RangeOp::UPDATE_ADAM: math::adam<P>(w[e], g, m[e], v[e], co); break;
        case RangeOp::UPDATE_ADAMW: math::adamw<P>(w[e], g, m[e], v[e], co); break;
        case RangeOp::UPDATE_LION: math::lion<P>(w[e], g, m[e], co); break;
        default: break;
      }
      for (const CopyTensor& t : tensors) {
        if (e < t.begin || e >= t.begin + t.numel) continue;
        const uint64_t step = k.hyper ? static_cast<uint64_t>(100 + 3 * static_cast<int>(t.param))
                                      : static_cast<uint64_t>(i32[kStep]);
        const uint64_t index = t.first + (e - t.begin);
        if (k.rounding == Rounding::kNearest) {
          c[e] = math::f32_to_half_rne(k.copy == Precision::kBf16, w[e]);
        } else {
          const uint32_t r = math::sr_random_word(node.copy.seed, step, t.param, index);
          c[e] = k.copy == Precision::kBf16 ? math::f32_to_bf16_sr(w[e], r) : math::f32_to_f16_sr(w[e], r);
        }
      }
    }
  }
};

bool is_nan_half(Precision p, uint16_t h) {
  return p == Precision::kBf16 ? (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0 : (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}

// Differences between two arenas of `s`: w, m, v and the copy bit for bit, except that a NaN
// equals any NaN (float arrays and copy encodings), whose count is added to *nan_payloads: where
// two operands of an add or a mul are NaN, x86 returns the first one's payload and the compiler
// may commute the operands, so two separately compiled loops may give other payloads (seen
// between the vector loop and the scalar definition on every target). Reports the first few
// differences and returns their count.
int differences(const FusedSetup& s, const std::vector<char>& want, const std::vector<char>& got, int* nan_payloads,
                const std::string& what) {
  int bad = 0;
  auto report = [&](const char* array, uint64_t e, uint32_t a, uint32_t b) {
    if (++bad <= 4) {
      ADD_FAILURE() << what << ": " << array << "[" << e << "] expected 0x" << std::hex << a << ", fused path 0x" << b;
    }
  };
  for (const auto& [array, at] : {std::pair<const char*, uint64_t>{"w", s.w_at}, {"m", s.m_at}, {"v", s.v_at}}) {
    for (uint64_t e = 0; e < kSpan; ++e) {
      float a, b;
      std::memcpy(&a, want.data() + at + e * 4, 4);
      std::memcpy(&b, got.data() + at + e * 4, 4);
      if (to_bits(a) == to_bits(b)) continue;
      if (a != a && b != b) {
        ++*nan_payloads;
        continue;
      }
      report(array, e, to_bits(a), to_bits(b));
    }
  }
  const Precision p = s.node.copy.precision;
  for (uint64_t e = 0; e < kSpan; ++e) {
    uint16_t a, b;
    std::memcpy(&a, want.data() + s.c_at + e * 2, 2);
    std::memcpy(&b, got.data() + s.c_at + e * 2, 2);
    if (a == b) continue;
    if (is_nan_half(p, a) && is_nan_half(p, b)) {
      ++*nan_payloads;
      continue;
    }
    report("copy", e, a, b);
  }
  return bad;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::pair<RangeOp, bool> kinds[] = {
      {RangeOp::UPDATE_SGD, false},          {RangeOp::UPDATE_SGD, true},
      {RangeOp::UPDATE_SGD_MOMENTUM, false}, {RangeOp::UPDATE_SGD_MOMENTUM, true},
      {RangeOp::UPDATE_SGD_NESTEROV, false}, {RangeOp::UPDATE_SGD_NESTEROV, true},
      {RangeOp::UPDATE_ADAM, true},          {RangeOp::UPDATE_ADAMW, false},
      {RangeOp::UPDATE_LION, false}};
  for (const auto& [op, l2] : kinds) {
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
        for (bool model_grads : {true, false}) {
          Case k;
          k.op = op;
          k.l2 = l2;
          k.copy = p;
          k.rounding = r;
          k.model_grads = model_grads;
          out.push_back(k);  // defaults: one block, 16K chunks, prefetch steps of 256
          k.group = Group::kBiasLike;
          k.chunk = 192;  // chunks (work items) that cut tensors, no prefetch: one range per chunk
          k.prefetch = 0;
          out.push_back(k);
          k.group = Group::kWeight;
          k.hyper = true;  // items per tensor, a masked tensor, per-tensor steps
          k.prefetch = 256;
          out.push_back(k);
        }
        if (op == RangeOp::UPDATE_SGD && !l2) {  // w reaches the copy unchanged: its ties and edges
          Case k;
          k.op = op;
          k.group = Group::kBiasLike;
          k.copy = p;
          k.rounding = r;
          k.zero_lr = true;
          out.push_back(k);
        }
      }
    }
  }
  return out;
}

TEST(FusedUpdate, EveryTargetEqualsTheScalarDefinition) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  const std::vector<Case> all = cases();
  std::string exercised;
  for (int64_t target : targets) {
    SCOPED_TRACE(hwy::TargetName(target));
    const testing_util::OnlySimdTarget only(target);
    ASSERT_EQ(std::string(cpu::current_simd_target()), hwy::TargetName(target));  // dispatch runs this target
    int failures = 0, nan_scalar = 0;
    for (const Case& k : all) {
      FusedSetup s(k);
      const std::vector<char> fused = s.run(k);
      std::vector<char> scalar(s.arena, s.arena + s.bytes);
      s.reference(k, scalar.data());
      const std::string what = std::string(hwy::TargetName(target)) + " " + describe(k);
      failures += differences(s, scalar, fused, &nan_scalar, what + " (against the scalar definition)");
      // The padding's copy keeps its marker (never written), and so does a masked tensor's.
      const uint16_t* c = reinterpret_cast<const uint16_t*>(fused.data() + s.c_at);
      EXPECT_EQ(c[40], 0xdeadu) << what;
      EXPECT_EQ(c[kSpan - 1], 0xdeadu) << what;
      if (k.hyper) {
        EXPECT_EQ(c[1070], 0xdeadu) << what;
      }
      if (failures > 20) break;
    }
    EXPECT_EQ(failures, 0);
    std::cout << "[fused update] " << hwy::TargetName(target) << ": NaN results with another payload than the "
              << "scalar definition's " << nan_scalar << std::endl;
    exercised += (exercised.empty() ? "" : " ") + std::string(hwy::TargetName(target));
  }
  RecordProperty("highway_targets", exercised);
  std::cout << "[fused update] " << all.size() << " cases; Highway targets exercised: " << exercised << std::endl;
}

}  // namespace
}  // namespace renaissance
