// Slots of the scalar regions. Hyperparameters and per-step state live in the arena so that
// kernels read them through pointers: a captured CUDA graph stays valid when lr or the loss
// scale changes, and the step counter and bias corrections are advanced on the device.
//
// Hyperparameter groups (Task::optimizer_groups): S_SCALAR_FP32 and S_SCALAR_FP64 hold H blocks
// of kNumScalarF32 / kNumScalarF64 slots, block h at h * kNum..; a tensor's update reads only its
// group's block, so equal configurations give the bits of H = 1. The task-wide scalars are
// written into EVERY block (host: kInvLossScale, with the sign of the block's group's maximize,
// and kMaxGradNormD; device: CLIP_COEFFICIENT writes
// kClipCoefficient into each block, and ADVANCE_STEP advances each block's bias corrections from
// that block's betas); kGradNormD is read from block 0. S_SCALAR_INT32 (step counters, the
// non-finite flag) is task-wide: one block.
#pragma once

#include <cstdint>

namespace renaissance {

enum ScalarF32 : int {
  kLr = 0,
  kWeightDecay,
  kDecayFactor,  // 1 - lr*wd, formed in double on the host whenever lr or wd is set
  kMomentum,
  kBeta1,
  kBeta2,
  kOneMinusBeta1,  // formed in double from the configured beta1 (never 1.0f - beta1f)
  kOneMinusBeta2,
  kEps,
  kInvLossScale,  // 1/scale, formed in double; -(1/scale) for a maximizing group (docs/math.md)
  kBiasCorrection1,  // 1/(1 - beta1^t), advanced on the device each applied step
  kBiasCorrection2,
  // Global gradient-norm clipping (docs/math.md): min(1, max_norm/(total + 1e-6)) rounded to
  // float once, written on the device each step; 1.0f when clipping is off (x*1.0f == x).
  kClipCoefficient,
  // The slots from here on are not stored in checkpoints (SCAL holds the first
  // kNumStoredScalarF32 slots of each block): each is formed again before it is read.
  // torch's SGD dampening: 1 - dampening, formed in double on the host (never 1.0f - dampeningf).
  kOneMinusDampening,
  // The factor of ĝ' in the momentum update of this step (docs/math.md): 1 at a tensor's first
  // applied step (torch's buffer = clone(ĝ')), kOneMinusDampening after it. Written on the
  // device by every applied step's advance (math::advance_step) before the update reads it.
  kMomentumGradFactor,
  // Muon's host-owned slots (docs/math.md, "Muon"), formed from the configuration whenever it is
  // set, like kOneMinusDampening (not stored in checkpoints). Every kind's block has them.
  kAuxLr,                 // the auxiliary AdamW's lr: muon's bias-like node reads it (NodeFlags::aux)
  kMuonOneMinusMomentum,  // 1 - momentum, formed in double (never 1.0f - momentumf)
  kNesterov,              // 1.0f: u = lerp(ĝ, m, momentum); 0.0f: u = m
  kNsSteps,               // Newton–Schulz steps, a whole number in [1, 100] (exact as a float)
  kNsEps,                 // the normalisation's eps: X = u / max(‖u‖_F, eps)
  kNsA,                   // the Newton–Schulz coefficients (a, b, c)
  kNsB,
  kNsC,
  // The auxiliary AdamW's decoupled weight decay (aux_weight_decay) and its factor
  // 1 - aux_lr*aux_wd, formed in double (exactly 1 for wd 0): CoeffSet::kAux's Coeffs take lr,
  // wd and decay from kAuxLr, kAuxWeightDecay, kAuxDecayFactor (math::make_coeffs).
  kAuxWeightDecay,
  kAuxDecayFactor,
  kNumScalarF32
};
// Muon's slots run from here to the end of the block (host-owned, after the device's).
constexpr int kFirstMuonScalarF32 = kAuxLr;
// The fp32 slots a checkpoint's SCAL section holds per block (docs/checkpoint-format.md).
constexpr int kNumStoredScalarF32 = kOneMinusDampening;

// Which lr, weight decay and decay factor an update reads from its scalar block
// (math::make_coeffs builds them; coeff_set in graph.h picks one per node). Every other slot is
// read the same way by all three.
enum class CoeffSet : int32_t {
  kBiasLike = 0,  // kLr; wd 0 and decay exactly 1: never weight-decayed
  kWeight = 1,    // kLr, kWeightDecay, kDecayFactor
  kAux = 2,       // a muon step's auxiliary AdamW: kAuxLr, kAuxWeightDecay, kAuxDecayFactor
};

enum ScalarI32 : int {
  kStep = 0,         // applied steps t
  kHasNonFinite,     // 1 when the last check found NaN/Inf in G: the step is skipped
  kSkippedSteps,     // total skipped steps
  kNumScalarI32
};

enum ScalarF64 : int {
  kBeta1D = 0,  // beta1, beta2 as configured, for beta^t in double
  kBeta2D,
  kWeightDecayD,  // the trust ratio is computed in double from the configured values
  kEpsD,
  kTrustCoefficientD,
  kMaxGradNormD,  // clipping's max_norm as configured (0: off)
  kGradNormD,     // the total ‖ĝ‖ of the last step (clipping on), for Task::last_grad_norm()
  kNumScalarF64
};

// Host/device-visible pointers to the three scalar regions.
struct ScalarPtrs {
  float* f32;
  int32_t* i32;
  double* f64;
};

// One tile of the canonical norm reduction (math/norm_reduction.h): a run of at most kNormTile
// elements of one tensor of the group a norm pass covers. `start` is relative to the first
// element of that group.
struct NormTile {
  int64_t start;
  int32_t length;
  int32_t tensor;  // index of the tensor within its group
};
static_assert(sizeof(NormTile) == 16, "NormTile is shared with device code");

// The tiles of one tensor: tiles [first_tile, first_tile + tile_count).
struct NormTensor {
  int64_t first_tile;
  int64_t tile_count;
};
static_assert(sizeof(NormTensor) == 16, "NormTensor is shared with device code");

// One work item of an update over a group span with H > 1 hyperparameter groups: at most
// kHyperItemElements elements of one (role, group) run, all reading scalar block `block`.
// `start` is relative to the first element of the group span; runs start on the 64-element
// region alignment and hold a multiple of 64 elements, so every item does too.
struct HyperItem {
  int64_t start;
  int32_t count;
  int32_t block;
};
static_assert(sizeof(HyperItem) == 16, "HyperItem is shared with device code");
constexpr int64_t kHyperItemElements = 16384;

// One Muon matrix (T_MUON_MATRICES, written once at compile()): weight-group tensor t (entry t,
// TensorInfo::index_in_group order, so N[t] is its adjusted lr) viewed as the row-major matrix
// rows x cols = (shape[0], prod(shape[1:])) (a 1-D tensor of n elements is 1 x n, a scalar 1 x 1),
// its first element `start` elements into the weight group span, and the factor of its adjusted
// lr: N[t] = float(double(lr) * adjust) with adjust = sqrt(max(1, rows/cols)) (adjust_lr
// original) or 0.2 * sqrt(max(rows, cols)) (match_rms_adamw), in double (docs/math.md).
struct MuonMatrix {
  int64_t start;
  int64_t rows;
  int64_t cols;
  double adjust;
};
static_assert(sizeof(MuonMatrix) == 32, "MuonMatrix is shared with device code");

// The fp32 scratch one matrix's Newton–Schulz needs (T_MUON_SCRATCH is sized for the largest):
// with r = min(rows, cols) and c = max(rows, cols), X (r x c) at 0, X^T (c x r) at r*c, Q = B X
// (r x c) at 2rc, A = X X^T (r x r) at 3rc, P = A A at 3rc + r^2 and B = b A + c P at 3rc + 2r^2.
constexpr uint64_t muon_scratch_floats(uint64_t rows, uint64_t cols) {
  const uint64_t r = rows < cols ? rows : cols, c = rows < cols ? cols : rows;
  return 3 * r * c + 3 * r * r;
}

}  // namespace renaissance
