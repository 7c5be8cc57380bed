// The NCCL implementation of the Communicator (comm/, the renaissance_nccl target, built with
// -DRENAISSANCE_NCCL=AUTO|ON when NCCL, CUDA and MPI are found). CUDA ranks, one GPU per rank:
// every buffer is device memory of the rank's GPU. NOT YET RUN ON GPUs (see docs/distributed.md).
#pragma once

#include <memory>

#include "renaissance/communicator.h"

namespace renaissance {

// Bootstrapped through MPI (initialised here when nobody has): rank 0 makes the ncclUniqueId and
// MPI_Bcast hands it to every rank. It makes GPU (local rank mod the visible GPU count) the
// current device, so a CUDA backend created afterwards on this thread allocates there. Every
// call is enqueued on the communicator's own stream and waited for before it returns, so the
// calls order like MPI's (the caller synchronises its backend before a call).
std::unique_ptr<Communicator> make_nccl_communicator();

}  // namespace renaissance
