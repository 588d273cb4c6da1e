// The private extension mpicomp._core: thin wrappers that take buffers as addresses (the
// Python layer has already checked them), then run the C++ core without the GIL.
#include <mpi.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../codecs/codec.h"
#include "../codecs/parallel.h"
#include "../codecs/spec.h"
#include "../coll/coll.h"
#include "../coll/config.h"
#include "../coll/deadline.h"
#include "../coll/environment.h"
#include "../coll/scratch.h"
#include "../coll/stages.h"
#include "../coll/topology.h"
#include "../codecs/errors.h"
#include "args.h"
#include "comm.h"

namespace py = pybind11;
using namespace mpicomp;

namespace {

// numpy's one-character type codes of the dtypes mpicomp takes, and their DType.
int numpy_dtype(char code) {
  switch (code) {
    case 'f': return int(DType::f32);
    case 'e': return int(DType::f16);
    case 'd': return int(DType::f64);
    case 'b': return int(DType::i8);
    case 'B': return int(DType::u8);
    case 'h': return int(DType::i16);
    case 'i': return int(DType::i32);
    case 'l': case 'q': return sizeof(long) == 8 || code == 'q' ? int(DType::i64) : int(DType::i32);
    default: return -1;
  }
}

std::string strides_of(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.strides(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// The argument checks of every kind of array: numpy's below call them directly, torch's and
// cupy's (_buffers.py) through the bindings, so that each rule and its message exist once.

// `shown` is how the caller's library writes the dtype.
[[noreturn]] void unsupported_dtype(const std::string& name, const std::string& shown) {
  throw Error(ErrorKind::codec, name + " has dtype " + shown + ", which mpicomp does not support (float32, float16, "
                                "bfloat16, float64, or an integer type with codec 'none')");
}

// The elements of a collective's output for n of input. out_mode: 0 out is like x, 1 out has
// n/size elements, 2 n*size.
size_t result_elems(size_t n, int out_mode, int size) {
  if (out_mode == 1 && n % size_t(size))
    throw Error(ErrorKind::argument, "reduce_scatter: x has " + std::to_string(n) +
                                         " elements, which is not a multiple of the communicator size " +
                                         std::to_string(size));
  return out_mode == 1 ? n / size_t(size) : out_mode == 2 ? n * size_t(size) : n;
}

void check_out_elems(size_t got, size_t m) {
  if (got != m)
    throw Error(ErrorKind::argument, "out has " + std::to_string(got) + " elements but the result has " +
                                         std::to_string(m));
}

// The DType of a contiguous array of a supported dtype; `name` is the argument's name.
int checked_dtype(const py::array& a, const char* name) {
  if (!(a.flags() & py::array::c_style))
    throw Error(ErrorKind::argument, std::string(name) + " must be C-contiguous (got strides " + strides_of(a) +
                                         "); pass np.ascontiguousarray(" + name + ")");
  // numpy's type character is the same for both byte orders: a foreign one would be summed
  // as if it were native. (numpy reports the native order as '=', a foreign one as '<' or '>'.)
  const char order = a.dtype().byteorder();
  if (order == '<' || order == '>')
    throw Error(ErrorKind::argument, std::string(name) + " has non-native byte order (dtype " +
                                         std::string(py::str(a.dtype().attr("str"))) + "); pass " + name +
                                         ".astype(" + name + ".dtype.newbyteorder('='))");
  int dt = numpy_dtype(a.dtype().char_());
  if (dt < 0) unsupported_dtype(name, py::str(a.dtype()));
  return dt;
}

// The rules of dtype, codec and op together, for numpy arrays and torch tensors alike, and
// for a codec alone (mpicomp.Codec.check_dtype: avg false). `name`: the array's.
void check_combination(int dt, int codec, bool avg, const std::string& name) {
  if (dt >= int(DType::i8) && codec != int(CodecId::none))
    throw Error(ErrorKind::codec, std::string("codec '") + codec_name(CodecId(codec)) +
                                      "' compresses floating-point data only, but " + name + " has dtype " +
                                      dtype_name(DType(dt)) + "; use codec='none' for integer arrays");
  // float64 goes through the codecs that sum it in float64 (format.h: acc_dtype): none and the
  // lossless ones, whose frames move it exactly, and bound, which quantises in float64. The
  // other lossy codecs quantise in float32, which would round float64 or overflow it to inf.
  if (dt == int(DType::f64) && acc_dtype(CodecId(codec), DType::f64) != DType::f64)
    throw Error(ErrorKind::codec, std::string("codec '") + codec_name(CodecId(codec)) +
                                      "' computes in float32, but " + name + " has dtype float64, whose values it "
                                      "would round (or overflow to inf); use codec='none' or a lossless codec for "
                                      "float64 (exact), or pass " + name + ".astype('float32') to compress");
  if (dt >= int(DType::i8) && avg)
    throw Error(ErrorKind::argument, std::string("op='avg' needs a floating-point x, got dtype ") +
                                         dtype_name(DType(dt)));
}

struct NumpyArgs {
  py::array y;
  void* xp;
  void* yp;
  size_t n;
  int dt;
};

// The collectives read x while they write out: out may be x itself (allreduce in place), but
// any other overlap would read values already overwritten.
void refuse_partial_overlap(const void* x, size_t xbytes, const void* y, size_t ybytes, bool in_place_ok) {
  auto xa = reinterpret_cast<uintptr_t>(x), ya = reinterpret_cast<uintptr_t>(y);
  if (xbytes == 0 || ybytes == 0 || xa + xbytes <= ya || ya + ybytes <= xa) return;
  if (in_place_ok && xa == ya && xbytes == ybytes) return;
  throw Error(ErrorKind::argument, std::string("out overlaps x") + (in_place_ok ? " partially" : "") +
                                       "; pass " + (in_place_ok ? "out=x (in place) or " : "") +
                                       "an array that does not share x's memory");
}

// Checks a numpy input and output of a collective in one call (every call makes it, so it
// must be cheap): returns (out, x address, out address, x elements, dtype id), allocating
// out when None. out_mode as for result_elems.
NumpyArgs numpy_args(const py::array& x, py::handle out, int out_mode, int size) {
  int dt = checked_dtype(x, "x");
  const size_t n = size_t(x.size()), m = result_elems(n, out_mode, size);
  py::array y;
  if (out.is_none()) {
    y = out_mode == 0 ? py::array(x.dtype(), std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()))
                      : py::array(x.dtype(), std::vector<py::ssize_t>{py::ssize_t(m)});
  } else {
    if (!py::isinstance<py::array>(out))
      throw Error(ErrorKind::argument, "out must be a numpy array like x, got " +
                                           std::string(py::str(py::type::of(out).attr("__name__"))));
    y = py::reinterpret_borrow<py::array>(out);
    if (!y.dtype().is(x.dtype()))
      throw Error(ErrorKind::argument, "out must be a numpy array of " + std::string(py::str(x.dtype())) +
                                           " like x, got one of " + std::string(py::str(y.dtype())));
    if (!(y.flags() & py::array::c_style))
      throw Error(ErrorKind::argument, "out must be C-contiguous (got strides " + strides_of(y) + ")");
    check_out_elems(size_t(y.size()), m);
    if (!y.writeable()) throw Error(ErrorKind::argument, "out is read-only");
    refuse_partial_overlap(x.data(), size_t(x.nbytes()), y.data(), size_t(y.nbytes()), out_mode == 0);
  }
  return NumpyArgs{y, const_cast<void*>(x.data()), y.mutable_data(), n, dt};
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  import_mpi4py_api();

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mpicomp::Error& e) {
      const char* cls = e.kind == ErrorKind::codec            ? "CodecError"
                        : e.kind == ErrorKind::shape_mismatch ? "ShapeMismatchError"
                        : e.kind == ErrorKind::argument       ? "ArgumentError"
                        : e.kind == ErrorKind::timeout        ? "CommTimeoutError"
                                                              : "BackendError";
      py::object type = py::module_::import("mpicomp.errors").attr(cls);
      PyErr_SetString(type.ptr(), e.what());
    }
  });

  // The ids the Python layer passes back in every call, and the frame layout its frame
  // checks read: defined once, in format.h and handshake.h.
  py::dict dtypes, codecs, colls;
  for (int i = 0; i < kDTypes; ++i)
    dtypes[dtype_name(DType(i))] = py::make_tuple(i, dtype_size(DType(i)), is_float(DType(i)));
  for (int i = 0; i < kCodecs; ++i) codecs[codec_name(CodecId(i))] = i;
  for (Coll c : {Coll::allreduce, Coll::reduce_scatter, Coll::allgather}) colls[coll_name(c)] = int(c);
  m.attr("DTYPES") = dtypes;  // name: (id, bytes per element, floating point)
  m.attr("CODEC_IDS") = codecs;
  m.attr("COLL_IDS") = colls;
  m.attr("FRAME_ALIGN") = kFrameAlign;
  m.attr("CHUNK_BYTES") = kChunkBytes;
  m.attr("RAW_CHUNK") = kRawChunk;
  m.attr("STREAM_BYTES") = kStreamBytes;
  m.attr("AUTO_BIT") = kAutoBit;
  // The back-off of every wait, in seconds: spin, then naps growing by a step up to a cap.
  m.attr("WAIT_BACKOFF") = py::make_tuple(kWaitSpin.count() / 1e6, kWaitNap.count() / 1e6, kWaitMaxNap.count() / 1e6);

  m.def("numpy_args", [](const py::array& x, py::handle out, int out_mode, int size) {
    NumpyArgs t = numpy_args(x, out, out_mode, size);
    return py::make_tuple(t.y, reinterpret_cast<uintptr_t>(t.xp), reinterpret_cast<uintptr_t>(t.yp), t.n, t.dt);
  });
  m.def("check_combination", &check_combination, py::arg("dtype"), py::arg("codec"), py::arg("avg"),
        py::arg("name") = "x");
  m.def("unsupported_dtype", &unsupported_dtype, "Raises the CodecError of a dtype that is not in DTYPES");
  m.def("result_elems", &result_elems);
  // A given out of `got` elements at y, for a result of m (ybytes) and x at x (xbytes).
  m.def("check_out", [](uintptr_t x, size_t xbytes, uintptr_t y, size_t ybytes, size_t got, size_t m,
                        bool in_place_ok) {
    check_out_elems(got, m);
    refuse_partial_overlap(reinterpret_cast<const void*>(x), xbytes, reinterpret_cast<const void*>(y), ybytes,
                           in_place_ok);
  });
  // A whole collective on numpy arrays in one call (the common case; its checks are a few
  // hundred nanoseconds here against microseconds in Python). Argument errors reach the other
  // ranks through reject(), as in the Python path. Returns out.
  m.def("numpy_collective", [](int coll, py::handle comm, const py::array& x, py::handle out, int codec,
                               uint32_t block, bool avg) {
    MPI_Comm c = comm_of(comm);
    int size = 1;
    PMPI_Comm_size(c, &size);
    NumpyArgs t;
    try {
      t = numpy_args(x, out, coll == int(Coll::reduce_scatter) ? 1 : coll == int(Coll::allgather) ? 2 : 0, size);
      check_combination(t.dt, codec & ~kAutoBit, avg, "x");
    } catch (const Error&) {
      try {
        py::gil_scoped_release nogil;
        reject(c, Coll(coll));
      } catch (const Error&) {
      }
      throw;
    }
    CollArgs a = coll_args(codec, block, t.dt, coll == int(Coll::reduce_scatter) ? t.n / size_t(size) : t.n, avg, 0);
    try {
      py::gil_scoped_release nogil;
      collective(Coll(coll), c, t.xp, t.yp, a);
    } catch (const Error& e) {
      // A timed-out call's buffers stay alive, as collectives.py's _execute keeps them.
      if (e.kind == ErrorKind::timeout)
        py::module_::import("mpicomp.collectives").attr("_abandoned").attr("append")(py::make_tuple(x, t.y));
      throw;
    }
    return t.y;
  });
  m.def("numpy_info", [](const py::array& a, const char* name) {
    int dt = checked_dtype(a, name);
    return py::make_tuple(reinterpret_cast<uintptr_t>(a.data()), size_t(a.size()), dt);
  });

  bind_codecs(m);

  // ---- collectives (layer 2) ----
  // A collective (Coll id) on host buffers; count as the core's function takes it. The same
  // arguments as cuda_collective, less the stream.
  m.def("collective", [](int coll, py::handle comm, uintptr_t x, uintptr_t y, size_t count, int dtype, int codec,
                         uint32_t block, bool avg, uintptr_t residual) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    collective(Coll(coll), c, ptr<void>(x), ptr<void>(y), coll_args(codec, block, dtype, count, avg, residual));
  });
  m.def("send", [](py::handle comm, uintptr_t x, int dest, int tag, size_t count, int dtype, int codec,
                   uint32_t block, uintptr_t residual) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    send(c, ptr<void>(x), dest, tag, coll_args(codec, block, dtype, count, false, residual));
  });
  m.def("recv", [](py::handle comm, uintptr_t y, int source, int tag, size_t count, int dtype, int codec,
                   uint32_t block) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    recv(c, ptr<void>(y), source, tag, coll_args(codec, block, dtype, count, false, 0));
  });
  m.def("reject", [](py::handle comm, int coll) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    reject(c, Coll(coll));
  });

  m.def("mpi_cuda_aware", &mpi_cuda_aware, "True when the MPI library takes CUDA device pointers");
#ifdef MPICOMP_WITH_CUDA
  bind_cuda(m);
#else
  m.def("cuda_available", [] { return false; }, "True when a CUDA device is usable (never: built without CUDA)");
#endif

  m.def("get_config", [] {
    Config c = config();
    return py::make_tuple(c.min_bytes, c.eager_bytes, c.segment_bytes, size_t(c.skip_local), size_t(c.verbose),
                          c.timeout_s, c.cache_bytes, size_t(c.hierarchy), c.ranks_per_node, c.auto_reprobe_s,
                          c.gpu_segment_bytes);
  });
  m.def("set_config", [](size_t min_bytes, size_t eager_bytes, size_t segment_bytes, size_t skip_local,
                         size_t verbose, double timeout_s, size_t cache_bytes, size_t hierarchy, size_t ranks_per_node,
                         double auto_reprobe_s, size_t gpu_segment_bytes) {
    set_config(Config{min_bytes, eager_bytes, segment_bytes, skip_local != 0, verbose != 0, timeout_s, cache_bytes,
                      Hierarchy(hierarchy), ranks_per_node, auto_reprobe_s, gpu_segment_bytes});
  });
  // A communicator's nodes (topology.h): collective on its first use, as any mpicomp call.
  m.def("node_layout", [](py::handle comm) {
    MPI_Comm c = comm_of(comm);
    NodeLayout L;
    {
      py::gil_scoped_release nogil;
      CallScope scope(config(), c);
      L = node_layout(c);
    }
    return py::make_tuple(L.node_of, L.node, L.local, L.lanes, L.ranks_per_node);
  });
  m.def("segment_elements", [](int codec, uint32_t block, int dtype, size_t segment_bytes) {
    return segment_elems(Spec{CodecId(codec), block}, DType(dtype), segment_bytes);
  }, "Elements per pipelined message for a codec, dtype and config.segment_bytes");
  m.def("scratch_held", &scratch_held);
  m.def("set_codec_threads", &set_codec_threads, "Threads per codec call; 0: the default (codecs/parallel.h)");
  m.def("codec_threads", &codec_threads, "Threads per codec call in use");
  m.def("timed_out", [](py::handle comm) { return timed_out(comm_of(comm)); });
  m.def("unknown_environment", &unknown_environment, "MPICOMP_* variables set here that no layer reads");
  m.def("environment_settings", [] {
    std::vector<SettingValue> values;
    std::string error;
    if (!read_environment(values, error)) throw Error(ErrorKind::argument, "invalid setting " + error);
    py::dict out;
    for (const SettingValue& v : values)
      out[v.rule->name] = v.rule->kind == SettingKind::seconds     ? py::object(py::float_(v.seconds))
                          : v.rule->kind == SettingKind::hierarchy ? py::object(py::str(v.integer ? "flat" : "auto"))
                                                                   : py::object(py::int_(v.integer));
    return out;
  }, "{setting: value} of the MPICOMP_* settings set here, by the rules every layer shares (coll/environment.h)");
  m.def("setting_rules", [] {
    static const char* kinds[] = {"bytes", "count", "seconds", "flag", "hierarchy"};
    py::dict out;
    for (const SettingRule& r : setting_rules())
      out[r.name] = r.kind == SettingKind::seconds
                        ? py::object(py::make_tuple(r.var, kinds[int(r.kind)], r.lo, r.hi))
                        : py::object(py::make_tuple(r.var, kinds[int(r.kind)], uint64_t(r.lo), uint64_t(r.hi)));
    return out;
  }, "{setting: (variable, kind, lo, hi)}: the table of coll/environment.h");
  m.def("parse_size", [](const std::string& text) -> py::object {
    size_t n = 0;
    return parse_size(text, n) ? py::object(py::int_(n)) : py::object(py::none());
  }, "A byte count as every layer takes it ('65536', '64K', '16MiB'), or None");
  m.def("timeout_of", [](py::handle comm, double configured) { return timeout_of(comm_of(comm), configured); });
  m.def("set_timeout", [](py::handle comm, double seconds) { set_timeout(comm_of(comm), seconds); },
        "Calls on comm, and on its later duplicates, wait at most seconds (0: no limit)");

  bind_measured(m);
}
