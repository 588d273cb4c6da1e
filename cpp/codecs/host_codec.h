// Layer 1, host memory: one entry point per operation for every codec, lossy (the SIMD
// kernels of codec.h) or lossless (the frames of lossless.h), so that callers need not know
// which kind of codec they hold.
#pragma once
#include <cstddef>
#include <cstdint>

#include "format.h"

namespace mpicomp {

// Encodes n elements of x into out (room for encoded_bytes(s, t, n)); returns the bytes
// written: encoded_bytes exactly for lossy codecs, the frame's size for lossless ones.
// residual: see CpuKernels::encode (lossless codecs drop nothing and take none; bound keeps
// its bound in every call and leaves it as it is).
size_t host_encode(Spec s, DType t, const void* x, size_t n, float* residual, uint8_t* out);
// Decodes n elements into y, times scale (1 for lossless codecs, which restore the bytes).
// A frame never makes the decoder read past encoded_bytes(s, t, n) or write past y's n
// elements: a corrupt one raises a codec Error. stream: float32 output of a lossy codec is
// written with streaming stores, around the cache (the same values; for outputs too large
// to stay in cache, whose lines would otherwise be read before they are written).
void host_decode(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y, bool stream = false);
// acc = base + the decoded elements (acc and base of dtype `sum_t`, float32 or, for float64 that
// the codec carries exactly, float64: acc_dtype; base null: acc += them).
void host_decode_accumulate(Spec s, DType t, const uint8_t* in, size_t n, DType sum_t, void* acc,
                            const void* base = nullptr);
// y = acc (dtype sum_t) * scale, stored as dtype t.
void host_store(DType sum_t, const void* acc, size_t n, double scale, DType t, void* y);
// A lossless codec restores the bytes it was given: a decode that would also scale them (an
// average) raises an argument Error, on the host and on the GPU alike.
void require_unscaled(float scale);

}  // namespace mpicomp
