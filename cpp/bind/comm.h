// mpi4py communicators in the bindings. mpi4py's C API is a set of static pointers per
// translation unit, which import_mpi4py() fills in the file that calls it only (another
// file's calls would go through null): comm.cpp is the one file that includes mpi4py.h, and
// every binding file takes communicators through it.
#pragma once
#include <mpi.h>
#include <pybind11/pybind11.h>

namespace mpicomp {

// Once, when the module is imported, before any comm_of.
void import_mpi4py_api();

// The MPI_Comm of an mpi4py communicator.
MPI_Comm comm_of(pybind11::handle obj);

}  // namespace mpicomp
