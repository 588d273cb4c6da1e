// Layer 1, host memory: the lossless frames of format.h (lz4, and blosc's Blosc2 chunks:
// blosc.h; nvCOMP's codecs run on GPUs), and the LZ4 block format they hold, which the
// stand-in nvCOMP of the tests shares.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "format.h"

namespace mpicomp {

// The frame of `raw` bytes of x in out (room for frame_bound(raw)); returns its size.
// typesize: the bytes of one element (Blosc2's shuffles regroup them by byte position).
size_t host_frame_encode(Spec s, size_t typesize, const uint8_t* x, size_t raw, uint8_t* out);
// The same for bytes made a chunk at a time (codec bound's codes): chunk(i, len) returns
// the len bytes of chunk i, which stay valid until the thread's next call. Chunks are made
// on several threads at once.
using ChunkSource = std::function<const uint8_t*(size_t i, size_t len)>;
size_t host_frame_encode(Spec s, size_t typesize, size_t raw, uint8_t* out, const ChunkSource& chunk);
// Restores the `raw` bytes of the frame at in; a corrupt frame raises a codec Error.
void host_frame_decode(Spec s, const uint8_t* in, size_t raw, uint8_t* y);
// The same a chunk at a time: sink(i, bytes, len) takes chunk i's restored bytes, which
// stay valid until it returns; it runs on several threads at once. A corrupt frame raises a
// codec Error (after the chunks that did decode were given to sink).
using ChunkSink = std::function<void(size_t i, const uint8_t* bytes, size_t len)>;
void host_frame_decode(Spec s, const uint8_t* in, size_t raw, const ChunkSink& sink);

// One LZ4 block (the lz4 library's block format) of src, if it is shorter than `cap` bytes;
// returns its size, or 0 when it does not fit.
size_t lz4_compress_block(const uint8_t* src, size_t n, uint8_t* dst, size_t cap);
// Decodes one LZ4 block of `n` bytes that must restore exactly `out_n` bytes; false if it
// is malformed.
bool lz4_decompress_block(const uint8_t* src, size_t n, uint8_t* dst, size_t out_n);

}  // namespace mpicomp
