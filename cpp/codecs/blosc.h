// Layer 1, host memory: one lossless chunk through the C-Blosc2 library (typed shuffle or
// bitshuffle, then a compressor: blosclz, lz4, lz4hc, zlib or zstd), linked statically from
// the blosc2 wheel. Codec "blosc" frames are lossless.h's frames with Blosc2 chunks inside.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mpicomp {

// Codec blosc's options, packed into Spec::block (they travel in the agreement with it):
// Blosc2's compressor code (BLOSC_BLOSCLZ 0 ... BLOSC_ZSTD 5), its filter (BLOSC_NOSHUFFLE
// 0, BLOSC_SHUFFLE 1, BLOSC_BITSHUFFLE 2) and the level, 0-9.
constexpr uint32_t blosc_options(unsigned compressor, unsigned filter, unsigned level) {
  return compressor | filter << 4 | level << 8;
}
// Whether packed options name a compressor, filter and level this build knows.
bool blosc_options_valid(uint32_t options);

// The chunk of n bytes at src (elements of `typesize` bytes) compressed into dst if that
// takes fewer than cap bytes; its size, or 0 when it does not fit.
size_t blosc_compress_chunk(uint32_t options, size_t typesize, const uint8_t* src, size_t n, uint8_t* dst, size_t cap);
// Decompresses the n-byte chunk at src, which must restore exactly out_n bytes (Blosc2 checks
// its header against both sizes); false if it is damaged.
bool blosc_decompress_chunk(const uint8_t* src, size_t n, uint8_t* dst, size_t out_n);

}  // namespace mpicomp
