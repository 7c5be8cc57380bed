// MpiSession: MPI's start and end for a communicator of this process (MpiCommunicator, and
// NcclCommunicator, which bootstraps through MPI). Initialises MPI unless the caller already
// did, reads this process's rank and the world size, and finalises MPI only if it initialised
// it and no exception is in flight. Hold it as a communicator's FIRST member, so it ends after
// everything the communicator's destructor tears down.
#pragma once

#include <mpi.h>

#include <exception>

namespace renaissance {

class MpiSession {
 public:
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      MPI_Init(nullptr, nullptr);
      owns_mpi_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiSession() {
    if (owns_mpi_ && std::uncaught_exceptions() == 0) MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  int rank_ = 0;
  int size_ = 1;
  bool owns_mpi_ = false;
};

}  // namespace renaissance
