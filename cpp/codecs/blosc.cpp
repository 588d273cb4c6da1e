#include "blosc.h"

#include <blosc2.h>

#include "format.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace mpicomp {
namespace {

void init_once() {
  static std::once_flag once;
  std::call_once(once, [] { blosc2_init(); });
}

unsigned compressor_of(uint32_t o) { return o & 0xf; }
unsigned filter_of(uint32_t o) { return (o >> 4) & 0xf; }
unsigned level_of(uint32_t o) { return (o >> 8) & 0xf; }

struct ContextFree {
  void operator()(blosc2_context* c) const { blosc2_free_ctx(c); }
};
using Context = std::unique_ptr<blosc2_context, ContextFree>;

Context new_compressor(uint32_t options, size_t typesize) {
  init_once();
  blosc2_cparams p = BLOSC2_CPARAMS_DEFAULTS;
  p.compcode = uint8_t(compressor_of(options));
  p.clevel = uint8_t(level_of(options));
  p.typesize = int32_t(typesize);
  p.nthreads = 1;
  for (auto& f : p.filters) f = BLOSC_NOFILTER;
  p.filters[BLOSC2_MAX_FILTERS - 1] = uint8_t(filter_of(options));
  return Context(blosc2_create_cctx(p));
}

// A compression context per thread and settings for whole 64 KiB chunks: Blosc2's contexts
// hold its buffers, and one thread's calls run one at a time. A context keeps the block
// size it chose for its first chunk (C-Blosc2 3.3.5: after a 26-byte chunk every later one
// came out larger than its input), so a frame's shorter last chunk gets a context of its
// own. One thread each (nthreads 1): a 64 KiB chunk is too small to share, and mpicomp's
// calls already run on threads of their own.
blosc2_context* compressor(uint32_t options, size_t typesize) {
  thread_local std::map<std::pair<uint32_t, size_t>, Context> made;
  auto& c = made[{options, typesize}];
  if (!c) c = new_compressor(options, typesize);
  return c.get();
}

blosc2_context* decompressor() {
  thread_local Context c;
  if (!c) {
    init_once();
    blosc2_dparams p = BLOSC2_DPARAMS_DEFAULTS;
    p.nthreads = 1;
    c.reset(blosc2_create_dctx(p));
  }
  return c.get();
}

}  // namespace

bool blosc_options_valid(uint32_t o) {
  return (o >> 12) == 0 && compressor_of(o) <= BLOSC_ZSTD && compressor_of(o) != 3 && filter_of(o) <= BLOSC_BITSHUFFLE &&
         level_of(o) <= 9;
}

size_t blosc_compress_chunk(uint32_t options, size_t typesize, const uint8_t* src, size_t n, uint8_t* dst, size_t cap) {
  // Always room for the worst case: a destination too small for it makes Blosc2 fail, and a
  // context that failed so once stores every later chunk as it is (seen with 4.14.1's C-Blosc2
  // 3.3.5 after a 26-byte chunk).
  thread_local std::vector<uint8_t> room;
  room.resize(n + BLOSC2_MAX_OVERHEAD);
  Context once = n == kChunkBytes ? nullptr : new_compressor(options, typesize);
  int r = blosc2_compress_ctx(once ? once.get() : compressor(options, typesize), src, int32_t(n), room.data(),
                              int32_t(room.size()));
  if (r <= 0 || size_t(r) >= cap) return 0;
  std::memcpy(dst, room.data(), size_t(r));
  return size_t(r);
}

bool blosc_decompress_chunk(const uint8_t* src, size_t n, uint8_t* dst, size_t out_n) {
  int32_t nbytes = 0, cbytes = 0, blocksize = 0;
  if (n < BLOSC_MIN_HEADER_LENGTH || blosc2_cbuffer_sizes(src, &nbytes, &cbytes, &blocksize) < 0 ||
      size_t(nbytes) != out_n || size_t(cbytes) != n)
    return false;
  return blosc2_decompress_ctx(decompressor(), src, int32_t(n), dst, int32_t(out_n)) == int32_t(out_n);
}

}  // namespace mpicomp
