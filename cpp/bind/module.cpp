// The private extension mpicomp._core: thin wrappers that take buffers as addresses (the
// Python layer has already checked them), then run the C++ core without the GIL.
#include <mpi.h>
#include <mpi4py/mpi4py.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../codecs/codec.h"
#include "../coll/coll.h"
#include "../coll/config.h"
#include "../core/errors.h"

namespace py = pybind11;
using namespace mpicomp;

namespace {

MPI_Comm comm_of(py::handle obj) {
  MPI_Comm* c = PyMPIComm_Get(obj.ptr());
  if (!c) throw py::error_already_set();
  return *c;
}

template <class T>
T* ptr(uintptr_t a) { return reinterpret_cast<T*>(a); }

CollArgs args(int codec, uint32_t block, int dtype, size_t count, bool avg, uintptr_t residual) {
  CollArgs a;
  a.spec = Spec{CodecId(codec), block};
  a.dtype = DType(dtype);
  a.count = count;
  a.avg = avg;
  a.residual = ptr<float>(residual);
  return a;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  if (import_mpi4py() < 0) throw py::error_already_set();

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mpicomp::Error& e) {
      const char* cls = e.kind == ErrorKind::codec            ? "CodecError"
                        : e.kind == ErrorKind::shape_mismatch ? "ShapeMismatchError"
                                                              : "BackendError";
      py::object type = py::module_::import("mpicomp.errors").attr(cls);
      PyErr_SetString(type.ptr(), e.what());
    }
  });

  // (address, elements, dtype char code, C-contiguous) of a numpy array: what the Python
  // layer checks on every call, read here because numpy computes it slowly in Python.
  m.def("ndarray_info", [](py::array a) {
    return py::make_tuple(reinterpret_cast<uintptr_t>(a.data()), a.size(), a.dtype().char_(),
                          bool(a.flags() & py::array::c_style));
  });

  // ---- codecs (layer 1), host memory ----
  m.def("encoded_bytes", [](int codec, uint32_t block, int dtype, size_t n) {
    return encoded_bytes(Spec{CodecId(codec), block}, DType(dtype), n);
  });
  m.def("encode", [](int codec, uint32_t block, int dtype, uintptr_t x, size_t n, uintptr_t residual, uintptr_t out) {
    py::gil_scoped_release nogil;
    cpu_kernels().encode(Spec{CodecId(codec), block}, DType(dtype), ptr<void>(x), n, ptr<float>(residual),
                         ptr<uint8_t>(out));
  });
  m.def("decode", [](int codec, uint32_t block, int dtype, uintptr_t in, size_t n, float scale, uintptr_t y) {
    py::gil_scoped_release nogil;
    cpu_kernels().decode(Spec{CodecId(codec), block}, DType(dtype), ptr<uint8_t>(in), n, scale, ptr<void>(y));
  });
  m.def("decode_accumulate", [](int codec, uint32_t block, int dtype, uintptr_t in, size_t n, uintptr_t acc) {
    py::gil_scoped_release nogil;
    cpu_kernels().decode_accumulate(Spec{CodecId(codec), block}, DType(dtype), ptr<uint8_t>(in), n, ptr<float>(acc));
  });
  m.def("cpu_targets", &cpu_targets, "SIMD targets this CPU supports, best first");
  m.def("cpu_target", [] { return std::string(cpu_kernels().target); });
  m.def("set_cpu_target", &set_cpu_target);

  // ---- collectives (layer 2) ----
  m.def("allreduce", [](py::handle comm, uintptr_t x, uintptr_t y, size_t count, int dtype, int codec, uint32_t block,
                        bool avg, uintptr_t residual) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    allreduce(c, ptr<void>(x), ptr<void>(y), args(codec, block, dtype, count, avg, residual));
  });
  m.def("reduce_scatter", [](py::handle comm, uintptr_t x, uintptr_t y, size_t count, int dtype, int codec,
                             uint32_t block, bool avg, uintptr_t residual) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    reduce_scatter(c, ptr<void>(x), ptr<void>(y), args(codec, block, dtype, count, avg, residual));
  });
  m.def("allgather", [](py::handle comm, uintptr_t x, uintptr_t y, size_t count, int dtype, int codec,
                        uint32_t block, uintptr_t residual) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    allgather(c, ptr<void>(x), ptr<void>(y), args(codec, block, dtype, count, false, residual));
  });
  m.def("send", [](py::handle comm, uintptr_t x, int dest, int tag, size_t count, int dtype, int codec,
                   uint32_t block, uintptr_t residual) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    send(c, ptr<void>(x), dest, tag, args(codec, block, dtype, count, false, residual));
  });
  m.def("recv", [](py::handle comm, uintptr_t y, int source, int tag, size_t count, int dtype, int codec,
                   uint32_t block) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    recv(c, ptr<void>(y), source, tag, args(codec, block, dtype, count, false, 0));
  });
  m.def("reject", [](py::handle comm, int coll) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    reject(c, Coll(coll));
  });

  m.def("get_config", [] {
    Config c = config();
    return py::make_tuple(c.min_bytes, c.eager_bytes, c.segment_bytes);
  });
  m.def("set_config", [](size_t min_bytes, size_t eager_bytes, size_t segment_bytes) {
    set_config(Config{min_bytes, eager_bytes, segment_bytes});
  });
}
