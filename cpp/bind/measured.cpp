// The module's functions that report what the core measured: codec "auto"'s model of a
// communicator (adaptive.h) and the statistics of the calls (stats.h).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "../codecs/errors.h"
#include "../coll/adaptive.h"
#include "../coll/stats.h"
#include "args.h"
#include "comm.h"

namespace py = pybind11;

namespace mpicomp {
namespace {

// {name: count} of the non-zero counts (reasons, algorithms) of the statistics.
template <class E>
py::dict counts(const double* n, int size, const char* (*name)(E)) {
  py::dict d;
  for (int k = 0; k < size; ++k)
    if (n[k] > 0) d[name(E(k))] = static_cast<long long>(n[k]);
  return d;
}

}  // namespace

void bind_measured(py::module_& m) {
  // codec "auto" (adaptive.h)
  m.def("auto_model", [](py::handle comm, int coll, int dtype, int codec, uint32_t block) -> py::object {
    int probes = 0;
    std::optional<AutoModel> m =
        auto_model(comm_of(comm), Coll(coll), DType(dtype), Spec{CodecId(codec), block}, &probes);
    if (!m) return py::none();
    return py::dict(py::arg("bytes") = m->bytes, py::arg("plain") = m->plain, py::arg("packed") = m->packed,
                    py::arg("plain_flat") = m->plain_flat, py::arg("packed_flat") = m->packed_flat,
                    py::arg("break_even") = m->break_even(), py::arg("probes") = probes,
                    py::arg("describe") = m->describe(codec_name(CodecId(codec))));
  }, "comm's measured model for (collective, dtype, codec), or None");
  m.def("auto_install", [](py::handle comm, int coll, int dtype, int codec, uint32_t block, std::vector<double> bytes,
                           std::vector<double> plain, std::vector<double> packed, std::vector<double> plain_flat,
                           std::vector<double> packed_flat) {
    MPI_Comm c = comm_of(comm);
    py::gil_scoped_release nogil;
    auto_install(c, Coll(coll), DType(dtype), Spec{CodecId(codec), block},
                 AutoModel{bytes, plain, packed, plain_flat, packed_flat});
  }, py::arg("comm"), py::arg("coll"), py::arg("dtype"), py::arg("codec"), py::arg("block"), py::arg("bytes"),
     py::arg("plain"), py::arg("packed"), py::arg("plain_flat") = std::vector<double>{},
     py::arg("packed_flat") = std::vector<double>{},
     "Installs a model given by every rank (the slowest rank's times, as a probe agrees them). Collective");
  m.def("auto_evaluate", [](std::vector<double> bytes, std::vector<double> plain, std::vector<double> packed,
                            std::vector<double> sizes, std::vector<double> plain_flat,
                            std::vector<double> packed_flat) {
    const AutoModel m{bytes, plain, packed, plain_flat, packed_flat};
    if (!m.well_formed())
      throw Error(ErrorKind::shape_mismatch, "auto_evaluate: every curve needs a time at each size");
    std::vector<std::string> decisions;
    std::vector<bool> flat;
    for (double b : sizes) {
      const std::optional<Skip> why = m.decide(b);
      decisions.push_back(why ? skip_name(*why) : "compress");
      flat.push_back(m.flat(!why, b));
    }
    return py::make_tuple(m.break_even(), decisions, flat);
  }, py::arg("bytes"), py::arg("plain"), py::arg("packed"), py::arg("sizes"),
     py::arg("plain_flat") = std::vector<double>{}, py::arg("packed_flat") = std::vector<double>{},
     "(break-even bytes, the decision at each of sizes: 'compress', 'auto_small' or 'auto_link', and whether it "
     "goes flat) of a model");

  // ---- statistics (stats.h) ----
  m.def("stats", [] {
    Stats s = stats();
    py::dict out;
    for (int i = 1; i < kStatColls; ++i) {
      const CollStats& c = s.coll[i];
      py::dict skipped = counts(c.skipped, kSkips, skip_name), algorithms = counts(c.algorithm, kAlgos, algo_name);
      out[coll_name(Coll(i))] = py::dict(py::arg("calls") = static_cast<long long>(c.calls),
                                         py::arg("compressed") = static_cast<long long>(c.compressed),
                                         py::arg("bytes_in") = static_cast<long long>(c.bytes_in),
                                         py::arg("bytes_wire") = static_cast<long long>(c.bytes_wire),
                                         py::arg("bytes_plain") = static_cast<long long>(c.bytes_plain),
                                         py::arg("bytes_inter") = static_cast<long long>(c.bytes_inter),
                                         py::arg("bytes_intra") = static_cast<long long>(c.bytes_intra),
                                         py::arg("algorithms") = algorithms,
                                         py::arg("seconds") = c.seconds, py::arg("skipped") = skipped,
                                         py::arg("probes") = static_cast<long long>(c.probes),
                                         py::arg("probe_seconds") = c.probe_seconds);
    }
    return out;
  });
  m.def("stats_reset", &stats_reset);
  m.def("thread_bytes", [] {
    const auto [wire, plain] = thread_bytes();
    return py::make_tuple(uint64_t(wire), uint64_t(plain));
  }, "(bytes_wire, bytes_plain) of the calls this thread ran so far");
  m.def("stats_table", [](const std::string& title) { return stats_table(stats(), title); });
}

}  // namespace mpicomp
