// Layer 1, host memory: the lossless frames of format.h, and one entry point per operation
// for every codec (the SIMD kernels for the lossy ones), so that callers need not know which
// kind of codec they hold.
#pragma once
#include <cstddef>
#include <cstdint>

#include "format.h"

namespace mpicomp {

// Encodes n elements of x into out (room for encoded_bytes(s, t, n)); returns the bytes
// written: encoded_bytes exactly for lossy codecs, the frame's size for lossless ones.
// residual: see CpuKernels::encode (lossless codecs drop nothing and take none).
size_t host_encode(Spec s, DType t, const void* x, size_t n, float* residual, uint8_t* out);
// Decodes n elements into y, times scale (1 for lossless codecs, which restore the bytes).
// A frame never makes the decoder read past encoded_bytes(s, t, n) or write past y's n
// elements: a corrupt one raises a codec Error.
void host_decode(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y);
void host_decode_accumulate(Spec s, DType t, const uint8_t* in, size_t n, float* acc);
// A lossless codec restores the bytes it was given: a decode that would also scale them (an
// average) raises an argument Error, on the host and on the GPU alike.
void require_unscaled(float scale);

// One LZ4 block (the lz4 library's block format) of src, if it is shorter than `cap` bytes;
// returns its size, or 0 when it does not fit.
size_t lz4_compress_block(const uint8_t* src, size_t n, uint8_t* dst, size_t cap);
// Decodes one LZ4 block of `n` bytes that must restore exactly `out_n` bytes; false if it
// is malformed.
bool lz4_decompress_block(const uint8_t* src, size_t n, uint8_t* dst, size_t out_n);

}  // namespace mpicomp
