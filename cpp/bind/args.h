// What the binding files (module.cpp, cuda.cpp) share: a collective's arguments as Python
// hands them over (ids and addresses), turned into the core's CollArgs.
#pragma once
#include <mpi.h>
#include <pybind11/pybind11.h>

#include <cstdint>

#include "../codecs/spec.h"
#include "../coll/coll.h"

namespace mpicomp {

#ifdef MPICOMP_WITH_CUDA
void bind_cuda(pybind11::module_& m);  // cuda.cpp: the GPU functions of the module
#endif

// A codec as Python hands it to a collective: its CodecId, plus kAutoBit (codecs/spec.h) for
// codec "auto" (mpicomp.codec("auto:int4").call_id).
inline CollArgs coll_args(int codec, uint32_t block, int dtype, size_t count, bool avg, uintptr_t residual) {
  CollArgs a;
  a.spec = Spec{CodecId(codec & ~kAutoBit), block};
  a.adaptive = codec & kAutoBit;
  a.dtype = DType(dtype);
  a.count = count;
  a.avg = avg;
  a.residual = reinterpret_cast<float*>(residual);
  return a;
}

}  // namespace mpicomp
