// Run under `mpirun -np K` (comm/CMakeLists.txt, K = 1..4): for every kind of kKindTable, with
// and without gradient-norm clipping, the sharded synthetic run (the one `renaissance run
// --distributed mpi` makes) against one-process references computed on rank 0 without any
// sharding code:
//   replicated  == the plain single-device run, bitwise (fingerprint of W, M, V, step count);
//   ordered     == the one-process simulation of K ranks (--simulate-ranks K), bitwise;
//   fast        == ordered when K <= 2 (a sum of two floats is the same in either order),
//                  and for any K every rank holds the same gathered state;
//   ordered reduced in many small rounds == in one round (ShardedStep::set_reduce_chunk), and
//                  fast in rounds == ordered for K <= 2 (with clipping, where halos exist).
// With a bf16/fp16 model copy (nearest and stochastic rounding, clipping on): replicated == the
// plain run and ordered == --simulate-ranks K, the fingerprint covering the copy; every rank's
// copy (its fingerprint reads its own) must be the same, so the copy's all-gather is complete.
// With model-dtype gradients (bf16 nearest, fp16 stochastic; every kind, clipping on): the same
// equalities for all three modes, in one round and in small ones. With amsgrad (adam, adamw; VMAX
// sharded like V): the same equalities, fp32 and a bf16 copy, with and without clipping.
// Every rank must end with the same fingerprint. Exit 0 only when every check passed.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "audit/synthetic.h"
#include "renaissance/hyperparameters.h"
#include "renaissance/kinds.h"
#include "renaissance/layout.h"
#include "check_log.h"
#include "renaissance/mpi_communicator.h"

using namespace renaissance;

namespace {

constexpr uint64_t kSmallChunk = 3001;

audit::SyntheticRun base_run(const Layout& layout, OptimizerKind kind, bool clip,
                           PrecisionOptions precision = PrecisionOptions{}) {
  audit::SyntheticRun run;
  run.params = layout.params;
  run.config = reference_config(kind);
  run.config.max_grad_norm = clip ? 0.05 : 0.0;
  run.steps = 4;
  run.schedule_steps = 4;
  run.threads = 1;
  run.backend = BackendKind::kCpu;
  run.schedule = audit::Schedule::kCosine;
  run.warmup = 1;
  run.loss_scale = 256.0;
  run.nan_at = {1};  // one skipped step: the combined flag must skip it on every rank
  run.seed = 7;
  run.measure_copy_bandwidth = false;
  run.precision = precision;
  return run;
}

// True when every rank's fingerprint equals rank 0's.
bool ranks_agree(Communicator& comm, const std::string& fp) {
  const int K = comm.size();
  std::vector<char> all(static_cast<size_t>(16 * K), 0);
  std::memcpy(all.data() + 16 * comm.rank(), fp.data(), std::min<size_t>(16, fp.size()));
  std::vector<uint64_t> offsets(K), counts(K, 16);
  for (int r = 0; r < K; ++r) offsets[r] = 16 * static_cast<uint64_t>(r);
  comm.all_gather_v(all.data(), offsets, counts);
  for (int r = 1; r < K; ++r) {
    if (std::memcmp(all.data(), all.data() + 16 * r, 16) != 0) return false;
  }
  return true;
}

// The sharded run in `mode`, its gradients reduced in one round: every rank must hold the same
// state after 3 applied steps (the NaN one skipped). Returns the fingerprint.
std::string run_in_one_round(CheckLog& check, Communicator& comm, audit::SyntheticRun& run, GradReduce mode,
                             const std::string& tag) {
  run.grad_reduce = mode;
  run.reduce_chunk = 0;
  const audit::SyntheticResult r = audit::run_synthetic(run);
  check(ranks_agree(comm, r.fingerprint), tag + " " + grad_reduce_name(mode) + ": every rank holds the same state");
  check(r.steps_applied == 3, tag + " " + grad_reduce_name(mode) + ": 3 steps applied, the NaN one skipped");
  return r.fingerprint;
}

// The lead rank's references for a configuration with clipping: the replicated fingerprint is the
// plain run's, the ordered one that of the one-process simulation of K ranks. Returns the plain
// run's fingerprint.
std::string check_one_process_runs(CheckLog& check, const Layout& layout, OptimizerKind kind, const PrecisionOptions& precision,
                            int K, const std::string& tag, const std::string& replicated, const std::string& ordered) {
  const audit::SyntheticResult plain = audit::run_synthetic(base_run(layout, kind, true, precision));
  check(replicated == plain.fingerprint, tag + " replicated " + replicated + " == plain run " + plain.fingerprint);
  audit::SyntheticRun sim = base_run(layout, kind, true, precision);
  sim.simulate_ranks = K;
  const std::string simulated = audit::run_synthetic(sim).fingerprint;
  check(ordered == simulated, tag + " ordered " + ordered + " == --simulate-ranks " + simulated);
  return plain.fingerprint;
}

}  // namespace

int main(int argc, char** argv) {
  auto [comm, layout, check] = start_rank_program(argc, argv, "sharded_runs");
  const int K = comm->size();
  const bool lead = comm->rank() == 0;
  for (const KindInfo& info : kKindTable) {
    for (bool clip : {false, true}) {
      const std::string tag = std::string(info.name) + (clip ? " clip" : "") + " K=" + std::to_string(K);
      audit::SyntheticRun run = base_run(layout, info.kind, clip);
      run.comm = comm.get();
      std::string fp[3], chunked[3];
      const GradReduce modes[3] = {GradReduce::kReplicated, GradReduce::kOrdered, GradReduce::kFast};
      for (int m = 0; m < 3; ++m) {
        fp[m] = run_in_one_round(check, *comm, run, modes[m], tag);
        if (modes[m] == GradReduce::kReplicated || !clip) continue;
        // The reduction in many uneven rounds (kSmallChunk is no divisor of any tile or slice;
        // the layout's family is ~107K elements), with clipping only: that is where the norm
        // kinds' cuts leave halos that rounds must not overwrite. Ordered: the same bits as in
        // one round. Fast:
        // the engine may pick another summation order for other block sizes when K > 2, so it
        // is compared where the order cannot matter (K <= 2: with ordered, below).
        run.reduce_chunk = kSmallChunk;
        chunked[m] = audit::run_synthetic(run).fingerprint;
        const std::string what = tag + " " + grad_reduce_name(modes[m]) + " in rounds of " + std::to_string(kSmallChunk);
        check(ranks_agree(*comm, chunked[m]), what + ": every rank holds the same state");
        if (modes[m] == GradReduce::kOrdered) check(chunked[m] == fp[m], what + " " + chunked[m] + " == one round " + fp[m]);
      }
      if (clip && K <= 2) check(chunked[2] == fp[1], tag + " fast in rounds " + chunked[2] + " == ordered " + fp[1]);
      if (lead) {
        const audit::SyntheticResult plain = audit::run_synthetic(base_run(layout, info.kind, clip));
        check(fp[0] == plain.fingerprint, tag + " replicated " + fp[0] + " == plain run " + plain.fingerprint);
        audit::SyntheticRun sim = base_run(layout, info.kind, clip);
        sim.simulate_ranks = K;
        const audit::SyntheticResult simulated = audit::run_synthetic(sim);
        check(fp[1] == simulated.fingerprint, tag + " ordered " + fp[1] + " == --simulate-ranks " + simulated.fingerprint);
        if (K <= 2) check(fp[2] == fp[1], tag + " fast " + fp[2] + " == ordered (two summands commute)");
      }
    }
  }
  for (const KindInfo& info : kKindTable) {
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
        const PrecisionOptions precision{p, r, 99};
        const std::string tag = std::string(info.name) + " clip " + precision_name(p) +
                                (r == Rounding::kStochastic ? " stochastic" : " nearest") + " K=" + std::to_string(K);
        audit::SyntheticRun run = base_run(layout, info.kind, true, precision);
        run.comm = comm.get();
        std::string fp[2];
        const GradReduce modes[2] = {GradReduce::kReplicated, GradReduce::kOrdered};
        for (int m = 0; m < 2; ++m) {
          run.grad_reduce = modes[m];
          fp[m] = audit::run_synthetic(run).fingerprint;
          check(ranks_agree(*comm, fp[m]), tag + " " + grad_reduce_name(modes[m]) + ": every rank holds the same W, M, V and copy");
        }
        if (!lead) continue;
        check_one_process_runs(check, layout, info.kind, precision, K, tag, fp[0], fp[1]);
      }
    }
  }
  // Model-dtype gradients (each rank's G in bf16/fp16, widened exactly before the fp32 rank-order
  // sum, the mean rounded to nearest even into G): every kind, clipping on, one bf16 nearest and
  // one fp16 stochastic configuration; all three modes, and ordered/fast in small rounds too
  // (the 2-byte halos and round boundaries).
  for (const KindInfo& info : kKindTable) {
    for (const PrecisionOptions& precision : {PrecisionOptions{Precision::kBf16, Rounding::kNearest, 99, true},
                                              PrecisionOptions{Precision::kFp16, Rounding::kStochastic, 99, true}}) {
      const std::string tag = std::string(info.name) + " clip grad " + precision_name(precision.precision) + " " +
                              rounding_name(precision.rounding) + " K=" + std::to_string(K);
      audit::SyntheticRun run = base_run(layout, info.kind, true, precision);
      run.comm = comm.get();
      std::string fp[3], chunked[3];
      const GradReduce modes[3] = {GradReduce::kReplicated, GradReduce::kOrdered, GradReduce::kFast};
      for (int m = 0; m < 3; ++m) {
        fp[m] = run_in_one_round(check, *comm, run, modes[m], tag);
        if (modes[m] == GradReduce::kReplicated) continue;
        run.reduce_chunk = kSmallChunk;
        chunked[m] = audit::run_synthetic(run).fingerprint;
        check(ranks_agree(*comm, chunked[m]), tag + " " + grad_reduce_name(modes[m]) + " in rounds: every rank agrees");
      }
      check(chunked[1] == fp[1], tag + " ordered in rounds " + chunked[1] + " == one round " + fp[1]);
      if (K <= 2) {
        check(fp[2] == fp[1], tag + " fast " + fp[2] + " == ordered (two summands commute)");
        check(chunked[2] == fp[1], tag + " fast in rounds " + chunked[2] + " == ordered " + fp[1]);
      }
      if (!lead) continue;
      const std::string plain = check_one_process_runs(check, layout, info.kind, precision, K, tag, fp[0], fp[1]);
      // The gradients really are in the model dtype: the fp32-gradient run of the same
      // configuration ends elsewhere (else this block would repeat the one above).
      PrecisionOptions fp32_grads = precision;
      fp32_grads.model_dtype_gradients = false;
      const std::string wide = audit::run_synthetic(base_run(layout, info.kind, true, fp32_grads)).fingerprint;
      check(wide != plain, tag + " differs from fp32 gradients " + wide);
    }
  }
  // amsgrad (adam, adamw): VMAX is sharded like V (kFamilyTable: optimizer state), so the same
  // equalities hold with it, with and without clipping and with a bf16 copy; on the lead rank, the
  // plain amsgrad run differs from the one without it (VMAX is read, so these runs are no
  // repetition of the ones above).
  for (const KindInfo& info : kKindTable) {
    if (!kind_reads(info.kind, hyperparameter_info(Hyperparameter::kAmsgrad))) continue;
    for (const PrecisionOptions& precision : {PrecisionOptions{}, PrecisionOptions{Precision::kBf16, Rounding::kNearest, 99}}) {
      for (bool clip : {false, true}) {
        const std::string tag = std::string(info.name) + " amsgrad" + (clip ? " clip" : "") +
                                (precision.precision == Precision::kFp32 ? "" : " bf16") + " K=" + std::to_string(K);
        audit::SyntheticRun run = base_run(layout, info.kind, clip, precision);
        run.config.amsgrad = true;
        run.comm = comm.get();
        std::string fp[3];
        const GradReduce modes[3] = {GradReduce::kReplicated, GradReduce::kOrdered, GradReduce::kFast};
        for (int m = 0; m < 3; ++m) fp[m] = run_in_one_round(check, *comm, run, modes[m], tag);
        run.grad_reduce = GradReduce::kOrdered;
        run.reduce_chunk = kSmallChunk;
        const std::string chunked = audit::run_synthetic(run).fingerprint;
        check(chunked == fp[1], tag + " ordered in rounds " + chunked + " == one round " + fp[1]);
        if (K <= 2) check(fp[2] == fp[1], tag + " fast " + fp[2] + " == ordered (two summands commute)");
        if (!lead) continue;
        audit::SyntheticRun plain = base_run(layout, info.kind, clip, precision);
        plain.config.amsgrad = true;
        const std::string one = audit::run_synthetic(plain).fingerprint;
        check(fp[0] == one, tag + " replicated " + fp[0] + " == plain run " + one);
        audit::SyntheticRun sim = plain;
        sim.simulate_ranks = K;
        const std::string simulated = audit::run_synthetic(sim).fingerprint;
        check(fp[1] == simulated, tag + " ordered " + fp[1] + " == --simulate-ranks " + simulated);
        const std::string without = audit::run_synthetic(base_run(layout, info.kind, clip, precision)).fingerprint;
        check(without != one, tag + ": the run without amsgrad ends elsewhere " + without);
      }
    }
  }
  return check.verdict(*comm, "all sharded runs match", "SHARDED RUNS FAILED");
}
