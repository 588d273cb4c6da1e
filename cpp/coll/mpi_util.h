// The core's MPI calls go through the PMPI_ names only: the same object code serves the
// LD_PRELOAD interposer, which redefines the MPI_ names, without calling back into itself.
#pragma once
#include <mpi.h>

#include <mutex>
#include <string>

#include "../codecs/errors.h"
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

// An attribute key made on first use, whichever thread asks first (two made at once would
// leave one communicator's value under the key that is then lost). One static per use.
class Keyval {
 public:
  explicit Keyval(MPI_Comm_delete_attr_function* del = MPI_COMM_NULL_DELETE_FN,
                  MPI_Comm_copy_attr_function* copy = MPI_COMM_NULL_COPY_FN)
      : del_(del), copy_(copy) {}
  int get() {
    std::call_once(once_, [this] {
      mpi_check(PMPI_Comm_create_keyval(copy_, del_, &id_, nullptr), "MPI_Comm_create_keyval");
    });
    return id_;
  }

 private:
  MPI_Comm_delete_attr_function* del_;
  MPI_Comm_copy_attr_function* copy_;
  std::once_flag once_;
  int id_ = MPI_KEYVAL_INVALID;
};

struct CommInfo {
  int rank, size;
  explicit CommInfo(MPI_Comm c) {
    mpi_check(PMPI_Comm_rank(c, &rank), "MPI_Comm_rank");
    mpi_check(PMPI_Comm_size(c, &size), "MPI_Comm_size");
  }
};

}  // namespace mpicomp
