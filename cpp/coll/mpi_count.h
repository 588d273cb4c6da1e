// The core's MPI calls whose counts can pass INT_MAX, with size_t counts. An MPI-4 library
// takes them as they are through its large-count `_c` functions; one without them (Open MPI
// 5, any MPI-3.1) gets the int-count calls, each count split to fit. CMake finds out which
// (MPICOMP_MPI_LARGE_COUNT); every call site is written once, against these wrappers.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "mpi_util.h"

// Builds without CMake's check (the tests' own) go by the standard version the header claims.
#ifndef MPICOMP_MPI_LARGE_COUNT
#define MPICOMP_MPI_LARGE_COUNT (MPI_VERSION >= 4)
#endif

// The largest count one int-count call is given. tests/pmpi/check_mpi_count.cpp lowers it to
// run the split paths with small buffers.
#ifndef MPICOMP_MPI_COUNT_MAX
#define MPICOMP_MPI_COUNT_MAX INT_MAX
#endif

namespace mpicomp::mpic {

// The collectives below (MPI's own) block when given no Requests, and otherwise start
// nonblocking, their requests appended (deadline.h: mpi_collective waits for them).
using Requests = std::vector<MPI_Request>;
inline MPI_Request* add(Requests* rs) { return &rs->emplace_back(MPI_REQUEST_NULL); }

#if MPICOMP_MPI_LARGE_COUNT

inline void isend_bytes(const void* b, size_t n, int peer, int tag, MPI_Comm c, MPI_Request* r) {
  mpi_check(PMPI_Isend_c(b, MPI_Count(n), MPI_BYTE, peer, tag, c, r), "MPI_Isend");
}
inline void irecv_bytes(void* b, size_t n, int peer, int tag, MPI_Comm c, MPI_Request* r) {
  mpi_check(PMPI_Irecv_c(b, MPI_Count(n), MPI_BYTE, peer, tag, c, r), "MPI_Irecv");
}
inline void recv_bytes(void* b, size_t n, int peer, int tag, MPI_Comm c) {
  mpi_check(PMPI_Recv_c(b, MPI_Count(n), MPI_BYTE, peer, tag, c, MPI_STATUS_IGNORE), "MPI_Recv");
}
inline void allreduce(const void* x, void* y, size_t n, MPI_Datatype t, MPI_Op op, MPI_Comm c, Requests* rs = nullptr) {
  mpi_check(rs ? PMPI_Iallreduce_c(x, y, MPI_Count(n), t, op, c, add(rs)) : PMPI_Allreduce_c(x, y, MPI_Count(n), t, op, c),
            "MPI_Allreduce");
}
inline void reduce_scatter_block(const void* x, void* y, size_t n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                                 Requests* rs = nullptr) {
  mpi_check(rs ? PMPI_Ireduce_scatter_block_c(x, y, MPI_Count(n), t, op, c, add(rs))
               : PMPI_Reduce_scatter_block_c(x, y, MPI_Count(n), t, op, c),
            "MPI_Reduce_scatter_block");
}
inline void allgather(const void* x, void* y, size_t n, MPI_Datatype t, MPI_Comm c, Requests* rs = nullptr) {
  mpi_check(rs ? PMPI_Iallgather_c(x, MPI_Count(n), t, y, MPI_Count(n), t, c, add(rs))
               : PMPI_Allgather_c(x, MPI_Count(n), t, y, MPI_Count(n), t, c),
            "MPI_Allgather");
}

#else

constexpr size_t kCountMax = size_t(MPICOMP_MPI_COUNT_MAX);

inline size_t extent(MPI_Datatype t) {
  MPI_Aint lb = 0, ext = 0;
  mpi_check(PMPI_Type_get_extent(t, &lb, &ext), "MPI_Type_get_extent");
  return size_t(ext);
}
template <class T>
T* plus(T* p, size_t bytes) {
  using B = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<B*>(p) + bytes);
}

// A message stays one message (one request, matched as one): above the limit its n bytes are
// one element of a derived type, whole pieces of kCountMax bytes and then the rest. The type
// is freed once the call has started, which MPI allows (the operation keeps it alive).
class Bytes {
 public:
  explicit Bytes(size_t n) {
    if (n <= kCountMax) {
      count = int(n);
      return;
    }
    MPI_Datatype piece, whole;
    const size_t q = n / kCountMax, rest = n % kCountMax;
    mpi_check(PMPI_Type_contiguous(int(kCountMax), MPI_BYTE, &piece), "MPI_Type_contiguous");
    mpi_check(PMPI_Type_contiguous(int(q), piece, &whole), "MPI_Type_contiguous");
    int lens[2] = {1, int(rest)};
    MPI_Aint at[2] = {0, MPI_Aint(q * kCountMax)};
    MPI_Datatype types[2] = {whole, MPI_BYTE};
    mpi_check(PMPI_Type_create_struct(rest ? 2 : 1, lens, at, types, &type), "MPI_Type_create_struct");
    mpi_check(PMPI_Type_commit(&type), "MPI_Type_commit");
    PMPI_Type_free(&whole);
    PMPI_Type_free(&piece);
    count = 1;
  }
  ~Bytes() {
    if (type != MPI_BYTE) PMPI_Type_free(&type);
  }
  Bytes(const Bytes&) = delete;
  Bytes& operator=(const Bytes&) = delete;
  int count = 0;
  MPI_Datatype type = MPI_BYTE;
};

inline void isend_bytes(const void* b, size_t n, int peer, int tag, MPI_Comm c, MPI_Request* r) {
  Bytes m(n);
  mpi_check(PMPI_Isend(b, m.count, m.type, peer, tag, c, r), "MPI_Isend");
}
inline void irecv_bytes(void* b, size_t n, int peer, int tag, MPI_Comm c, MPI_Request* r) {
  Bytes m(n);
  mpi_check(PMPI_Irecv(b, m.count, m.type, peer, tag, c, r), "MPI_Irecv");
}
inline void recv_bytes(void* b, size_t n, int peer, int tag, MPI_Comm c) {
  Bytes m(n);
  mpi_check(PMPI_Recv(b, m.count, m.type, peer, tag, c, MPI_STATUS_IGNORE), "MPI_Recv");
}

// Reductions work element by element, so a long vector is reduced piece by piece (a derived
// type cannot carry a predefined MPI_Op).
inline void allreduce(const void* x, void* y, size_t n, MPI_Datatype t, MPI_Op op, MPI_Comm c, Requests* rs = nullptr) {
  const size_t ext = extent(t);
  for (size_t o = 0; o < n; o += kCountMax) {
    const void* xo = x == MPI_IN_PLACE ? x : plus(x, o * ext);
    const int m = int(std::min(kCountMax, n - o));
    mpi_check(rs ? PMPI_Iallreduce(xo, plus(y, o * ext), m, t, op, c, add(rs)) : PMPI_Allreduce(xo, plus(y, o * ext), m, t, op, c),
              "MPI_Allreduce");
  }
}
// Above the limit, rank j's block is reduced onto rank j piece by piece (MPI_Reduce): rarer
// and slower than the one call, and needs no copy of the input.
inline void reduce_scatter_block(const void* x, void* y, size_t n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                                 Requests* rs = nullptr) {
  if (n <= kCountMax) {
    mpi_check(rs ? PMPI_Ireduce_scatter_block(x, y, int(n), t, op, c, add(rs)) : PMPI_Reduce_scatter_block(x, y, int(n), t, op, c),
              "MPI_Reduce_scatter_block");
    return;
  }
  CommInfo ci(c);
  const size_t ext = extent(t);
  for (int j = 0; j < ci.size; ++j)
    for (size_t o = 0; o < n; o += kCountMax) {
      const void* xo = plus(x, (size_t(j) * n + o) * ext);
      const int m = int(std::min(kCountMax, n - o));
      mpi_check(rs ? PMPI_Ireduce(xo, plus(y, o * ext), m, t, op, j, c, add(rs)) : PMPI_Reduce(xo, plus(y, o * ext), m, t, op, j, c),
                "MPI_Reduce");
    }
}
// Above the limit, piece by piece: each rank's piece lands at its block's place through a
// receive type whose extent is one whole block.
inline void allgather(const void* x, void* y, size_t n, MPI_Datatype t, MPI_Comm c, Requests* rs = nullptr) {
  if (n <= kCountMax) {
    mpi_check(rs ? PMPI_Iallgather(x, int(n), t, y, int(n), t, c, add(rs)) : PMPI_Allgather(x, int(n), t, y, int(n), t, c),
              "MPI_Allgather");
    return;
  }
  const size_t ext = extent(t);
  for (size_t o = 0; o < n; o += kCountMax) {
    int m = int(std::min(kCountMax, n - o));
    MPI_Datatype piece, strided;
    mpi_check(PMPI_Type_contiguous(m, t, &piece), "MPI_Type_contiguous");
    mpi_check(PMPI_Type_create_resized(piece, 0, MPI_Aint(n * ext), &strided), "MPI_Type_create_resized");
    mpi_check(PMPI_Type_commit(&strided), "MPI_Type_commit");
    int rc = rs ? PMPI_Iallgather(plus(x, o * ext), m, t, plus(y, o * ext), 1, strided, c, add(rs))
                : PMPI_Allgather(plus(x, o * ext), m, t, plus(y, o * ext), 1, strided, c);
    PMPI_Type_free(&strided);  // a started call keeps its types alive (MPI)
    PMPI_Type_free(&piece);
    mpi_check(rc, "MPI_Allgather");
  }
}

#endif

}  // namespace mpicomp::mpic
