#include <mpi.h>
#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include "engine.h"

namespace mpicomp {

bool mpi_cuda_aware() {
#if defined(MPIX_GPU_SUPPORT_CUDA)  // MPICH 4 and later
  int ok = 0;
  return PMPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &ok) == MPI_SUCCESS && ok;
#elif defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT  // Open MPI built with CUDA
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

}  // namespace mpicomp
