// What the binding files (module.cpp, cuda.cpp) share: a collective's arguments as Python
// hands them over (ids and addresses), turned into the core's CollArgs.
#pragma once
#include <mpi.h>
#include <pybind11/pybind11.h>

#include <cstdint>

#include "../coll/coll.h"

namespace mpicomp {

// The MPI_Comm of an mpi4py communicator. Defined in module.cpp, the one file that includes
// mpi4py.h: its C API is a set of static pointers per translation unit, which import_mpi4py()
// fills in the file that calls it only (another file's calls would go through null).
MPI_Comm comm_of(pybind11::handle obj);

inline CollArgs coll_args(int codec, uint32_t block, int dtype, size_t count, bool avg, uintptr_t residual) {
  CollArgs a;
  a.spec = Spec{CodecId(codec), block};
  a.dtype = DType(dtype);
  a.count = count;
  a.avg = avg;
  a.residual = reinterpret_cast<float*>(residual);
  return a;
}

}  // namespace mpicomp
