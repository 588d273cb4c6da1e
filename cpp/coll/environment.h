// The MPICOMP_* environment variables, every layer's (the Python API's config, the
// interposer's settings, the torch backend, the benchmarks): one list, so that a name outside
// it, a misspelling, is reported instead of silently ignored, as Open MPI reports an unknown
// MCA parameter.
#pragma once
#include <string>
#include <vector>

namespace mpicomp {

// The MPICOMP_* names set in this process's environment that no layer reads, sorted.
std::vector<std::string> unknown_environment();

// A byte count as every layer takes it (the *_BYTES variables, mpicomp.config, the
// benchmarks' -m): digits, then optionally K, M or G (powers of 1024) and B or iB, any case:
// "65536", "64K", "16MiB". False when text is none of these (or overflows).
bool parse_size(const std::string& text, size_t& out);

}  // namespace mpicomp
