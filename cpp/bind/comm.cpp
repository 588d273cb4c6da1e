#include "comm.h"

#include <mpi4py/mpi4py.h>

namespace py = pybind11;

namespace mpicomp {

void import_mpi4py_api() {
  if (import_mpi4py() < 0) throw py::error_already_set();
}

MPI_Comm comm_of(py::handle obj) {
  MPI_Comm* c = PyMPIComm_Get(obj.ptr());
  if (!c) throw py::error_already_set();
  return *c;
}

}  // namespace mpicomp
