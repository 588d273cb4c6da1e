// Error feedback under the interposer (MPICOMP_ERROR_FEEDBACK=1): one float32 residual per
// (communicator, receive buffer address, count), added to the next call with the same key.
// A program has no handle for "this gradient", so the buffer's address stands for it: a
// training loop that reuses its buffers gets feedback per buffer. A buffer freed and another
// allocated at the same address with the same count inherits the old residual (the error of
// one earlier call: bounded by the codec's error bound, and harmless for gradients, which is
// what error feedback is for). The residuals are bounded (MPICOMP_RESIDUAL_BYTES): past the
// bound the least recently used are dropped, which costs those buffers one step's feedback;
// those of a communicator go when it is freed.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace mpicomp::pmpi {

using Residual = std::shared_ptr<std::vector<float>>;

// The residual of n floats for this key (zeros when new). The caller holds it for as long as
// the call uses it: an entry dropped meanwhile stays alive until then.
Residual residual_for(MPI_Comm comm, const void* buffer, MPI_Count count, size_t n, size_t limit_bytes);
// Drops the residuals of a communicator being freed.
void forget_residuals(MPI_Comm comm);
void clear_residuals();
// Bytes held, for tests and the statistics.
size_t residual_bytes();

}  // namespace mpicomp::pmpi
