/* A link that damages messages, for tests/test_damaged_frames.py: preloaded into every rank,
 * it replaces the payload of the first DAMAGE_MESSAGES data messages (mpicomp's stage tags)
 * that rank DAMAGE_RANK sends with 0xFF bytes, which no lossless frame header accepts. The
 * core sends through PMPI_Isend_c (MPI-4) or PMPI_Isend (MPI-3.1); the damaged copies are
 * never freed (a test's few messages). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static const int kStageTags[] = {0x6d64, 0x6d65};

static const void* damaged(const void* buf, size_t bytes, int tag) {
  static int left = -1, me = -1;
  if (left < 0) {
    left = getenv("DAMAGE_MESSAGES") ? atoi(getenv("DAMAGE_MESSAGES")) : 1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &me);
  }
  const char* who = getenv("DAMAGE_RANK");
  if (!who || atoi(who) != me || left == 0 || (tag != kStageTags[0] && tag != kStageTags[1])) return buf;
  --left;
  void* copy = malloc(bytes ? bytes : 1);
  memset(copy, 0xFF, bytes);
  return copy;
}

static int bytes_of(MPI_Datatype t, size_t* size) {
  int s;
  PMPI_Type_size(t, &s);
  *size = (size_t)s;
  return s > 0;
}

int PMPI_Isend(const void* buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm c, MPI_Request* r) {
  static int (*real)(const void*, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request*);
  if (!real) *(void**)&real = dlsym(RTLD_NEXT, "PMPI_Isend");
  size_t size;
  if (bytes_of(t, &size)) buf = damaged(buf, size * (size_t)count, tag);
  return real(buf, count, t, dest, tag, c, r);
}

#if MPI_VERSION >= 4
int PMPI_Isend_c(const void* buf, MPI_Count count, MPI_Datatype t, int dest, int tag, MPI_Comm c, MPI_Request* r) {
  static int (*real)(const void*, MPI_Count, MPI_Datatype, int, int, MPI_Comm, MPI_Request*);
  if (!real) *(void**)&real = dlsym(RTLD_NEXT, "PMPI_Isend_c");
  size_t size;
  if (bytes_of(t, &size)) buf = damaged(buf, size * (size_t)count, tag);
  return real(buf, count, t, dest, tag, c, r);
}
#endif
