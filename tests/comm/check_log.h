// Shared by the mpirun test programs of tests/comm: the log of their checks and the start of a
// program. Every rank counts its failed checks; the lead rank prints each ("ok   WHAT" or "FAIL
// WHAT"). verdict() joins the ranks' counts (any failure anywhere fails every rank) and prints
// PASS or FAIL once.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "renaissance/communicator.h"
#include "renaissance/layout.h"
#include "renaissance/mpi_communicator.h"

struct CheckLog {
  bool lead;
  int32_t failures = 0;

  void operator()(bool ok, const std::string& what) {
    if (!ok) ++failures;
    if (lead) std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  }
  // The exit status of the program: 0 when no rank failed a check.
  int verdict(renaissance::Communicator& comm, const char* pass, const char* fail) {
    comm.all_reduce_max_i32(&failures, 1);
    if (lead) std::printf("%s\n", failures ? fail : pass);
    return failures ? 1 : 0;
  }
};

// What a program run as `mpirun -np K PROGRAM LAYOUT.json` starts from: the MPI communicator, the
// layout and the check log (rank 0 prints).
struct RankProgram {
  std::unique_ptr<renaissance::Communicator> comm;
  renaissance::Layout layout;
  CheckLog check;
};

// Exits with status 2, after printing the usage, unless argv names one layout file.
inline RankProgram start_rank_program(int argc, char** argv, const char* program) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpirun -np K %s LAYOUT.json\n", program);
    std::exit(2);
  }
  std::unique_ptr<renaissance::Communicator> comm = renaissance::make_mpi_communicator();
  const bool lead = comm->rank() == 0;
  renaissance::Layout layout = renaissance::load_layout_file(argv[1]);
  return RankProgram{std::move(comm), std::move(layout), CheckLog{lead}};
}
