// Layer 1: codecs on host memory. Pure compute, no MPI, no state: error feedback is a buffer
// the caller owns and passes in. Each function runs the SIMD target chosen at start-up
// (cpu_dispatch.cpp); all targets produce identical bytes and values.
#pragma once
#include <string>
#include <vector>

#include "format.h"

namespace mpicomp {

// The kernels of one SIMD target. Every pointer is host memory; n counts elements.
struct CpuKernels {
  const char* target;
  // Encodes x (n elements of dtype t) into out (encoded_bytes(s, t, n) bytes). With a
  // residual (float32[n], may be null), encodes x + residual instead and stores what the
  // codec dropped back into residual; a poisoned (non-finite) block leaves a zero residual.
  void (*encode)(Spec s, DType t, const void* x, size_t n, float* residual, uint8_t* out);
  // Decodes into y (dtype t), multiplying by `scale` (1 or 1/size for an average).
  void (*decode)(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y);
  // acc[i] = base[i] + decoded element i (base == acc: acc[i] += it). `t` is the dtype the
  // sender encoded from (codec none only).
  void (*decode_accumulate)(Spec s, DType t, const uint8_t* in, size_t n, const float* base, float* acc);
  // y[i] = acc[i] * scale, stored as dtype t (a float dtype).
  void (*store)(const float* acc, size_t n, float scale, DType t, void* y);
};

// The target in use and switching between the ones this CPU supports (for tests / benchmarks).
const CpuKernels& cpu_kernels();
std::vector<std::string> cpu_targets();  // supported here, best first
bool set_cpu_target(const std::string& name);

}  // namespace mpicomp
