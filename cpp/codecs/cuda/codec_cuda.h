// Layer 1 on the GPU: the same codecs, bytes and arithmetic as codec.h (both run the
// functions of format.h), on device memory and a caller's CUDA stream (passed as void* so
// that code without CUDA headers can include this). Asynchronous: results are ready when the
// stream is. Compiled only with CUDA (MPICOMP_WITH_CUDA).
#pragma once
#include "../format.h"

namespace mpicomp::cuda {

// True when a CUDA device is usable (false, not an error, on a machine without a GPU).
bool available();

void encode(Spec s, DType t, const void* x, size_t n, float* residual, uint8_t* out, void* stream);
void decode(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y, void* stream);
void decode_accumulate(Spec s, DType t, const uint8_t* in, size_t n, float* acc, void* stream);
// y = acc * scale, stored as dtype t (CpuKernels::store on the GPU).
void store(const float* acc, size_t n, float scale, DType t, void* y, void* stream);

}  // namespace mpicomp::cuda
