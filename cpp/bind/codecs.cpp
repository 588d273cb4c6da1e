// The module's codec functions (layer 1): codec specs parsed and checked by the core's rules,
// and one encode or decode of host memory, without the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "../codecs/codec.h"
#include "../codecs/errors.h"
#include "../codecs/host_codec.h"
#include "../codecs/spec.h"
#include "args.h"

namespace py = pybind11;

namespace mpicomp {

void bind_codecs(py::module_& m) {
  m.def("split_auto", [](const std::string& text) -> py::object {
    std::string inner;
    return split_auto(text, inner) ? py::object(py::str(inner)) : py::object(py::none());
  }, "The codec spec an 'auto' or 'auto:<spec>' spec names, or None for another spec (codecs/spec.h)");
  m.def("split_codec_spec", [](const std::string& text) {
    std::string name, why;
    SpecOptions options;
    if (!split_spec(text, name, options, why)) throw Error(ErrorKind::codec, why);
    return py::make_tuple(name, options);
  }, "A codec spec's name and its [(key, value)] options, as text (codecs/spec.h)");
  m.def("wire_codec_spec", [](const std::string& name, const SpecOptions& given) {
    Spec s;
    SpecOptions in_force;
    std::string why;
    if (!wire_spec(name, given, s, in_force, why)) throw Error(ErrorKind::codec, why);
    return py::make_tuple(int(s.id), s.block, in_force);
  }, "A wire codec's (id, block, [(key, value)] options in force), its options checked (codecs/spec.h)");
  m.def("acc_dtype", [](int codec, int dtype) { return int(acc_dtype(CodecId(codec), DType(dtype))); },
        "The dtype id the collectives (and decode_accumulate) sum this codec's dtype in");
  m.def("encoded_bytes", [](int codec, uint32_t block, int dtype, size_t n) {
    return encoded_bytes(Spec{CodecId(codec), block}, DType(dtype), n);
  });
  m.def("encode", [](int codec, uint32_t block, int dtype, uintptr_t x, size_t n, uintptr_t residual, uintptr_t out) {
    py::gil_scoped_release nogil;
    return host_encode(Spec{CodecId(codec), block}, DType(dtype), ptr<void>(x), n, ptr<float>(residual),
                       ptr<uint8_t>(out));
  }, "Encodes into out (room for encoded_bytes); returns the bytes written");
  m.def("decode", [](int codec, uint32_t block, int dtype, uintptr_t in, size_t n, float scale, uintptr_t y,
                     bool stream) {
    py::gil_scoped_release nogil;
    host_decode(Spec{CodecId(codec), block}, DType(dtype), ptr<uint8_t>(in), n, scale, ptr<void>(y), stream);
  }, py::arg("codec"), py::arg("block"), py::arg("dtype"), py::arg("in"), py::arg("n"), py::arg("scale"),
     py::arg("y"), py::arg("stream") = false, "stream: float32 written with streaming stores (same values)");
  m.def("decode_accumulate", [](int codec, uint32_t block, int dtype, uintptr_t in, size_t n, uintptr_t acc,
                                 uintptr_t base) {
    py::gil_scoped_release nogil;
    const Spec s{CodecId(codec), block};
    host_decode_accumulate(s, DType(dtype), ptr<uint8_t>(in), n, acc_dtype(s.id, DType(dtype)), ptr<void>(acc),
                           ptr<void>(base));
  }, py::arg("codec"), py::arg("block"), py::arg("dtype"), py::arg("in"), py::arg("n"), py::arg("acc"),
     py::arg("base") = 0,
     "acc = base + decoded (base 0: acc += decoded), in what the collectives sum in (acc_dtype): float32, or "
     "float64 for float64 through none or a lossless codec and for codec bound");
  m.def("cpu_targets", &cpu_targets, "SIMD targets this CPU supports, best first");
  m.def("cpu_target", [] { return std::string(cpu_kernels().target); });
  m.def("set_cpu_target", &set_cpu_target);
}

}  // namespace mpicomp
