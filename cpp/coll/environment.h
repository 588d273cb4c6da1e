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

}  // namespace mpicomp
