// What the binding files (module.cpp, codecs.cpp, measured.cpp, cuda.cpp) share: a
// collective's arguments as Python hands them over (ids and addresses), turned into the
// core's CollArgs, and the functions each file adds to the module.
#pragma once
#include <mpi.h>
#include <pybind11/pybind11.h>

#include <cstdint>

#include "../codecs/spec.h"
#include "../coll/coll.h"

namespace mpicomp {

// The module's functions by layer, each in its file.
void bind_codecs(pybind11::module_& m);    // codecs.cpp: codec specs, encode and decode
void bind_measured(pybind11::module_& m);  // measured.cpp: codec "auto"'s model, the statistics
#ifdef MPICOMP_WITH_CUDA
void bind_cuda(pybind11::module_& m);  // cuda.cpp: the GPU functions of the module
#endif

// A buffer Python hands over as an address.
template <class T>
T* ptr(uintptr_t a) {
  return reinterpret_cast<T*>(a);
}

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
