// The MPI implementation of the Communicator (comm/, the renaissance_mpi target, built when
// Open MPI is found: -DRENAISSANCE_MPI=AUTO|ON|OFF). CPU ranks only: buffers are host memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "renaissance/communicator.h"

namespace renaissance {

// Initialises MPI when nobody has (and finalises it when the communicator goes, unless an
// exception is unwinding: a rank that fails leaves without a collective the others never join,
// and mpirun then ends the job). The communicator spans MPI_COMM_WORLD.
std::unique_ptr<Communicator> make_mpi_communicator();

// Every rank's `text`, in rank order, on every rank of MPI_COMM_WORLD: a collective (every rank
// calls it, after a communicator, MPI or NCCL, has started MPI). Host memory, whatever the
// communicator's buffers are. `renaissance run` compares the ranks' configurations with it
// before the first step. Throws Error(kBackend) when MPI is not running or a text is over 2 GiB.
std::vector<std::string> mpi_all_gather_text(const std::string& text);

}  // namespace renaissance
