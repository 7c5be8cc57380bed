// How a kernel that updates an arena quad (span elements e0 .. e0+3, e0 a multiple of 4) finds
// the model-copy bits of its new masters: the tensor of each element, its index in
// that tensor and the stochastic-rounding words math/precision.h's sr_random_word assigns it (one
// Philox call per 8 elements of a tensor, so a quad takes half of one call, or of two when its
// tensor starts off a multiple of 8), or a warp pair of quads shares one call ("Warp pairs" below).
// Host and device code (RN_HD): the CUDA update kernels call it (backend_cuda/model_copy.cuh),
// and tests/core/test_model_copy_key.cc runs the very same functions on the CPU against the scalar
// definitions, on layouts whose tensors start off multiples of 8, share quads and are cut.
//
// The lookup: a node's CopyTensor list (span order) and a chunk index (tensor_chunks: per
// kCopyChunk span elements, the first tensor that ends after the chunk's start). A lookup reads
// one chunk entry and scans forward, which is one step inside a large tensor.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "renaissance/graph.h"
#include "renaissance/math/host_device.h"
#include "renaissance/math/precision.h"

namespace renaissance {

// A fully unrolled loop over a quad's elements on the GPU, so the per-element array stays in
// registers (a rolled loop would put it in local memory); nothing on the host.
#if defined(__CUDACC__)
#define RN_COPY_UNROLL _Pragma("unroll")
#else
#define RN_COPY_UNROLL
#endif

// Span elements per entry of a model copy's chunk index.
constexpr uint64_t kCopyChunk = 1024;
static_assert(kCopyChunk % 4 == 0, "a quad must never straddle two chunks (GradTableRef::chunked_quad)");

// A node's tensor table: its CopyTensor list and their chunk index (in the memory of whoever
// reads it: the arena, or host vectors in tests).
struct CopyLookup {
  const CopyTensor* tensors = nullptr;
  const int32_t* chunks = nullptr;
  uint32_t count = 0;

  // The first tensor that ends after span element e (count when none does); e must lie in the
  // span the chunk index covers.
  RN_HD uint32_t first_ending_after(uint64_t e) const {
    if (count == 0) return 0;
    uint32_t i = static_cast<uint32_t>(chunks[e / kCopyChunk]);
    while (i < count && tensors[i].begin + tensors[i].numel <= e) ++i;
    return i;
  }
  // The tensor holding span element e, or count when e is padding (outside every tensor).
  RN_HD uint32_t find(uint64_t e) const {
    if (count == 0) return 0;
    const uint32_t i = first_ending_after(e);
    return i < count && tensors[i].begin <= e ? i : count;
  }
};

// The chunk index of a tensor list in span order over a span of `span` elements: entry k is the
// first tensor ending after k * kCopyChunk. It covers the span and any tensor beyond it. Used for
// the tables of MemoryPlan (T_TENSOR_CHUNKS) and for tests.
inline std::vector<int32_t> tensor_chunks(const std::vector<CopyTensor>& tensors, uint64_t span) {
  for (const CopyTensor& t : tensors) span = t.begin + t.numel > span ? t.begin + t.numel : span;
  if (tensors.size() > static_cast<size_t>(INT32_MAX)) throw std::length_error("tensor list: too many tensors");
  std::vector<int32_t> chunks((span + kCopyChunk - 1) / kCopyChunk);
  size_t i = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    while (i < tensors.size() && tensors[i].begin + tensors[i].numel <= k * kCopyChunk) ++i;
    chunks[k] = static_cast<int32_t>(i);
  }
  return chunks;
}

// The lookup of a tensor table (plan.h) in an arena at `arena` (the host's on the CPU, the
// device's on CUDA).
RN_HD CopyLookup table_lookup(const char* arena, const TensorTable& table) {
  return CopyLookup{reinterpret_cast<const CopyTensor*>(arena + table.tensors.offset),
                    reinterpret_cast<const int32_t*>(arena + table.chunks.offset),
                    static_cast<uint32_t>(table.tensors.count)};
}

// TaskOptions::gradient_table: a node's G read through the per-parameter address table (graph.h,
// GraphNode::grad.table). address(e) is the address of span element e's gradient (element
// bytes `elem` each), or 0 when e is padding, which reads +0.0. Host and device code.
//
// chunk_at (CUDA, to cut the lookup's cost; null on the CPU): the node's chunk addresses for this
// step, entry k = chunk_address(k, span, elem), written at the start of every step by one kernel
// (backend_cuda/grad_chunks.cu) after the caller's table is in place. A reader then needs one
// load (chunk_at[e / kCopyChunk]) before its G load instead of the chunk entry, the tensor
// entries and table[param]; a chunk whose elements are not in one tensor keeps the full lookup.
struct GradTableRef {
  CopyLookup lookup;
  const uint64_t* table = nullptr;  // S_GRAD_TABLE: one address per parameter
  const uint64_t* chunk_at = nullptr;

  // The address of span element e's gradient, e inside tensor t (one of lookup's).
  RN_HD uint64_t address_in(const CopyTensor& t, uint64_t e, uint32_t elem) const {
    return table[t.param] + (t.first + (e - t.begin)) * elem;
  }
  // The address of span elements e .. e+n-1 when they lie in one tensor, else 0.
  RN_HD uint64_t run_address(uint64_t e, uint64_t n, uint32_t elem) const {
    const uint32_t i = lookup.find(e);
    if (i == lookup.count || e + n > lookup.tensors[i].begin + lookup.tensors[i].numel) return 0;
    return address_in(lookup.tensors[i], e, elem);
  }
  // The address of span element e's gradient, or 0 when e is padding (which reads +0.0).
  RN_HD uint64_t address(uint64_t e, uint32_t elem) const { return run_address(e, 1, elem); }
  // The address of chunk k's first element (element k * kCopyChunk) when every element of the
  // chunk below the span's end, rounded up to a whole quad, lies in one tensor; else 0 (padding
  // or a tensor boundary inside the chunk, or k beyond the span). With the round-up a quad that
  // starts below the span never leaves the run (spans hold multiples of 64 elements anyway).
  RN_HD uint64_t chunk_address(uint64_t k, uint64_t span, uint32_t elem) const {
    const uint64_t e = k * kCopyChunk, end = (span + 3) / 4 * 4;
    if (e >= end) return 0;
    return run_address(e, end - e < kCopyChunk ? end - e : kCopyChunk, elem);
  }
  // address(e) through chunk_at (set), for e below the span: the same value.
  RN_HD uint64_t chunked_address(uint64_t e, uint32_t elem) const {
    const uint64_t at = chunk_at[e / kCopyChunk];
    return at != 0 ? at + (e % kCopyChunk) * elem : address(e, elem);
  }
  // The address of quad e0 .. e0+3 (e0 a multiple of 4, below the span) through chunk_at (set)
  // when its chunk lies in one tensor, else 0: the caller then takes the element-wise path
  // (run_address and address). A quad never straddles chunks (kCopyChunk is a multiple of 4).
  RN_HD uint64_t chunked_quad(uint64_t e0, uint32_t elem) const {
    const uint64_t at = chunk_at[e0 / kCopyChunk];
    return at != 0 ? at + (e0 % kCopyChunk) * elem : 0;
  }
};

// The number of chunk addresses of a span of `span` elements (GradTableRef::chunk_at).
inline uint64_t grad_chunk_count(uint64_t span) { return (span + kCopyChunk - 1) / kCopyChunk; }

// One master x rounded into the copy's format with random word r (unused when nearest).
template <Precision kPrecision, Rounding kRounding>
RN_HD uint16_t round_copy(float x, uint32_t r) {
  if (kRounding == Rounding::kNearest) return math::f32_to_encoded_rne(kPrecision, x);
  return math::f32_to_encoded_sr(kPrecision, x, r);
}

// The applied step that keys a tensor's rounding: its own count with tensor_mask (steps != null),
// else the task's.
RN_HD uint64_t copy_step(const int32_t* steps, uint32_t task_t, uint32_t param) {
  return steps != nullptr ? static_cast<uint32_t>(steps[param]) : task_t;
}

// Half h (0..15) of two consecutive Philox blocks a, b as a rounding word (math::sr_block_word).
// The words are selected by value: choosing a reference to a or b would make the GPU keep both
// blocks in local memory.
RN_HD uint32_t copy_word(const math::Philox4x32& a, const math::Philox4x32& b, uint32_t h) {
  const uint32_t j = (h >> 1) & 3u;
  const uint32_t wa = math::sr_block_output(a, j), wb = math::sr_block_output(b, j);
  return math::sr_half_word(h < 8 ? wa : wb, h);
}

// Four masters rounded into the copy's format with their random words r (unused when nearest).
template <Precision kPrecision, Rounding kRounding>
RN_HD void round_quad(float x0, float x1, float x2, float x3, const uint32_t r[4], uint16_t out[4]) {
  out[0] = round_copy<kPrecision, kRounding>(x0, r[0]);
  out[1] = round_copy<kPrecision, kRounding>(x1, r[1]);
  out[2] = round_copy<kPrecision, kRounding>(x2, r[2]);
  out[3] = round_copy<kPrecision, kRounding>(x3, r[3]);
}

// Span element e's copy bits into *out; false (nothing to write) when e is padding.
template <Precision kPrecision, Rounding kRounding>
RN_HD bool copy_one(const CopyLookup& lookup, uint64_t seed, const int32_t* steps, uint32_t task_t, uint64_t e,
                    float x, uint16_t* out) {
  const uint32_t i = lookup.find(e);
  if (i == lookup.count) return false;
  const CopyTensor& t = lookup.tensors[i];
  uint32_t r = 0;
  if (kRounding == Rounding::kStochastic) {
    const uint32_t param = static_cast<uint32_t>(t.param);
    r = math::sr_random_word(seed, copy_step(steps, task_t, param), param, t.first + (e - t.begin));
  }
  *out = round_copy<kPrecision, kRounding>(x, r);
  return true;
}

// The rounding words of elements index .. index+3 of one tensor into r[4]: one Philox call when
// they lie in one 8-element block, two when the tensor's block grid is shifted against the arena's.
RN_HD void copy_quad_words(uint64_t seed, uint64_t step, uint32_t param, uint64_t index, uint32_t r[4]) {
  const uint64_t block = index / math::kSrBlockElements;
  const uint32_t s = static_cast<uint32_t>(index % math::kSrBlockElements);
  const math::Philox4x32 a = math::sr_random_block(seed, step, param, block);
  const math::Philox4x32 b = s + 4 <= math::kSrBlockElements ? a : math::sr_random_block(seed, step, param, block + 1);
  RN_COPY_UNROLL
  for (uint32_t j = 0; j < 4; ++j) r[j] = copy_word(a, b, s + j);
}

// Span elements e0 .. e0+3 inside one tensor: their copy bits into out[4] and true (stochastic:
// one or two Philox calls, copy_quad_words). false: the quad meets a tensor boundary or padding,
// and the caller writes it element by element with copy_one.
template <Precision kPrecision, Rounding kRounding>
RN_HD bool copy_quad(const CopyLookup& lookup, uint64_t seed, const int32_t* steps, uint32_t task_t, uint64_t e0,
                     float x0, float x1, float x2, float x3, uint16_t out[4]) {
  const uint32_t i = lookup.find(e0);
  if (i == lookup.count || e0 + 4 > lookup.tensors[i].begin + lookup.tensors[i].numel) return false;
  const CopyTensor& t = lookup.tensors[i];
  uint32_t r[4] = {0, 0, 0, 0};
  if (kRounding == Rounding::kStochastic) {
    const uint32_t param = static_cast<uint32_t>(t.param);
    copy_quad_words(seed, copy_step(steps, task_t, param), param, t.first + (e0 - t.begin), r);
  }
  round_quad<kPrecision, kRounding>(x0, x1, x2, x3, r, out);
  return true;
}

// ---- Warp pairs (CUDA stochastic rounding): one Philox call per 8 elements, not per quad. ----
//
// A quad takes half of a Philox block (copy_quad_words), so a thread per quad would compute each
// block twice. The CUDA update kernels instead let lanes 2k and 2k+1 of a warp update quads q and
// q+1 (q even), the two halves of one block when their 8 elements lie in one tensor at an index
// that is a multiple of 8: the "lower" quad (elements 0..3 of the block, output words 0 and 1)
// and the "upper" one (4..7, words 2 and 3). Each lane holds two such pairs and computes the
// block of one of them; the partners swap the two words the other needs (one warp shuffle each).
// Anything else (a pair across a tensor boundary or padding, a tensor starting off a multiple of
// 8) takes copy_quad / copy_one, so the bits are those of the scalar definition either way.

// The Philox block of a quad pair, as one lane sees it from its own quad.
struct CopyPairKey {
  bool whole = false;  // both quads of the pair lie in one tensor, as one Philox block
  uint32_t param = 0;
  uint64_t step = 0;
  uint64_t block = 0;  // the block number within the tensor (index / 8)
};

// The pair key of the quad at span elements e0 .. e0+3 (e0 a multiple of 4, inside the lookup's
// span), which is the upper quad of its pair when `upper`. Both lanes of a pair compute the same
// key from their own quads: the lower quad's test (index % 8 == 0, e0 + 8 inside the tensor) and
// the upper's (index % 8 == 4, e0 - 4 inside the tensor) both say "elements e .. e+7 of the pair
// lie in one tensor at index 8 * block", and then both quads find that tensor.
RN_HD CopyPairKey copy_pair_key(const CopyLookup& lookup, const int32_t* steps, uint32_t task_t, uint64_t e0,
                                bool upper) {
  CopyPairKey key;
  const uint32_t i = lookup.find(e0);
  if (i == lookup.count) return key;
  const CopyTensor& t = lookup.tensors[i];
  const uint64_t low = upper ? e0 - 4 : e0;  // the pair's first element
  const uint64_t index = t.first + (e0 - t.begin);
  if (index % math::kSrBlockElements != (upper ? 4u : 0u) || low < t.begin || low + 8 > t.begin + t.numel) return key;
  key.whole = true;
  key.param = static_cast<uint32_t>(t.param);
  key.step = copy_step(steps, task_t, key.param);
  key.block = index / math::kSrBlockElements;
  return key;
}

// The warp exchange, lane side (the shuffle itself is the caller's): a lane holds the a-quad and
// the b-quad of a pass; the even lane draws the block of the a-pair (its a-quad is the lower
// one), the odd lane that of the b-pair (its b-quad is the upper one); p is the block this lane
// drew (zeros when its pair is not whole). The two words this lane sends its partner are those
// of the partner's quad in p: words 2, 3 (the odd lane's a-quad) from the even lane, words 0, 1
// (the even lane's b-quad) from the odd lane. Everything is chosen by value (a reference or an
// array indexed by a lane-dependent value would put it in local memory on the GPU).
struct PairSent {
  uint32_t w0, w1;
};
RN_HD PairSent pair_sent_words(bool odd, const math::Philox4x32& p) {
  return PairSent{odd ? p.v[0] : p.v[2], odd ? p.v[1] : p.v[3]};
}
// This lane's two words of its a-quad (a0, a1) and b-quad (b0, b1), from its own block p and
// the two words its partner sent.
struct PairLaneWords {
  uint32_t a0, a1, b0, b1;
};
RN_HD PairLaneWords pair_lane_words(bool odd, const math::Philox4x32& p, PairSent got) {
  return PairLaneWords{odd ? got.w0 : p.v[0], odd ? got.w1 : p.v[1], odd ? p.v[2] : got.w0, odd ? p.v[3] : got.w1};
}
// The block this lane draws, from its a-quad's and b-quad's pair keys (zeros when not whole).
RN_HD math::Philox4x32 pair_lane_block(bool odd, uint64_t seed, const CopyPairKey& ka, const CopyPairKey& kb) {
  if (!(odd ? kb.whole : ka.whole)) return math::Philox4x32{{0u, 0u, 0u, 0u}};
  return math::sr_random_block(seed, odd ? kb.step : ka.step, odd ? kb.param : ka.param, odd ? kb.block : ka.block);
}

// The four rounding words of a quad from its two output words (words 0, 1 of the block for the
// lower quad, 2, 3 for the upper): halves 2j and 2j+1 of word j, as sr_block_word takes them.
RN_HD void pair_quad_words(uint32_t w0, uint32_t w1, uint32_t r[4]) {
  r[0] = math::sr_half_word(w0, 0);
  r[1] = math::sr_half_word(w0, 1);
  r[2] = math::sr_half_word(w1, 0);
  r[3] = math::sr_half_word(w1, 1);
}

// The copy bits of a quad whose pair is whole, from its two output words.
template <Precision kPrecision>
RN_HD void copy_pair_quad(uint32_t w0, uint32_t w1, float x0, float x1, float x2, float x3, uint16_t out[4]) {
  uint32_t r[4];
  pair_quad_words(w0, w1, r);
  round_quad<kPrecision, Rounding::kStochastic>(x0, x1, x2, x3, r, out);
}

}  // namespace renaissance
