// The MPI implementation of the Communicator (comm/, the renaissance_mpi target, built when
// Open MPI is found: -DRENAISSANCE_MPI=AUTO|ON|OFF). CPU ranks only: buffers are host memory.
#pragma once

#include <memory>

#include "renaissance/communicator.h"

namespace renaissance {

// Initialises MPI when nobody has (and finalises it when the communicator goes, unless an
// exception is unwinding: a rank that fails leaves without a collective the others never join,
// and mpirun then ends the job). The communicator spans MPI_COMM_WORLD.
std::unique_ptr<Communicator> make_mpi_communicator();

}  // namespace renaissance
