// One conformance cell, step by step (see runner.h). Per step and backend:
//   write lr, loss scale and all gradients; poison one G element when the cell injects there;
//   snapshot the whole arena; step(); snapshot again; then check
//   - the out-of-bounds guard: every byte outside the step's writable set is unchanged;
//   - the skip contract: a poisoned step is skipped, the others are not, t and the skip count;
//   - W, M, V and the LARS trust ratios against the float64 oracle (relative L2 per tensor);
//   - with CUDA: its whole arena equals the CPU's bit for bit (scratch and Muon's U excepted).
#include "conformance/runner.h"
#include "conformance/suite_state.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "renaissance/math/precision.h"
#include "renaissance/task.h"
#include "support/optimizer_cases.h"
#include "support/oracle_f32.h"
#include "support/oracle_f64.h"

namespace renaissance {
namespace conformance {

namespace {

struct ByteRange {
  uint64_t begin, end;
};

using testing_util::has_m;
using testing_util::has_v;
using testing_util::is_lars;

uint64_t region_end(const RegionInfo& r) { return r.offset + r.count * r.elem_size; }

// Names byte `x` of the arena for failure messages: region, element and whether it is padding,
// or the inter-region gap it falls into.
std::string where(const MemoryPlan& plan, uint64_t x) {
  int before = -1;
  uint64_t before_end = 0;
  for (int r = 0; r < kNumRegions; ++r) {
    const RegionInfo& info = plan.region(static_cast<Region>(r));
    if (!info.allocated) continue;
    if (x >= info.offset && x < region_end(info)) {
      const uint64_t idx = (x - info.offset) / info.elem_size;
      return std::string(region_name(static_cast<Region>(r))) + "[" + std::to_string(idx) + "]" +
             (idx >= info.used ? " (region padding)" : "");
    }
    if (region_end(info) <= x && region_end(info) >= before_end) {
      before = r;
      before_end = region_end(info);
    }
  }
  return "canary gap after " + std::string(before < 0 ? "arena start" : region_name(static_cast<Region>(before))) +
         " (+" + std::to_string(x - before_end) + " bytes)";
}

// The bytes one step may write (docs/design.md, docs/math.md). An applied step writes the tensor elements of
// W, M, V, the weight group's trust ratios N, the step counter and (Adam kinds) the bias
// corrections; a skipped step only the skip counter. Both write the non-finite flag and may
// use the LARS reduction scratch. Region padding is deliberately NOT writable: kernels run over
// whole padded regions, but padding must stay +0.0 bit for bit (all rules map 0 to +0), also
// the padding between the runs of H groups or of masked tensors inside a role region.
// With the tensor mask (`mask` non-empty) only the unmasked tensors' elements of W, the optimizer state and
// the model copy and their own step counts are writable: a masked tensor stays bit for bit.
// The step-dependent slots of every scalar block (H groups, or one per tensor with the mask).
std::vector<ByteRange> writable(const MemoryPlan& plan, OptimizerKind kind, bool skipped, bool clip,
                                const std::vector<ParamSpec>& params, const std::vector<int32_t>& mask) {
  std::vector<ByteRange> w;
  auto slot = [&](Region r, int index, uint64_t size) {
    const uint64_t off = plan.region(r).offset + static_cast<uint64_t>(index) * size;
    w.push_back({off, off + size});
  };
  // A step-dependent fp32 slot in every scalar block.
  auto block_slots = [&](int index) {
    for (int b = 0; b < plan.scalar_blocks(); ++b) slot(S_SCALAR_FP32, b * kNumScalarF32 + index, sizeof(float));
  };
  if (!skipped) {
    const uint64_t w0 = plan.region(W_BN_BIAS).offset;
    // Tensor by tensor: with H groups or the mask, runs of a role region are padded apart.
    for (const FamilyInfo& info : kFamilyTable) {
      const Family f = info.family;
      if (!info.step_state || !plan.has_family(f)) continue;
      for (size_t id = 0; id < params.size(); ++id) {
        if (!mask.empty() && mask[id]) continue;
        const uint64_t at = plan.tensor_offset(f, id);
        w.push_back({at, at + static_cast<uint64_t>(params[id].numel()) * sizeof(float)});
      }
    }
    if (plan.has_family(Family::kN)) {
      // Only the weight group is LARS-adapted: the bias-like ratios must stay as they were.
      // (A masked tensor's ratio is written too: it follows the partials its tiles kept.)
      for (size_t id = 0; id < params.size(); ++id) {
        // The plan's role (a muon plan moves a tensor marked "adamw" to the bias-like group).
        if (group_of(plan.tensor(id).spec.role) != Group::kWeight) continue;
        const uint64_t at = plan.tensor_offset(Family::kN, id);
        w.push_back({at, at + sizeof(float)});
      }
    }
    if (plan.region(T_MUON_UPDATE).allocated) {
      // Muon's update U of each unmasked weight-group tensor (its padding stays +0).
      const uint64_t u0 = plan.region(T_MUON_UPDATE).offset;
      for (size_t id = 0; id < params.size(); ++id) {
        if (group_of(plan.tensor(id).spec.role) != Group::kWeight || (!mask.empty() && mask[id])) continue;
        const uint64_t begin = u0 + plan.tensor(id).offset_in_group * sizeof(float);
        w.push_back({begin, begin + static_cast<uint64_t>(params[id].numel()) * sizeof(float)});
      }
    }
    if (plan.has_model_copy()) {
      // The bf16/fp16 copy of the same tensor elements (2 bytes each in W's layout); its padding
      // stays 0 and a skipped step leaves it alone.
      const uint64_t c0 = plan.region(C_MODEL_COPY).offset;
      for (size_t id = 0; id < params.size(); ++id) {
        if (!mask.empty() && mask[id]) continue;
        const uint64_t begin = c0 + (plan.tensor_offset(Family::kW, id) - w0) / sizeof(float) * sizeof(uint16_t);
        w.push_back({begin, begin + static_cast<uint64_t>(params[id].numel()) * sizeof(uint16_t)});
      }
    }
    if (!mask.empty()) {
      // S_TENSOR_INT32: mask[n] (the caller's), then steps[n]: an unmasked tensor's count advances.
      for (size_t id = 0; id < params.size(); ++id) {
        if (!mask[id]) slot(S_TENSOR_INT32, static_cast<int>(params.size() + id), sizeof(int32_t));
      }
    }
    slot(S_SCALAR_INT32, kStep, sizeof(int32_t));
    // The momentum's gradient factor (SGD dampening, docs/math.md): every applied step forms it.
    block_slots(kMomentumGradFactor);
    if (has_v(kind)) {
      block_slots(kBiasCorrection1);
      block_slots(kBiasCorrection2);
    }
  } else {
    slot(S_SCALAR_INT32, kSkippedSteps, sizeof(int32_t));
  }
  slot(S_SCALAR_INT32, kHasNonFinite, sizeof(int32_t));
  if (clip) {
    // Gradient-norm clipping (docs/math.md): its tile partials on every step (computed with the
    // check), the total norm and the coefficient on an applied step.
    const RegionInfo& t = plan.region(T_GRAD_NORM_PARTIALS);
    w.push_back({t.offset, region_end(t)});
    if (!skipped) {
      slot(S_SCALAR_FP64, kGradNormD, sizeof(double));
      block_slots(kClipCoefficient);
    }
  }
  // Scratch: the norm partials, the gradient table's chunk addresses (written by CUDA) and
  // Muon's Newton–Schulz scratch.
  for (Region r : {T_NORM_PARTIALS, T_GRAD_CHUNKS, T_MUON_SCRATCH}) {
    if (plan.region(r).allocated) w.push_back({plan.region(r).offset, region_end(plan.region(r))});
  }
  std::sort(w.begin(), w.end(), [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  return w;
}

// [0, total) minus the sorted ranges.
std::vector<ByteRange> complement(const std::vector<ByteRange>& sorted, uint64_t total) {
  std::vector<ByteRange> out;
  uint64_t cursor = 0;
  for (const ByteRange& r : sorted) {
    if (r.begin > cursor) out.push_back({cursor, r.begin});
    cursor = std::max(cursor, r.end);
  }
  if (cursor < total) out.push_back({cursor, total});
  return out;
}

// Bytes that belong to no region: the gaps left by rounding each region up to 256 bytes after
// the scalar slots, the packed N family and the LARS tables (the W/G/M/V regions are padded
// inside their own element count, so they leave none). Canary words go there.
std::vector<ByteRange> gaps(const MemoryPlan& plan) {
  std::vector<ByteRange> used;
  for (int r = 0; r < kNumRegions; ++r) {
    const RegionInfo& info = plan.region(static_cast<Region>(r));
    if (info.allocated && info.count > 0) used.push_back({info.offset, region_end(info)});
  }
  std::sort(used.begin(), used.end(), [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  return complement(used, plan.arena_bytes());
}

uint32_t canary_word(uint64_t offset) { return 0xCA11AB1Eu ^ static_cast<uint32_t>(offset * 0x9E3779B1u); }

struct Lane {
  BackendKind kind;
  std::unique_ptr<Task> task;
  // Arena-sized but uninitialised: only the ranges downloaded into them are ever touched, so
  // a bert_base cell does not page in two full copies of its arena per backend.
  std::unique_ptr<uint8_t[]> before, after;
  BackendResult* result;
  BackendOptions options;
};

void download_ranges(Task& task, const std::vector<ByteRange>& ranges, uint8_t* buf) {
  for (const ByteRange& r : ranges) {
    if (r.end > r.begin) task.backend().download(r.begin, buf + r.begin, r.end - r.begin);
  }
}

std::vector<float> read_floats(const uint8_t* arena, uint64_t offset, size_t n) {
  std::vector<float> v(n);
  if (n) std::memcpy(v.data(), arena + offset, n * sizeof(float));
  return v;
}

}  // namespace

double CellResult::max_err() const { return std::max({cpu.err_w, cpu.err_m, cpu.err_v, cpu.err_n}); }

CellResult run_cell(const Cell& cell, bool with_cuda, const Sabotage& sabotage) {
  CellResult res;
  res.name = cell.name;
  res.spec = cell.spec();
  const OptimizerKind kind = cell.config.kind;
  const std::vector<ParamSpec> params = cell_params(cell);
  res.tensors = params.size();

  std::map<std::string, int> failures_per_check;
  auto fail = [&](const std::string& check, const std::string& message) {
    if (failures_per_check[check]++ < 5) res.failures.push_back(check + ": " + message);
  };

  std::vector<Lane> lanes;
  lanes.push_back({BackendKind::kCpu, nullptr, {}, {}, &res.cpu, {}});
  res.cuda.not_run_reason = "no CUDA device or no CUDA build";
  if (with_cuda) lanes.push_back({BackendKind::kCuda, nullptr, {}, {}, &res.cuda, {}});

  std::vector<std::vector<float>> w0;
  make_weights(params, &w0);
  for (Lane& lane : lanes) {
    lane.options = lane.kind == BackendKind::kCpu ? g_options.backend_options : BackendOptions{};
    lane.task = make_cell_task(cell, lane.kind, lane.options);
    lane.result->ran = true;
    lane.result->description = lane.task->backend().describe();
  }
  const MemoryPlan& plan = lanes[0].task->plan();
  const uint64_t arena_bytes = plan.arena_bytes();

  // Canary words in every inter-region gap, distinct per position so a shifted copy shows.
  for (Lane& lane : lanes) {
    for (const ByteRange& g : gaps(plan)) {
      std::vector<uint32_t> words((g.end - g.begin) / 4);
      for (size_t i = 0; i < words.size(); ++i) words[i] = canary_word(g.begin + 4 * i);
      if (!words.empty()) lane.task->backend().upload(g.begin, words.data(), words.size() * 4);
    }
  }

  // Injection sites: non-empty G tensors in arena order.
  const std::vector<size_t> by_offset = injection_order(plan, params);
  auto site_id = [&](Site s) {
    switch (s) {
      case Site::kFirst: return by_offset.front();
      case Site::kMiddle: return by_offset[by_offset.size() / 2];
      case Site::kLast: return by_offset.back();
    }
    return by_offset.front();
  };
  // Every lane's inputs go in through the feeder cell_fingerprint() uses (gradient-table cells:
  // the lane's donor tasks).
  std::vector<std::unique_ptr<CellFeeder>> feeders;
  for (Lane& lane : lanes) feeders.push_back(std::make_unique<CellFeeder>(cell, *lane.task, lane.options));

  // The oracle follows all tensors, or a sample that always includes the injection sites.
  std::vector<size_t> sample;
  {
    std::set<size_t> ids;
    for (size_t id = 0; id < params.size(); ++id) {
      // Sampled layouts also leave out tensors above 4 M elements (bert_base's 23 M-element word
      // embedding alone would double the oracle's time); injection sites are always followed.
      const bool sampled = id % static_cast<size_t>(std::max(1, cell.oracle_stride)) == 0 &&
                           (cell.oracle_stride == 0 || params[id].numel() <= (int64_t{1} << 22));
      if (cell.oracle_stride == 0 || sampled) ids.insert(id);
    }
    for (const Injection& inj : cell.injections) ids.insert(site_id(inj.site));
    sample.assign(ids.begin(), ids.end());
  }
  res.oracle_tensors = sample.size();
  // The bytes the oracle comparison reads: the sampled tensors of W, the optimizer state and their ratios.
  std::vector<ByteRange> sample_ranges;
  for (size_t id : sample) {
    const uint64_t bytes = static_cast<uint64_t>(params[id].numel()) * sizeof(float);
    for (const FamilyInfo& info : kFamilyTable) {
      const Family f = info.family;
      if (info.step_state && plan.has_family(f)) {
        sample_ranges.push_back({plan.tensor_offset(f, id), plan.tensor_offset(f, id) + bytes});
      }
    }
    if (plan.has_family(Family::kN)) {
      sample_ranges.push_back({plan.tensor_offset(Family::kN, id), plan.tensor_offset(Family::kN, id) + sizeof(float)});
    }
  }
  std::vector<ParamSpec> sample_params;
  std::vector<std::vector<float>> sample_w0;
  for (size_t id : sample) {
    sample_params.push_back(params[id]);
    sample_w0.push_back(w0[id]);
  }
  w0.clear();
  w0.shrink_to_fit();
  std::vector<OptimizerConfig> group_configs;
  for (int h = 0; h < cell.hyper_groups; ++h) group_configs.push_back(cell.group_config(h));
  oracle::OracleF64 ref(group_configs, sample_params, sample_w0);
  // The bound of each check: 3x the error of an honest float32 implementation on the same
  // sampled tensors (tests/support/oracle_f32.h), floor 1e-7, instead of one constant for all regimes.
  oracle::OracleF32 honest(group_configs, sample_params, sample_w0);
  sample_w0.clear();

  std::vector<std::vector<float>> sample_g(sample.size());
  std::vector<int32_t> sample_mask;
  bool cuda_bitwise = with_cuda;
  for (int s = 0; s < cell.steps; ++s) {
    const std::string at = "step " + std::to_string(s);
    const CellStep st = cell_step(cell, params, by_offset, s);
    const Injection* inj = st.injection;
    if (!cell.backend_gradients) {
      for (size_t k = 0; k < sample.size(); ++k) sample_g[k] = st.grads[sample[k]];
    }
    sample_mask.clear();
    for (size_t id : sample) {
      if (!st.mask.empty()) sample_mask.push_back(st.mask[id]);
    }

    for (size_t l = 0; l < lanes.size(); ++l) {
      Lane& lane = lanes[l];
      Task& task = *lane.task;
      feeders[l]->feed(st);
      // Snapshots hold only what is compared: the frozen bytes before and after, plus the
      // oracle's tensors after (the whole arena after when CUDA is compared with the CPU).
      // Copying all 1.7 GB of a bert_base Adam arena twice per step would dominate the suite.
      const bool skip_expected = inj != nullptr;
      const std::vector<ByteRange> frozen =
          complement(writable(plan, kind, skip_expected, cell.config.max_grad_norm > 0.0, params, st.mask), arena_bytes);
      if (!lane.before) {
        lane.before.reset(new uint8_t[arena_bytes]);
        lane.after.reset(new uint8_t[arena_bytes]);
      }
      download_ranges(task, frozen, lane.before.get());
      const auto t0 = std::chrono::steady_clock::now();
      task.step();
      task.backend().synchronize();
      lane.result->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (sabotage) sabotage(task, s);
      if (with_cuda) {
        task.backend().download(0, lane.after.get(), arena_bytes);
      } else {
        download_ranges(task, frozen, lane.after.get());
        download_ranges(task, sample_ranges, lane.after.get());
      }

      const char* name = backend_kind_name(lane.kind);
      if (task.last_step_skipped() != skip_expected) {
        lane.result->skips_ok = false;
        fail(std::string(name) + " skip", at + (skip_expected ? ": poisoned step was applied" : ": clean step was skipped"));
      }
      // Out-of-bounds guard. This is what catches a kernel that writes past its tensor or region
      // (into the next family, the padding, a canary, the LARS tables or a scalar slot), an
      // update that runs on a skipped step, and a non-finite check or norm pass that writes G.
      // The oracle cannot see any of that: it only reads the tensors' own elements.
      for (const ByteRange& r : frozen) {
        if (std::memcmp(lane.before.get() + r.begin, lane.after.get() + r.begin, r.end - r.begin) == 0) continue;
        uint64_t first = r.begin, changed = 0;
        for (uint64_t x = r.end; x-- > r.begin;) {
          if (lane.before[x] != lane.after[x]) {
            first = x;
            ++changed;
          }
        }
        lane.result->guards_ok = false;
        fail(std::string(name) + " guard", at + (skip_expected ? " (skipped)" : "") + ": " + std::to_string(changed) +
                                               " byte(s) changed that the step must not write, first at byte " +
                                               std::to_string(first) + " = " + where(plan, first));
      }
    }

    if (cell.backend_gradients) {
      // The oracle gets the sampled tensors' gradients as the CPU backend generated them
      // (poison included); the CUDA lane's G is compared with the CPU's bit for bit.
      for (size_t k = 0; k < sample.size(); ++k) {
        sample_g[k].resize(static_cast<size_t>(params[sample[k]].numel()));
        lanes[0].task->read(Family::kG, sample[k], sample_g[k].data());
      }
    }
    const bool applied = ref.step(sample_g, st.lrs, cell.loss_scale, sample_mask);
    if (honest.step(sample_g, st.lrs, cell.loss_scale, sample_mask) != applied) {
      fail("oracle", at + ": the float32 reference disagrees");
    }
    if (applied == (inj != nullptr)) fail("oracle", at + ": the oracle's skip decision disagrees with the injection");
    if (applied) {
      ++res.applied;
    } else {
      ++res.skipped;
    }
    for (Lane& lane : lanes) {
      Task& task = *lane.task;
      if (cell.tensor_mask) {
        // Each tensor's own count: the oracle's, tensor by tensor (the sampled ones).
        const std::vector<int64_t> counts = task.tensor_steps();
        for (size_t k = 0; k < sample.size(); ++k) {
          if (counts[sample[k]] == ref.t(k)) continue;
          lane.result->skips_ok = false;
          fail(std::string(backend_kind_name(lane.kind)) + " skip", at + ": " + params[sample[k]].name + " has t = " +
                                                                       std::to_string(counts[sample[k]]) + ", expected " +
                                                                       std::to_string(ref.t(k)));
        }
      }
      if (task.step_count() != res.applied || task.skipped_steps() != res.skipped) {
        lane.result->skips_ok = false;
        fail(std::string(backend_kind_name(lane.kind)) + " skip",
             at + ": t = " + std::to_string(task.step_count()) + ", skipped = " + std::to_string(task.skipped_steps()) +
                 ", expected " + std::to_string(res.applied) + " and " + std::to_string(res.skipped));
      }
    }

    // CUDA against the CPU, bit for bit, over the whole arena except the reduction scratch,
    // the gradient table's chunk addresses (implementation details, not state; only CUDA writes
    // them), the gradient table itself (the gradients' addresses: host addresses on the CPU,
    // device addresses on CUDA) and Muon's U: a step's working value (MUON_MOMENTUM writes a
    // tensor's U before anything of the same step reads it, so no step reads another's) that the
    // CUDA backend, applying the update as X leaves the Newton–Schulz scratch, never overwrites
    // with the orthogonalised update; the W it makes is compared.
    if (with_cuda) {
      const uint8_t* a = lanes[0].after.get();
      const uint8_t* b = lanes[1].after.get();
      std::vector<ByteRange> scratch;
      for (Region r : {T_NORM_PARTIALS, T_GRAD_CHUNKS, S_GRAD_TABLE, T_MUON_SCRATCH, T_MUON_UPDATE}) {
        if (plan.region(r).allocated) scratch.push_back({plan.region(r).offset, region_end(plan.region(r))});
      }
      std::sort(scratch.begin(), scratch.end(), [](const ByteRange& x, const ByteRange& y) { return x.begin < y.begin; });
      const std::vector<ByteRange> compare = complement(scratch, arena_bytes);
      for (const ByteRange& r : compare) {
        if (std::memcmp(a + r.begin, b + r.begin, r.end - r.begin) == 0) continue;
        uint64_t first = r.begin;
        while (a[first] == b[first]) ++first;
        cuda_bitwise = false;
        fail("cuda vs cpu", at + ": arenas differ, first at byte " + std::to_string(first) + " = " + where(plan, first));
        break;
      }
    }

    // Oracle comparison: every step of a short run; every 100 steps and the last in a drift run.
    const bool check_now = cell.tier != Tier::kDrift || (s + 1) % 100 == 0 || s == cell.steps - 1;
    if (!check_now) continue;
    for (Lane& lane : lanes) {
      BackendResult& br = *lane.result;
      const char* name = backend_kind_name(lane.kind);
      for (size_t k = 0; k < sample.size(); ++k) {
        const size_t id = sample[k];
        const size_t n = static_cast<size_t>(params[id].numel());
        const oracle::TensorState& want = ref.tensor(k);
        const oracle::TensorStateF32& f32 = honest.tensor(k);
        const std::string here = at + ", " + params[id].name + " (" + role_name(params[id].role) + ", " +
                                 std::to_string(n) + " elements)";
        auto check = [&](const char* fam, double err, double honest_err, double* worst) {
          *worst = std::max(*worst, std::isnan(err) ? INFINITY : err);
          const double bound = oracle::bound_from_f32(honest_err);
          if (!(err <= bound)) {
            br.oracle_ok = false;
            std::ostringstream os;
            os.precision(3);
            os << fam << " rel L2 " << err << " > " << bound << " (3x the honest float32 error " << honest_err
               << ") at " << here;
            fail(std::string(name) + " oracle", os.str());
          }
        };
        const double err_w =
            oracle::relative_l2(read_floats(lane.after.get(), plan.tensor_offset(Family::kW, id), n), want.w);
        if (kind == OptimizerKind::kMuon && ref.is_weight_group(k)) {
          // Muon's weight group (tests/runtime/test_oracle.cc): the honest float32 bound of the
          // element-wise parts plus kMuonNsRelError of the path its orthogonalised steps moved w.
          const double honest_err = oracle::relative_l2(f32.w, want.w);
          const double w_norm = std::sqrt(want.w.square().sum());
          const double bound = oracle::bound_from_f32(honest_err) +
                               (w_norm > 0.0 ? oracle::kMuonNsRelError * want.muon_path / w_norm : 0.0);
          br.err_w = std::max(br.err_w, std::isnan(err_w) ? INFINITY : err_w);
          if (!(err_w <= bound)) {
            br.oracle_ok = false;
            std::ostringstream os;
            os.precision(3);
            os << "W rel L2 " << err_w << " > " << bound << " (honest float32 " << honest_err << ", Newton-Schulz path "
               << (w_norm > 0.0 ? want.muon_path / w_norm : 0.0) << ") at " << here;
            fail(std::string(name) + " oracle", os.str());
          }
        } else {
          check("W", err_w, oracle::relative_l2(f32.w, want.w), &br.err_w);
        }
        if (has_m(kind)) {
          check("M", oracle::relative_l2(read_floats(lane.after.get(), plan.tensor_offset(Family::kM, id), n), want.m),
                oracle::relative_l2(f32.m, want.m), &br.err_m);
        }
        if (has_v(kind)) {
          check("V", oracle::relative_l2(read_floats(lane.after.get(), plan.tensor_offset(Family::kV, id), n), want.v),
                oracle::relative_l2(f32.v, want.v), &br.err_v);
        }
        if (plan.has_family(Family::kVmax)) {  // amsgrad's running max, reported with V
          check("VMAX",
                oracle::relative_l2(read_floats(lane.after.get(), plan.tensor_offset(Family::kVmax, id), n), want.vmax),
                oracle::relative_l2(f32.vmax, want.vmax), &br.err_v);
        }
        // (A tensor masked this step keeps no ratio of its own: its N follows stale partials.)
        const bool masked_now = !sample_mask.empty() && sample_mask[k] != 0;
        if (is_lars(kind) && ref.is_weight_group(k) && ref.t(k) > 0 && !masked_now) {
          const float eta = read_floats(lane.after.get(), plan.tensor_offset(Family::kN, id), 1)[0];
          const double denominator = want.trust != 0.0 ? want.trust : 1.0;  // Muon's adjusted lr at lr 0
          check("N", std::abs(static_cast<double>(eta) - want.trust) / denominator,
                std::abs(static_cast<double>(f32.trust) - want.trust) / denominator, &br.err_n);
        }
      }
    }
  }

  for (Lane& lane : lanes) {
    lane.result->fingerprint = lane.task->fingerprint();
  }

  if (with_cuda) {
    res.cuda_bitwise = cuda_bitwise && res.cuda.fingerprint == res.cpu.fingerprint;
    if (res.cuda.fingerprint != res.cpu.fingerprint) {
      fail("cuda vs cpu", "fingerprints differ: cpu " + res.cpu.fingerprint + ", cuda " + res.cuda.fingerprint);
    }
  }
  return res;
}

}  // namespace conformance
}  // namespace renaissance
