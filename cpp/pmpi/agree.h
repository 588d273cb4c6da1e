// The settings that decide whether and how a call is compressed, agreed across a
// communicator's ranks at its first interposed call. Ranks whose MPICOMP_MIN_BYTES (say)
// differ would otherwise take different paths for the same call, one into MPI's own
// allreduce, the other into mpicomp's private duplicate, and the job would die inside
// MPI_Comm_dup with "Message truncated", naming nothing. Settings that only shape what one
// rank does (statistics, error feedback's memory, the timeout) are not agreed.
#pragma once
#include <mpi.h>

#include "settings.h"

namespace mpicomp::pmpi {

// True when every rank of comm (an intra-communicator) has the same such settings. Collective
// at the first call on comm (one PMPI_Allgather of a few dozen bytes; every rank makes it,
// because every rank's first interposed call on comm is the same collective), a look-up of a
// cached attribute after that. When they differ, every rank prints which variable differs,
// with its value on this rank and on the first rank that differs, and false is the answer
// for every later call on comm too.
bool settings_agree(MPI_Comm comm, const Settings& s);

}  // namespace mpicomp::pmpi
