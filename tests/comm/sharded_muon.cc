// Run under `mpirun -np K` (comm/CMakeLists.txt, K = 1..4 and 7): Muon's sharded step, its matrices
// owned whole by one rank each (docs/distributed.md, rule M), every rank holding its slice of M
// and V (TaskOptions::state_shard, as `renaissance run --distributed` compiles it). After four
// steps (one skipped for a NaN), on every rank, the state bytes against a Task without any
// sharding code that the rank runs itself:
//   replicated == the one-device run: W, N (each matrix's adjusted lr: every owner's gathered)
//                 and M, V (read through ShardedStep::read_state), bit for bit;
//   ordered    == the one-process simulation of K ranks (synthesize_rank_sum), the same bytes;
// with and without clipping, and with a bf16 stochastic model copy (its bytes too). The run must
// differ from one with another gradient (else the comparison would prove nothing), and at K > 1
// the matrices must be spread over more than one rank. Exit 0 only when every check passed.
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
#include "renaissance/sharded_step.h"
#include "renaissance/task.h"

using namespace renaissance;

namespace {

constexpr uint64_t kSeed = 23;
constexpr int kSteps = 4;

struct Case {
  bool clip;
  PrecisionOptions precision;
};

std::unique_ptr<Task> make_task(const Layout& layout, const Case& c, StateShard shard) {
  return make_rank_task(layout, RankTaskSpec{OptimizerKind::kMuon, c.clip, c.precision, BackendKind::kCpu, false, kSeed},
                        shard);
}

// Four steps; a NaN at step 1 (every rank's G, or the simulated sum's) skips that one.
// `ranks`: how many ranks' gradients the simulation sums (kSimulated).
std::vector<char> run(const Layout& layout, const Case& c, Communicator* comm, GradReduce mode, Grads grads,
                      int ranks) {
  return state_bytes_after_steps(make_task(layout, c, rank_shard(comm)), comm, mode, grads, kSeed, kSteps,
                                 kRankGradientAmplitude, ranks, 0);
}

}  // namespace

int main(int argc, char** argv) {
  auto [comm, layout, check] = start_rank_program(argc, argv, "sharded_muon");
  const int K = comm->size();
  {
    // The partition the runs below use: more than one rank owns matrices when K > 1.
    const std::unique_ptr<Task> task = make_task(layout, Case{false, PrecisionOptions{}}, StateShard{});
    int owners = 0;
    std::string text;
    for (const RankShard& s : make_shard_layout(task->plan(), K).ranks) {
      owners += s.muon_matrix_end > s.muon_matrix_begin ? 1 : 0;
      text += " [" + std::to_string(s.muon_matrix_begin) + ", " + std::to_string(s.muon_matrix_end) + ")";
    }
    check(K == 1 || owners > 1, "K=" + std::to_string(K) + " matrices owned:" + text);
  }
  const Case cases[] = {{false, PrecisionOptions{}},
                        {true, PrecisionOptions{}},
                        {true, PrecisionOptions{Precision::kBf16, Rounding::kStochastic, 99}}};
  for (const Case& c : cases) {
    const std::string tag = std::string("muon") + (c.clip ? " clip" : "") +
                            (c.precision.precision != Precision::kFp32 ? " bf16 stochastic" : "") + " K=" +
                            std::to_string(K) + " rank " + std::to_string(comm->rank());
    check_state_bytes(check, tag, layout, c, *comm, run);
  }
  return check.verdict(*comm, "all sharded muon runs match", "SHARDED MUON RUNS FAILED");
}
