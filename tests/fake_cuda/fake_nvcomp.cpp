// A stand-in for nvCOMP 6's batched C API (the functions mpicomp's nvcomp.cpp loads), built
// as a shared library for tests/test_fake_cuda.py. Its LZ4 writes LZ4 blocks with mpicomp's
// host encoder, so frames must match the host lz4 codec's byte for byte; its "Bitcomp" and
// "ANS" prefix the block with a tag byte, so mixing the codecs up fails. Every pointer and
// pointer array must be fake device memory and as aligned as nvCOMP asks, or it aborts.
// Batches run on the stream, as nvCOMP's do: when it is waited for.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>

namespace mpicomp {
size_t lz4_compress_block(const unsigned char* src, size_t n, unsigned char* dst, size_t cap);
bool lz4_decompress_block(const unsigned char* src, size_t n, unsigned char* dst, size_t out_n);
}  // namespace mpicomp
extern "C" bool fake_cuda_is_device(const void* p);  // from the test program (-rdynamic)
extern "C" bool fake_cuda_on_current_device(const void* p);
void fake_cuda_enqueue(std::function<void()> work);  // runs when the stream is waited for

namespace {
using Status = int;
struct Options {
  alignas(8) unsigned char bytes[64];
};
typedef struct FakeStream* Stream;

void need(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fake nvCOMP: %s\n", what);
    std::abort();
  }
}
void on_device(const void* p, const char* what) { need(p && fake_cuda_is_device(p), what); }
// When a batch is queued, as nvCOMP launches it: the arrays it is given are on the current
// device (chunks are checked when it runs, once the pointer arrays hold them).
void on_current_device(std::initializer_list<const void*> arrays) {
  for (const void* p : arrays) need(fake_cuda_on_current_device(p), "memory of a device that is not current");
}

template <char Tag, size_t Align>
struct Codec {
  static constexpr size_t tag = Tag ? 1 : 0;
  static Status max_out(size_t chunk, Options, size_t* out) {
    *out = tag + chunk + chunk / 255 + 16;
    return 0;
  }
  static Status temp(size_t, size_t, Options, size_t* t, size_t, Stream) {
    *t = 4096;
    return 0;
  }
  static Status compress(const void* const* in, const size_t* in_bytes, size_t, size_t n, void* tmp, size_t,
                         void* const* out, size_t* out_bytes, Options, Status* st, Stream) {
    on_device(in, "input pointers"), on_device(in_bytes, "input sizes"), on_device(tmp, "temp");
    on_device(out, "output pointers"), on_device(out_bytes, "output sizes"), on_device(st, "statuses");
    for (size_t i = 0; i < n; ++i) {
      on_device(in[i], "an input chunk"), on_device(out[i], "an output chunk");
      need(reinterpret_cast<uintptr_t>(in[i]) % Align == 0 && reinterpret_cast<uintptr_t>(out[i]) % Align == 0,
           "unaligned chunk");
      auto* o = static_cast<unsigned char*>(out[i]);
      if (Tag) o[0] = Tag;
      size_t cap = in_bytes[i] + in_bytes[i] / 255 + 16;
      size_t b = mpicomp::lz4_compress_block(static_cast<const unsigned char*>(in[i]), in_bytes[i], o + tag, cap);
      out_bytes[i] = tag + b;
      st[i] = b ? 0 : 19;
    }
    return 0;
  }
  static Status decompress(const void* const* in, const size_t* in_bytes, const size_t* room, size_t* out_bytes,
                           size_t n, void* tmp, size_t, void* const* out, Options, Status* st, Stream) {
    on_device(in, "input pointers"), on_device(in_bytes, "input sizes"), on_device(room, "room");
    on_device(out_bytes, "output sizes"), on_device(tmp, "temp"), on_device(out, "output pointers");
    on_device(st, "statuses");
    for (size_t i = 0; i < n; ++i) {
      on_device(in[i], "a compressed chunk"), on_device(out[i], "an output chunk");
      need(reinterpret_cast<uintptr_t>(in[i]) % Align == 0, "unaligned compressed chunk");
      auto* c = static_cast<const unsigned char*>(in[i]);
      bool ok = in_bytes[i] > tag && (!Tag || c[0] == Tag) &&
                mpicomp::lz4_decompress_block(c + tag, in_bytes[i] - tag, static_cast<unsigned char*>(out[i]), room[i]);
      out_bytes[i] = ok ? room[i] : 0;
      st[i] = ok ? 0 : 12;  // nvcompErrorCannotDecompress
    }
    return 0;
  }
};
using Lz4 = Codec<0, 4>;
using Bitcomp = Codec<'B', 8>;
using Ans = Codec<'A', 16>;
}  // namespace

#define NVCOMP_FAKE(NAME, C)                                                                                  \
  extern "C" Status nvcompBatched##NAME##CompressGetMaxOutputChunkSize(size_t a, Options o, size_t* b) {     \
    return C::max_out(a, o, b);                                                                               \
  }                                                                                                           \
  extern "C" Status nvcompBatched##NAME##CompressGetTempSize(size_t a, size_t b, Options o, size_t* t, size_t c, \
                                                            Stream s) {                                       \
    return C::temp(a, b, o, t, c, s);                                                                         \
  }                                                                                                           \
  extern "C" Status nvcompBatched##NAME##DecompressGetTempSize(size_t a, size_t b, Options o, size_t* t,       \
                                                              size_t c, Stream s) {                           \
    return C::temp(a, b, o, t, c, s);                                                                         \
  }                                                                                                           \
  extern "C" Status nvcompBatched##NAME##CompressAsync(const void* const* a, const size_t* b, size_t c, size_t d, \
                                                       void* e, size_t f, void* const* g, size_t* h, Options o,   \
                                                       Status* st, Stream s) {                                \
    on_current_device({a, b, e, g, h, st});                                                                   \
    fake_cuda_enqueue([=] { C::compress(a, b, c, d, e, f, g, h, o, st, s); });                                \
    return 0;                                                                                                 \
  }                                                                                                           \
  extern "C" Status nvcompBatched##NAME##DecompressAsync(const void* const* a, const size_t* b, const size_t* c, \
                                                         size_t* d, size_t e, void* f, size_t g, void* const* h,  \
                                                         Options o, Status* st, Stream s) {                   \
    on_current_device({a, b, c, d, f, h, st});                                                                \
    fake_cuda_enqueue([=] { C::decompress(a, b, c, d, e, f, g, h, o, st, s); });                              \
    return 0;                                                                                                 \
  }

NVCOMP_FAKE(LZ4, Lz4)
NVCOMP_FAKE(Bitcomp, Bitcomp)
NVCOMP_FAKE(ANS, Ans)

extern "C" Status nvcompGetProperties(unsigned* p) {
  p[0] = 6000;  // 6.0.0
  p[1] = 13000;
  return 0;
}
