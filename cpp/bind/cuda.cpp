// The GPU codecs in mpicomp._core (CUDA builds only): device addresses and a stream handle in
// (e.g. torch.cuda.current_stream().cuda_stream), the GIL released while launching.
#include <cuda_runtime.h>
#include <pybind11/pybind11.h>

#include <string>

#include "../codecs/cuda/codec_cuda.h"
#include "../codecs/cuda/runtime.h"
#include "../codecs/host_codec.h"
#include "../coll/coll.h"
#include "../codecs/errors.h"
#include "args.h"
#include "comm.h"

namespace py = pybind11;
using namespace mpicomp;

namespace {

// The device a buffer lives on; BackendError when it is not device (or managed) memory.
int device_of(const void* p, const char* name) {
  cudaPointerAttributes a{};
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess || (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)) {
    cudaGetLastError();
    throw Error(ErrorKind::backend, std::string(name) + " is not CUDA device memory");
  }
  return a.device;
}

// __cuda_array_interface__'s stream numbers: 1 the legacy default stream, 2 per-thread.
cudaStream_t stream_of(uintptr_t s) {
  return s == 1 ? cudaStreamLegacy : s == 2 ? cudaStreamPerThread : reinterpret_cast<cudaStream_t>(s);
}

}  // namespace

void mpicomp::bind_cuda(py::module_& m) {
  // A collective on device buffers (x, y and the residual on one GPU), on the caller's
  // stream; returns when the results are in y. count as for the host bindings.
  m.def("cuda_collective", [](int coll, py::handle comm, uintptr_t x, uintptr_t y, size_t count, int dtype,
                              int codec, uint32_t block, bool avg, uintptr_t residual, uintptr_t stream) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    int dev = device_of(reinterpret_cast<void*>(x), "x");
    if (device_of(reinterpret_cast<void*>(y), "out") != dev)
      throw Error(ErrorKind::argument, "x and out are on different GPUs");
    cuda::DeviceScope on(dev);
    CollArgs a = coll_args(codec, block, dtype, count, avg, residual);
    a.engine = &cuda_engine(stream_of(stream), mpi_cuda_aware());
    try {
      collective(Coll(coll), c, reinterpret_cast<void*>(x), reinterpret_cast<void*>(y), a);
    } catch (const Error&) {
      try {
        a.engine->finish();  // no queued work may outlive the call; the first error is the one to report
      } catch (const Error&) {
      }
      throw;
    }
    a.engine->finish();
  });
  m.def("cuda_available", &cuda::available, "True when a CUDA device is usable");
  m.def("nvcomp_load", &cuda::nvcomp_load, "Loads nvCOMP from a path; returns '' or why it could not");
  m.def("nvcomp_loaded", &cuda::nvcomp_loaded);
  // Returns the bytes written (for lossless codecs the frame's size, after draining the stream).
  m.def("cuda_encode", [](int codec, uint32_t block, int dtype, uintptr_t x, size_t n, uintptr_t residual,
                          uintptr_t out, uintptr_t stream) {
    py::gil_scoped_release nogil;
    Spec s{CodecId(codec), block};
    auto* y = reinterpret_cast<uint8_t*>(out);
    if (is_lossless(s.id))
      return cuda::frame_encode(s.id, DType(dtype), reinterpret_cast<const void*>(x), n * dtype_size(DType(dtype)), y,
                                nullptr, reinterpret_cast<void*>(stream));
    cuda::encode(s, DType(dtype), reinterpret_cast<const void*>(x), n, reinterpret_cast<float*>(residual), y,
                 reinterpret_cast<void*>(stream));
    return encoded_bytes(s, DType(dtype), n);
  });
  m.def("cuda_decode", [](int codec, uint32_t block, int dtype, uintptr_t in, size_t n, float scale, uintptr_t y,
                          uintptr_t stream) {
    py::gil_scoped_release nogil;
    Spec s{CodecId(codec), block};
    auto* src = reinterpret_cast<const uint8_t*>(in);
    if (is_lossless(s.id)) {
      require_unscaled(scale);
      return cuda::frame_decode(s.id, src, nullptr, n * dtype_size(DType(dtype)), reinterpret_cast<uint8_t*>(y),
                                reinterpret_cast<void*>(stream));
    }
    cuda::decode(s, DType(dtype), src, n, scale, reinterpret_cast<void*>(y), reinterpret_cast<void*>(stream));
  });
  m.def("cuda_decode_accumulate", [](int codec, uint32_t block, int dtype, uintptr_t in, size_t n, uintptr_t acc,
                                     uintptr_t stream) {
    py::gil_scoped_release nogil;
    if (is_lossless(CodecId(codec)))
      throw Error(ErrorKind::argument, "cuda_decode_accumulate: lossless frames decode with cuda_decode");
    // The host binding's sum dtype (acc_dtype), so that both sum float64 through none alike.
    const Spec s{CodecId(codec), block};
    cuda::decode_accumulate(s, DType(dtype), reinterpret_cast<const uint8_t*>(in), n, acc_dtype(s.id, DType(dtype)),
                            reinterpret_cast<void*>(acc), reinterpret_cast<void*>(stream));
  }, "acc += decoded, in acc_dtype (as decode_accumulate)");
}
