// Whether all ranks of a communicator share one node's memory. Over shared memory the MPI
// library moves bytes about as fast as a core encodes them, so compression only adds time
// (bench/results, README "Measured"): with Config::skip_local set the collectives then send
// uncompressed (and count the call as skipped, reason "local"). MPICH run with
// MPIR_CVAR_NOLOCAL=1 (bench/netem) treats every rank as a node of its own.

#include "coll.h"
#include "mpi_util.h"

namespace mpicomp {

bool node_local(MPI_Comm comm) {
  static Keyval key;
  const int keyval = key.get();
  void* value = nullptr;
  int found = 0;
  mpi_check(PMPI_Comm_get_attr(comm, keyval, &value, &found), "MPI_Comm_get_attr");
  if (found) return value != nullptr;
  // First use on this communicator: a collective, reached by every rank at the start of the
  // same mpicomp call (calls on a communicator come in the same order on all its ranks).
  MPI_Comm shm;
  mpi_check(PMPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shm), "MPI_Comm_split_type");
  int n = 0, size = 0;
  PMPI_Comm_size(shm, &n);
  PMPI_Comm_size(comm, &size);
  PMPI_Comm_free(&shm);
  bool local = n == size;
  mpi_check(PMPI_Comm_set_attr(comm, keyval, local ? reinterpret_cast<void*>(1) : nullptr), "MPI_Comm_set_attr");
  return local;
}

}  // namespace mpicomp
