// Errors the C++ core raises, in every layer (hence here, in layer 1). The Python layer maps
// each kind onto the matching mpicomp.MpicompError subclass (bindings) and the interposer
// onto an MPI error message.
#pragma once
#include <stdexcept>
#include <string>

namespace mpicomp {

enum class ErrorKind { codec, shape_mismatch, backend, argument, timeout };

struct Error : std::runtime_error {
  ErrorKind kind;
  Error(ErrorKind k, const std::string& what) : std::runtime_error(what), kind(k) {}
};

}  // namespace mpicomp
