// Layer 1 on the GPU: the same codecs, bytes and arithmetic as codec.h (both run the
// functions of format.h), on device memory and a caller's CUDA stream (passed as void* so
// that code without CUDA headers can include this). Asynchronous: results are ready when the
// stream is. Compiled only with CUDA (MPICOMP_WITH_CUDA).
#pragma once
#include <string>

#include "../format.h"

namespace mpicomp::cuda {

// True when a CUDA device is usable (false, not an error, on a machine without a GPU).
bool available();

void encode(Spec s, DType t, const void* x, size_t n, float* residual, uint8_t* out, void* stream);
void decode(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y, void* stream);
// acc (dtype sum_t: float32, or float64 for float64 elements as they are, codec none) += the
// decoded elements.
void decode_accumulate(Spec s, DType t, const uint8_t* in, size_t n, DType sum_t, void* acc, void* stream);
// y = acc (dtype sum_t) * scale, stored as dtype t (host_store on the GPU).
void store(DType sum_t, const void* acc, size_t n, double scale, DType t, void* y, void* stream);

// Lossless frames (format.h) through nvCOMP (nvcomp.cpp), loaded at run time from `path`
// (the pip package nvidia-libnvcomp-cu13 installs it). Returns "" once loaded, else why not.
std::string nvcomp_load(const std::string& path);
bool nvcomp_loaded();
// Compresses `raw` bytes at x (device) into a frame at out (device); with host_copy, the
// frame is copied there too. Returns the frame's size; the stream is drained.
size_t frame_encode(CodecId c, DType t, const void* x, size_t raw, uint8_t* out, uint8_t* host_copy, void* stream);
// Restores a frame at in (device) to `raw` bytes at y (device). header: the frame's first
// frame_header_bytes in host memory if the caller has them (staged bytes), else null (they
// are read back). Codec errors on a corrupt frame; the stream is drained.
void frame_decode(CodecId c, const uint8_t* in, const uint8_t* header, size_t raw, uint8_t* y, void* stream);

// Copies of byte ranges, one thread block each, zero-filling dst from `bytes` to `padded`.
struct ChunkCopy {
  const uint8_t* src;
  uint8_t* dst;
  uint32_t bytes, padded;
};
void copy_chunks(const ChunkCopy* list, size_t count, void* stream);  // list in device memory

}  // namespace mpicomp::cuda
