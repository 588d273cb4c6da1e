// The GPU codecs in mpicomp._core (CUDA builds only): device addresses and a stream handle in
// (e.g. torch.cuda.current_stream().cuda_stream), the GIL released while launching.
#include <pybind11/pybind11.h>

#include "../codecs/cuda/codec_cuda.h"

namespace py = pybind11;
using namespace mpicomp;

void bind_cuda(py::module_& m) {
  m.def("cuda_available", &cuda::available, "True when a CUDA device is usable");
  m.def("cuda_encode", [](int codec, uint32_t block, int dtype, uintptr_t x, size_t n, uintptr_t residual,
                          uintptr_t out, uintptr_t stream) {
    py::gil_scoped_release nogil;
    cuda::encode(Spec{CodecId(codec), block}, DType(dtype), reinterpret_cast<const void*>(x), n,
                 reinterpret_cast<float*>(residual), reinterpret_cast<uint8_t*>(out), reinterpret_cast<void*>(stream));
  });
  m.def("cuda_decode", [](int codec, uint32_t block, int dtype, uintptr_t in, size_t n, float scale, uintptr_t y,
                          uintptr_t stream) {
    py::gil_scoped_release nogil;
    cuda::decode(Spec{CodecId(codec), block}, DType(dtype), reinterpret_cast<const uint8_t*>(in), n, scale,
                 reinterpret_cast<void*>(y), reinterpret_cast<void*>(stream));
  });
  m.def("cuda_decode_accumulate", [](int codec, uint32_t block, int dtype, uintptr_t in, size_t n, uintptr_t acc,
                                     uintptr_t stream) {
    py::gil_scoped_release nogil;
    cuda::decode_accumulate(Spec{CodecId(codec), block}, DType(dtype), reinterpret_cast<const uint8_t*>(in), n,
                            reinterpret_cast<float*>(acc), reinterpret_cast<void*>(stream));
  });
}
