// Non-blocking compressed allreduce for the interposer: the call runs on one worker thread
// (in the order calls were started, the same on every rank, as MPI requires) on a private
// duplicate of the communicator, and the caller gets an MPI generalized request that
// MPI_Wait / MPI_Test complete like any other.
#pragma once
#include <mpi.h>

#include <memory>

#include "../coll/coll.h"

namespace mpicomp::pmpi {

// The private duplicate of comm used for one kind of traffic (0: blocking, 1: non-blocking),
// made on first use (collectively) and freed with comm.
MPI_Comm private_comm(MPI_Comm comm, int slot);

inline MPI_Comm async_comm(MPI_Comm comm) { return private_comm(comm, 1); }

// `keep`: held until the call is done (the residual a.residual points into).
void start_async(MPI_Comm comm, const void* x, void* y, const CollArgs& a, MPI_Request* req,
                 std::shared_ptr<void> keep = nullptr);

// Finishes queued work and joins the worker (at MPI_Finalize).
void stop_async();

}  // namespace mpicomp::pmpi
