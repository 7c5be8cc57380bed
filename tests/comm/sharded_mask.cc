// Run under `mpirun -np K` (comm/CMakeLists.txt, K = 1..3): the per-tensor None-gradient mask
// (TaskOptions::tensor_mask) in a sharded step, each rank holding its slice of M and V
// (TaskOptions::state_shard; once also the whole state, then gathered on every rank by
// ShardedStep::gather_state). Every rank sets the same mask each step, over a
// pattern of nothing, one tensor, all, alternate tensors and nothing again (the first masked
// step switches programs, docs/design.md "Two programs"); the references are computed on rank 0
// by one Task without any sharding code:
//   replicated == the plain masked run, bitwise (fingerprint: W, M, V, the model copy, counts);
//   ordered    == the one-process simulation of K ranks (synthesize_rank_sum) with the same mask;
//   fast       == ordered when K <= 2 (a sum of two floats is the same in either order);
// and every rank's per-tensor step counts equal the reference's. Kinds adamw, lamb, lars,
// sgd_momentum and muon (a masked matrix skipped by its owner), with and without clipping, and adamw with a bf16 stochastic model copy. The
// NaN in a masked tensor's G is ignored, one in an unmasked tensor's skips the step. The
// masked reference differs from the unmasked one (else the mask would be tested by nothing).
// `sharded_mask LAYOUT cuda` (a build with NCCL; scripts/gpu.sh dist:mask): CUDA ranks joined by
// NCCL, the references on rank 0's GPU, the checks between ranks over MPI.
// Exit 0 only when every check passed.
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "check_log.h"
#include "rank_task.h"
#include "renaissance/layout.h"
#include "renaissance/mpi_communicator.h"
#ifdef RN_WITH_NCCL
#include "renaissance/nccl_communicator.h"
#endif
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"

using namespace renaissance;

namespace {

constexpr uint64_t kSeed = 11;
constexpr int kSteps = 6;
BackendKind g_backend = BackendKind::kCpu;  // every Task's (argv[2] == "cuda": CUDA)

struct Case {
  OptimizerKind kind;
  bool clip;
  PrecisionOptions precision;
};

// The mask of step t over n tensors (nonzero: the tensor has no gradient this step).
std::vector<int32_t> mask_at(int t, size_t n) {
  std::vector<int32_t> mask(n, 0);
  for (size_t i = 0; i < n; ++i) {
    switch (t) {
      case 1: mask[i] = i == 1; break;           // one tensor
      case 2: mask[i] = 1; break;                // all of them
      case 3: mask[i] = i % 2 == 0; break;       // alternate
      case 5: mask[i] = i % 2 == 1; break;       // the other half
      default: break;                            // steps 0 and 4: nothing
    }
  }
  return mask;
}

std::unique_ptr<Task> make_task(const Layout& layout, const Case& c, StateShard shard) {
  return make_rank_task(layout, RankTaskSpec{c.kind, c.clip, c.precision, g_backend, true, kSeed}, shard);
}

struct Result {
  int64_t applied = 0;
  std::string fingerprint;
  std::vector<int64_t> steps;
  // A sharded run with the whole state on every rank: this rank's own Task::fingerprint after
  // ShardedStep::gather_state (every optimizer state family gathered), else empty.
  std::string gathered;
};

// One run: sharded over comm when comm != null (each rank holding its slice of M and V, as
// renaissance.torch's ranks do, or the whole state), else one Task (masked or not).
Result run(const Layout& layout, const Case& c, Communicator* comm, GradReduce mode, Grads grads, int ranks,
           bool masked = true, bool sliced = true) {
  StateShard shard;
  if (comm != nullptr && sliced) shard = StateShard{comm->rank(), comm->size()};
  RankRun driver(make_task(layout, c, shard), comm, mode);
  Task* task = driver.task.get();
  for (int t = 0; t < kSteps; ++t) {
    rank_gradients(*task, grads, kSeed, t, kRankGradientAmplitude, driver.rank, ranks);
    if (t == 3 || t == 5) {
      // A NaN in the largest even-numbered tensor: masked at step 3 (its G is never looked at, the
      // step applies), not at step 5 (the rank that owns the element must skip the step for all).
      size_t id = 0;
      for (size_t i = 0; i < task->num_params(); i += 2) {
        if (task->param(i).numel() > task->param(id).numel()) id = i;
      }
      task->poison_gradient(id, static_cast<uint64_t>(task->param(id).numel()) / 2,
                            std::numeric_limits<float>::quiet_NaN());
    }
    if (masked) task->set_tensor_mask(mask_at(t, task->num_params()));
    driver.step();
  }
  Result r;
  r.applied = task->step_count();
  r.fingerprint = driver.sharded ? driver.sharded->fingerprint() : task->fingerprint();
  r.steps = task->tensor_steps();
  if (driver.sharded && !sliced) {
    driver.sharded->gather_state();
    r.gathered = task->fingerprint();
  }
  return r;
}

// True when every rank's value equals rank 0's.
bool ranks_agree(Communicator& comm, const std::vector<char>& mine) {
  const int K = comm.size();
  const uint64_t n = mine.size();
  std::vector<char> all(n * static_cast<uint64_t>(K), 0);
  std::memcpy(all.data() + n * static_cast<uint64_t>(comm.rank()), mine.data(), n);
  std::vector<uint64_t> offsets(K), counts(K, n);
  for (int r = 0; r < K; ++r) offsets[r] = n * static_cast<uint64_t>(r);
  comm.all_gather_v(all.data(), offsets, counts);
  for (int r = 1; r < K; ++r) {
    if (std::memcmp(all.data(), all.data() + n * static_cast<uint64_t>(r), n) != 0) return false;
  }
  return true;
}

std::vector<char> bytes_of(const Result& r) {
  std::vector<char> b(r.fingerprint.begin(), r.fingerprint.end());
  b.resize(16 + r.steps.size() * sizeof(int64_t), 0);
  std::memcpy(b.data() + 16, r.steps.data(), r.steps.size() * sizeof(int64_t));
  return b;
}

std::string counts_text(const std::vector<int64_t>& steps) {
  std::string s;
  for (int64_t x : steps) s += std::to_string(x);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const bool cuda = argc == 3 && std::strcmp(argv[2], "cuda") == 0;
  if (argc != 2 && !cuda) {
    std::fprintf(stderr, "usage: mpirun -np K sharded_mask LAYOUT.json [cuda]\n");
    return 2;
  }
  // `comm` checks between ranks (host memory); `steps` joins the sharded steps: the same MPI
  // communicator for CPU ranks, NCCL for CUDA ranks (made before any Task: it picks the GPU).
  std::unique_ptr<Communicator> comm = make_mpi_communicator();
  std::unique_ptr<Communicator> nccl;
  if (cuda) {
#ifdef RN_WITH_NCCL
    nccl = make_nccl_communicator();
    g_backend = BackendKind::kCuda;
#else
    std::fprintf(stderr, "sharded_mask: this build has no NCCL communicator\n");
    return 2;
#endif
  }
  Communicator* steps = cuda ? nccl.get() : comm.get();
  if (comm->rank() == 0) std::printf("sharded steps over %s\n", steps->describe().c_str());
  const int K = comm->size();
  const bool lead = comm->rank() == 0;
  const Layout layout = load_layout_file(argv[1]);
  CheckLog check{lead};
  std::vector<Case> cases;
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kLamb, OptimizerKind::kLars,
                             OptimizerKind::kSgdMomentum, OptimizerKind::kMuon}) {
    for (bool clip : {false, true}) cases.push_back({kind, clip, PrecisionOptions{}});
  }
  cases.push_back({OptimizerKind::kAdamW, true, PrecisionOptions{Precision::kBf16, Rounding::kStochastic, 99}});
  for (const Case& c : cases) {
    const std::string tag = std::string(optimizer_kind_name(c.kind)) + (c.clip ? " clip" : "") +
                            (c.precision.precision != Precision::kFp32 ? " bf16 stochastic" : "") +
                            " K=" + std::to_string(K);
    const GradReduce modes[3] = {GradReduce::kReplicated, GradReduce::kOrdered, GradReduce::kFast};
    Result got[3];
    for (int m = 0; m < 3; ++m) {
      const Grads grads = modes[m] == GradReduce::kReplicated ? Grads::kSame : Grads::kOwn;
      got[m] = run(layout, c, steps, modes[m], grads, K);
      check(ranks_agree(*comm, bytes_of(got[m])), tag + " " + grad_reduce_name(modes[m]) +
                                                      ": every rank holds the same state and counts");
    }
    if (K <= 2) check(got[2].fingerprint == got[1].fingerprint, tag + " fast " + got[2].fingerprint + " == ordered");
    const Result whole = run(layout, c, steps, GradReduce::kOrdered, Grads::kOwn, K, true, false);
    check(bytes_of(whole) == bytes_of(got[1]), tag + " ordered with the whole M and V on every rank == with slices");
    check(whole.gathered == whole.fingerprint,
          tag + " gather_state(): this rank's own state " + whole.gathered + " == the owners' " + whole.fingerprint);
    if (!lead) continue;
    const Result plain = run(layout, c, nullptr, GradReduce::kReplicated, Grads::kSame, 1);
    check(got[0].fingerprint == plain.fingerprint && got[0].steps == plain.steps,
          tag + " replicated " + got[0].fingerprint + " == plain masked run " + plain.fingerprint + ", counts " +
              counts_text(got[0].steps) + " == " + counts_text(plain.steps));
    const Result sim = run(layout, c, nullptr, GradReduce::kReplicated, Grads::kSimulated, K);
    check(got[1].fingerprint == sim.fingerprint && got[1].steps == sim.steps,
          tag + " ordered " + got[1].fingerprint + " == simulated ranks " + sim.fingerprint + ", counts " +
              counts_text(got[1].steps) + " == " + counts_text(sim.steps));
    check(plain.applied == kSteps - 1, tag + " the NaN of an unmasked tensor skipped one step: " +
                                           std::to_string(plain.applied) + " applied");
    const Result unmasked = run(layout, c, nullptr, GradReduce::kReplicated, Grads::kSame, 1, false);
    check(unmasked.fingerprint != plain.fingerprint, tag + " the mask matters: unmasked " + unmasked.fingerprint);
  }
  return check.verdict(*comm, "all sharded mask runs match", "SHARDED MASK RUNS FAILED");
}
