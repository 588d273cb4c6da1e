// The core's MPI calls go through the PMPI_ names only: the same object code serves the
// LD_PRELOAD interposer, which redefines the MPI_ names, without calling back into itself.
#pragma once
#include <mpi.h>

#include <string>

#include "../core/errors.h"
#include "../codecs/format.h"

namespace mpicomp {

inline void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  PMPI_Error_string(rc, msg, &len);
  throw Error(ErrorKind::backend, std::string(what) + " failed: " + std::string(msg, len));
}

// The MPI datatype of a dtype, for the uncompressed path through the MPI library itself
// (MPI_DATATYPE_NULL where MPI has no sum for it: 16-bit floats).
inline MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i8: return MPI_INT8_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i16: return MPI_INT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

struct CommInfo {
  int rank, size;
  explicit CommInfo(MPI_Comm c) {
    mpi_check(PMPI_Comm_rank(c, &rank), "MPI_Comm_rank");
    mpi_check(PMPI_Comm_size(c, &size), "MPI_Comm_size");
  }
};

}  // namespace mpicomp
