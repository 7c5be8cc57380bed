// The coefficient set of an element-wise update (scalars.h's CoeffSet, graph.h's coeff_set):
// which scalar slots each set's lr, wd, L2 flag and decay come from, and a muon step's auxiliary
// AdamW node (NodeFlags::aux) through the CPU backend's element-wise path (plain, amsgrad and
// fused loops) against the Adam and AdamW formulas written out here with the aux slots' values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backend_cpu/cpu_ops.h"
#include "renaissance/graph.h"
#include "renaissance/math/update_rules.h"
#include "renaissance/scalars.h"

namespace renaissance {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// A scalar block whose every slot holds its own value (slot i: 1 + i/4, exact in float).
std::vector<float> distinct_block() {
  std::vector<float> s(kNumScalarF32);
  for (int i = 0; i < kNumScalarF32; ++i) s[i] = 1.0f + 0.25f * static_cast<float>(i);
  return s;
}

TEST(CoeffSet, EachSetReadsItsOwnSlots) {
  const std::vector<float> s = distinct_block();
  const auto id = [](float x) { return x; };
  const math::Coeffs<float> bias = math::make_coeffs<float>(s.data(), CoeffSet::kBiasLike, id);
  const math::Coeffs<float> weight = math::make_coeffs<float>(s.data(), CoeffSet::kWeight, id);
  const math::Coeffs<float> aux = math::make_coeffs<float>(s.data(), CoeffSet::kAux, id);
  EXPECT_EQ(bias.lr, s[kLr]);
  EXPECT_EQ(bits(bias.wd), 0u);
  EXPECT_FALSE(bias.l2_term);
  EXPECT_EQ(bias.decay, 1.0f);
  EXPECT_EQ(weight.lr, s[kLr]);
  EXPECT_EQ(weight.wd, s[kWeightDecay]);
  EXPECT_TRUE(weight.l2_term);
  EXPECT_EQ(weight.decay, s[kDecayFactor]);
  EXPECT_EQ(aux.lr, s[kAuxLr]);
  EXPECT_EQ(aux.wd, s[kAuxWeightDecay]);
  EXPECT_TRUE(aux.l2_term);
  EXPECT_EQ(aux.decay, s[kAuxDecayFactor]);
  // The rest is the same slot in every set.
  for (const math::Coeffs<float>* c : {&bias, &weight, &aux}) {
    EXPECT_EQ(c->momentum, s[kMomentum]);
    EXPECT_EQ(c->beta1, s[kBeta1]);
    EXPECT_EQ(c->beta2, s[kBeta2]);
    EXPECT_EQ(c->one_minus_beta1, s[kOneMinusBeta1]);
    EXPECT_EQ(c->one_minus_beta2, s[kOneMinusBeta2]);
    EXPECT_EQ(c->eps, s[kEps]);
    EXPECT_EQ(c->inv_scale, s[kInvLossScale]);
    EXPECT_EQ(c->bc1, s[kBiasCorrection1]);
    EXPECT_EQ(c->bc2, s[kBiasCorrection2]);
    EXPECT_EQ(c->clip, s[kClipCoefficient]);
    EXPECT_EQ(c->grad_factor, s[kMomentumGradFactor]);
  }
  // A zero weight decay adds no L2 term, in either set that has one.
  std::vector<float> z = s;
  z[kWeightDecay] = 0.0f;
  z[kAuxWeightDecay] = 0.0f;
  EXPECT_FALSE(math::make_coeffs<float>(z.data(), CoeffSet::kWeight, id).l2_term);
  EXPECT_FALSE(math::make_coeffs<float>(z.data(), CoeffSet::kAux, id).l2_term);
}

TEST(CoeffSet, ChosenFromTheNode) {
  GraphNode node;
  node.group = Group::kWeight;
  EXPECT_EQ(coeff_set(node), CoeffSet::kWeight);
  node.group = Group::kBiasLike;
  EXPECT_EQ(coeff_set(node), CoeffSet::kBiasLike);
  node.flags.aux = true;
  EXPECT_EQ(coeff_set(node), CoeffSet::kAux);
}

constexpr uint64_t kN = 1024;  // elements: several SIMD vectors and a scalar-free span

// An aux node over kN elements: Adam (L2) or AdamW, with amsgrad's VMAX or not, G fp32 or bf16
// (bf16 G takes the fused loop). The weight and aux slots differ, so that reading either
// set's lr, wd or decay in place of the other changes the result.
struct AuxCase {
  RangeOp op;
  bool amsgrad;
  bool bf16_grad;
};

void expect_aux_node_reads_the_aux_slots(const AuxCase& k) {
  SCOPED_TRACE(std::string(range_op_name(k.op)) + (k.amsgrad ? " amsgrad" : "") + (k.bf16_grad ? " g=bf16" : " g=fp32"));
  const uint64_t w_at = 0, g_at = kN * 4, m_at = 2 * kN * 4, v_at = 3 * kN * 4, x_at = 4 * kN * 4;
  std::vector<uint64_t> storage(5 * kN / 2 + 64, 0);
  char* arena = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(storage.data()) + 255) / 256 * 256);
  float* w = reinterpret_cast<float*>(arena + w_at);
  float* m = reinterpret_cast<float*>(arena + m_at);
  float* v = reinterpret_cast<float*>(arena + v_at);
  float* x = reinterpret_cast<float*>(arena + x_at);
  std::vector<float> g(kN);
  for (uint64_t i = 0; i < kN; ++i) {
    const float t = static_cast<float>(i % 37) - 18.0f;
    w[i] = 0.5f + 0.01f * t;
    g[i] = 0.125f * t + 0.0625f;  // exact in bf16
    m[i] = 0.001f * t;
    v[i] = 0.0001f * static_cast<float>(i % 11);
    x[i] = 0.00015f * static_cast<float>(i % 7);
  }
  if (k.bf16_grad) {
    uint16_t* gb = reinterpret_cast<uint16_t*>(arena + g_at);
    for (uint64_t i = 0; i < kN; ++i) gb[i] = static_cast<uint16_t>(bits(g[i]) >> 16);
  } else {
    std::memcpy(arena + g_at, g.data(), kN * 4);
  }
  std::vector<float> s(kNumScalarF32, 0.0f);
  s[kLr] = 0.25f;
  s[kWeightDecay] = 0.5f;
  s[kDecayFactor] = 0.875f;
  s[kAuxLr] = 0.003f;
  s[kAuxWeightDecay] = 0.2f;
  s[kAuxDecayFactor] = static_cast<float>(1.0 - 0.003 * 0.2);
  s[kBeta1] = 0.9f;
  s[kBeta2] = 0.999f;
  s[kOneMinusBeta1] = static_cast<float>(1.0 - 0.9);
  s[kOneMinusBeta2] = static_cast<float>(1.0 - 0.999);
  s[kEps] = 1e-8f;
  s[kInvLossScale] = 0.5f;
  s[kBiasCorrection1] = 1.5f;
  s[kBiasCorrection2] = 7.25f;
  s[kClipCoefficient] = 1.0f;
  s[kMomentumGradFactor] = 1.0f;
  std::vector<int32_t> i32(kNumScalarI32, 0);

  // Expected: the formulas with aux_lr, aux_wd (Adam's L2 term) and aux_decay (AdamW's decay).
  const bool decoupled = k.op == RangeOp::UPDATE_ADAMW;
  std::vector<float> we(w, w + kN), me(m, m + kN), ve(v, v + kN), xe(x, x + kN);
  for (uint64_t i = 0; i < kN; ++i) {
    float gp = (g[i] * s[kInvLossScale]) * s[kClipCoefficient];
    if (decoupled) {
      we[i] = we[i] * s[kAuxDecayFactor];
    } else {
      gp = gp + s[kAuxWeightDecay] * we[i];
    }
    me[i] = s[kBeta1] * me[i] + s[kOneMinusBeta1] * gp;
    ve[i] = s[kBeta2] * ve[i] + s[kOneMinusBeta2] * (gp * gp);
    float vd = ve[i];
    if (k.amsgrad) {
      xe[i] = xe[i] < ve[i] ? ve[i] : xe[i];
      vd = xe[i];
    }
    we[i] = we[i] - (s[kAuxLr] * (me[i] * s[kBiasCorrection1])) / (std::sqrt(vd * s[kBiasCorrection2]) + s[kEps]);
  }

  GraphNode node;
  node.kind = NodeKind::kRange;
  node.range_op = k.op;
  node.group = Group::kBiasLike;
  node.flags.aux = true;
  node.flags.weight_decay_mode = decoupled ? WeightDecayMode::kDecoupled : WeightDecayMode::kL2;
  node.span(Family::kW) = {w_at, kN};
  node.span(Family::kG) = {g_at, kN};
  node.span(Family::kM) = {m_at, kN};
  node.span(Family::kV) = {v_at, kN};
  if (k.amsgrad) node.span(Family::kVmax) = {x_at, kN};
  node.grad.encoding = k.bf16_grad ? Precision::kBf16 : Precision::kFp32;
  cpu::CpuContext ctx;
  ctx.arena = arena;
  ctx.threads = 2;
  ctx.tuning.chunk_elements = 256;
  ctx.scalars = ScalarPtrs{s.data(), i32.data(), nullptr};
  if (decoupled) {
    cpu::run_UPDATE_ADAMW(ctx, node);
  } else {
    cpu::run_UPDATE_ADAM(ctx, node);
  }
  int failures = 0;
  for (uint64_t i = 0; i < kN && failures < 5; ++i) {
    if (bits(w[i]) != bits(we[i]) || bits(m[i]) != bits(me[i]) || bits(v[i]) != bits(ve[i]) ||
        (k.amsgrad && bits(x[i]) != bits(xe[i]))) {
      ++failures;
      ADD_FAILURE() << "element " << i << ": w " << w[i] << " expected " << we[i] << ", m " << m[i] << " expected "
                    << me[i];
    }
  }
}

TEST(CoeffSet, AuxNodeUpdatesWithTheAuxSlots) {
  for (RangeOp op : {RangeOp::UPDATE_ADAM, RangeOp::UPDATE_ADAMW}) {
    for (bool amsgrad : {false, true}) expect_aux_node_reads_the_aux_slots({op, amsgrad, false});
    expect_aux_node_reads_the_aux_slots({op, false, true});  // the fused loop
  }
}

}  // namespace
}  // namespace renaissance
