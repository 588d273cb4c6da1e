// Lossless frames (format.h) on the GPU with nvCOMP's batched C API: every chunk of a frame
// is one item of a batch, so one call compresses them all in parallel. nvCOMP is loaded at
// run time (dlopen), so a build needs none and a process without it simply lacks these
// codecs. The declarations are those of nvCOMP 6's headers (nvcomp.h, nvcomp/lz4.h,
// bitcomp.h, ans.h); their option structs travel by value, so the major version is checked.
#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "codec_cuda.h"
#include "runtime.h"

namespace mpicomp::cuda {
namespace {

using Status = int;  // nvcompStatus_t: 0 is success
// Every option struct of the three codecs is 64 bytes; fields not set here stay zero, which
// nvCOMP's headers ask of the reserved ones.
struct Options {
  alignas(8) unsigned char bytes[64] = {};
  void set_int(size_t offset, int v) { std::memcpy(bytes + offset, &v, sizeof v); }
};
struct Properties {
  uint32_t version, cudart_version;  // version: major * 1000 + minor * 100 + patch
};
using GetProperties = Status (*)(Properties*);
using MaxOutputChunk = Status (*)(size_t chunk, Options, size_t* max_out);
using TempSize = Status (*)(size_t chunks, size_t chunk, Options, size_t* temp, size_t total, cudaStream_t);
using Compress = Status (*)(const void* const* in, const size_t* in_bytes, size_t chunk, size_t chunks, void* temp,
                            size_t temp_bytes, void* const* out, size_t* out_bytes, Options, Status*, cudaStream_t);
using Decompress = Status (*)(const void* const* in, const size_t* in_bytes, const size_t* out_room,
                              size_t* out_bytes, size_t chunks, void* temp, size_t temp_bytes, void* const* out,
                              Options, Status*, cudaStream_t);
// nvcompType_t values
constexpr int kChar = 0, kUchar = 1, kUshort = 3, kUint = 5, kUlonglong = 7, kFloat16 = 10, kFloat32 = 11,
              kBits = 0xff;

struct Api {
  MaxOutputChunk max_out;
  TempSize compress_temp;
  Compress compress;
  TempSize decompress_temp;
  Decompress decompress;
};
Api g_api[3];  // lz4, bitcomp, ans
bool g_loaded = false;
std::mutex g_load;

const char* nv_name(CodecId c) { return c == CodecId::lz4 ? "LZ4" : c == CodecId::bitcomp ? "Bitcomp" : "ANS"; }

// g_api's entry of an nvCOMP codec; the host's Blosc2 has none.
int api_index(CodecId c) {
  if (c == CodecId::lz4) return 0;
  if (c == CodecId::bitcomp) return 1;
  if (c == CodecId::ans) return 2;
  throw Error(ErrorKind::backend, std::string("codec ") + codec_name(c) + " runs on host memory only, not on GPU buffers");
}

const Api& api(CodecId c) {
  if (!g_loaded)
    throw Error(ErrorKind::backend, "nvCOMP is not loaded: pip install 'mpicomp[cuda]' (nvidia-nvcomp-cu13)");
  return g_api[api_index(c)];
}

void nv(Status s, CodecId c, const char* what) {
  if (s != 0)
    throw Error(ErrorKind::backend, std::string("nvCOMP ") + nv_name(c) + " " + what + " failed (status " +
                                        std::to_string(s) + ")");
}

// The element type, in each codec's terms: Bitcomp and ANS model the data's words.
Options compress_options(CodecId c, DType t) {
  Options o;
  const size_t w = dtype_size(t);
  if (c == CodecId::bitcomp)  // {int algorithm; nvcompType_t data_type; double delta; mode}
    o.set_int(4, w == 2 ? kUshort : w == 4 ? kUint : w == 8 ? kUlonglong : kUchar);
  else if (c == CodecId::ans)  // {nvcompANSType_t type; nvcompType_t data_type; ...}
    o.set_int(4, w == 2 && is_float(t) ? kFloat16 : t == DType::f32 ? kFloat32 : kChar);
  return o;  // lz4 {data_type CHAR, no bitshuffle}: LZ4 blocks as the lz4 library writes them
}
Options decompress_options(CodecId c) {
  Options o;
  if (c == CodecId::ans) o.set_int(4, kBits);  // {backend; data_type}: BITS reads it from the stream
  return o;
}

// Per thread (a worker thread, iallreduce's, has its own) and per device.
struct Scratch {
  Buffer table{true}, table_dev{false};  // pointer / size arrays and chunk copies, and their device copy
  Buffer header{true}, back{true};       // a frame's header; what nvCOMP reports back
  Buffer slots{false}, temp{false}, aligned{false};
};

size_t chunk_len(size_t raw, size_t i) { return std::min(kChunkBytes, raw - i * kChunkBytes); }

void to_device(void* dst, const void* src, size_t bytes, cudaStream_t st) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
}
void to_host(void* dst, const void* src, size_t bytes, cudaStream_t st) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st), "cudaMemcpyAsync");
}

}  // namespace

std::string nvcomp_load(const std::string& path) {
  std::lock_guard<std::mutex> g(g_load);
  if (g_loaded) return "";
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return dlerror();
  auto sym = [h](const std::string& s) {
    void* p = dlsym(h, s.c_str());
    if (!p) throw std::runtime_error("no symbol " + s);
    return p;
  };
  try {
    Properties p{};
    if (reinterpret_cast<GetProperties>(sym("nvcompGetProperties"))(&p) != 0 || p.version / 1000 != 6)
      throw std::runtime_error("nvCOMP " + std::to_string(p.version / 1000) + ".x; mpicomp speaks nvCOMP 6");
    for (CodecId c : {CodecId::lz4, CodecId::bitcomp, CodecId::ans}) {
      const std::string n = std::string("nvcompBatched") + nv_name(c);
      g_api[api_index(c)] = {
          reinterpret_cast<MaxOutputChunk>(sym(n + "CompressGetMaxOutputChunkSize")),
          reinterpret_cast<TempSize>(sym(n + "CompressGetTempSize")), reinterpret_cast<Compress>(sym(n + "CompressAsync")),
          reinterpret_cast<TempSize>(sym(n + "DecompressGetTempSize")),
          reinterpret_cast<Decompress>(sym(n + "DecompressAsync"))};
    }
  } catch (const std::runtime_error& e) {
    dlclose(h);
    return e.what();
  }
  g_loaded = true;
  return "";
}

bool nvcomp_loaded() {
  std::lock_guard<std::mutex> g(g_load);
  return g_loaded;
}

size_t frame_encode(CodecId c, DType t, const void* x, size_t raw, uint8_t* out, uint8_t* host_copy, void* stream) {
  const Api& a = api(c);
  const size_t m = frame_chunks(raw);
  if (!m) return 0;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  Scratch& s = cuda::per_device<Scratch>();
  auto in = static_cast<const uint8_t*>(x);
  if (reinterpret_cast<uintptr_t>(in) % kFrameAlign) {  // nvCOMP's inputs must be aligned
    uint8_t* copy = s.aligned.get<uint8_t>(raw, st);
    check(cudaMemcpyAsync(copy, in, raw, cudaMemcpyDeviceToDevice, st), "cudaMemcpyAsync");
    in = copy;
  }
  const Options o = compress_options(c, t);
  size_t max_out = 0, temp = 0;
  nv(a.max_out(kChunkBytes, o, &max_out), c, "CompressGetMaxOutputChunkSize");
  nv(a.compress_temp(m, kChunkBytes, o, &temp, raw, st), c, "CompressGetTempSize");
  max_out = frame_align(max_out);
  uint8_t* slots = s.slots.get<uint8_t>(m * max_out, st);

  // Arrays of m: input pointers, input sizes, output pointers, then (device only) output
  // sizes and statuses; the chunk copies that pack the frame follow them.
  const size_t arrays = 5 * m * 8, bytes = arrays + m * sizeof(ChunkCopy);
  auto* h = s.table.get<uint64_t>(bytes, st);
  auto* d = s.table_dev.get<uint64_t>(bytes, st);
  for (size_t i = 0; i < m; ++i) {
    h[i] = reinterpret_cast<uintptr_t>(in + i * kChunkBytes);
    h[m + i] = chunk_len(raw, i);
    h[2 * m + i] = reinterpret_cast<uintptr_t>(slots + i * max_out);
  }
  to_device(d, h, 3 * m * 8, st);
  void* tmp = temp ? s.temp.get<void>(temp, st) : nullptr;
  nv(a.compress(reinterpret_cast<const void* const*>(d), reinterpret_cast<const size_t*>(d + m), kChunkBytes, m, tmp,
                temp, reinterpret_cast<void* const*>(d + 2 * m), reinterpret_cast<size_t*>(d + 3 * m), o,
                reinterpret_cast<Status*>(d + 4 * m), st),
     c, "CompressAsync");
  auto* back = s.back.get<uint64_t>(2 * m * 8, st);
  to_host(back, d + 3 * m, 2 * m * 8, st);
  check(cudaStreamSynchronize(st), "cudaStreamSynchronize");

  const Status* status = reinterpret_cast<const Status*>(back + m);
  const size_t hb = frame_header_bytes(m);
  auto* header = s.header.get<uint8_t>(hb, st);
  std::memset(header, 0, hb);
  auto* copies = reinterpret_cast<ChunkCopy*>(reinterpret_cast<uint8_t*>(h) + arrays);
  size_t pos = hb;
  for (size_t i = 0; i < m; ++i) {
    if (status[i] != 0) nv(status[i], c, "compression of a chunk");
    const size_t len = chunk_len(raw, i);
    const bool as_is = back[i] >= len;  // compressing did not help: the chunk is stored as it is
    const size_t stored = as_is ? len : back[i];
    const uint32_t word = uint32_t(stored) | (as_is ? kRawChunk : 0u);
    std::memcpy(header + 4 * i, &word, 4);
    copies[i] = {as_is ? in + i * kChunkBytes : slots + i * max_out, out + pos, uint32_t(stored),
                 uint32_t(frame_align(stored))};
    pos += frame_align(stored);
  }
  to_device(out, header, hb, st);
  to_device(reinterpret_cast<uint8_t*>(d) + arrays, copies, m * sizeof(ChunkCopy), st);
  copy_chunks(reinterpret_cast<const ChunkCopy*>(reinterpret_cast<uint8_t*>(d) + arrays), m, st);
  if (host_copy) to_host(host_copy, out, pos, st);
  check(cudaStreamSynchronize(st), "cudaStreamSynchronize");  // the pinned table is reused next call
  return pos;
}

void frame_decode(CodecId c, const uint8_t* in, const uint8_t* header, size_t raw, uint8_t* y, void* stream) {
  const Api& a = api(c);
  const size_t m = frame_chunks(raw), hb = frame_header_bytes(m), cap = frame_bound(raw);
  if (!m) return;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  Scratch& s = cuda::per_device<Scratch>();
  if (!header) {
    uint8_t* hh = s.header.get<uint8_t>(hb, st);
    to_host(hh, in, hb, st);
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    header = hh;
  }
  uint8_t* dst = reinterpret_cast<uintptr_t>(y) % kFrameAlign ? s.aligned.get<uint8_t>(raw, st) : y;

  // Compressed chunks go to nvCOMP as arrays of k: input pointers, input sizes, room,
  // pointers out, sizes out, statuses; chunks stored as they are are copied.
  const size_t arrays = 6 * m * 8, bytes = arrays + m * sizeof(ChunkCopy);
  auto* h = s.table.get<uint64_t>(bytes, st);
  auto* d = s.table_dev.get<uint64_t>(bytes, st);
  auto* copies = reinterpret_cast<ChunkCopy*>(reinterpret_cast<uint8_t*>(h) + arrays);
  size_t k = 0, ncopies = 0, pos = hb;
  for (size_t i = 0; i < m; ++i) {
    uint32_t word;
    std::memcpy(&word, header + 4 * i, 4);
    const size_t len = chunk_len(raw, i), stored = word & ~kRawChunk;
    const bool as_is = word & kRawChunk;
    if (!(as_is ? stored == len : stored < len) || stored > cap - pos)
      throw Error(ErrorKind::codec, "corrupt lossless frame: chunk " + std::to_string(i) + " of " + std::to_string(m) +
                                        " claims " + std::to_string(stored) + " bytes");
    if (as_is) {
      copies[ncopies++] = {in + pos, dst + i * kChunkBytes, uint32_t(len), uint32_t(len)};
    } else {
      h[k] = reinterpret_cast<uintptr_t>(in + pos);
      h[m + k] = stored;
      h[2 * m + k] = len;
      h[4 * m + k] = reinterpret_cast<uintptr_t>(dst + i * kChunkBytes);
      ++k;
    }
    pos += frame_align(stored);
  }
  to_device(d, h, bytes, st);
  copy_chunks(reinterpret_cast<const ChunkCopy*>(reinterpret_cast<uint8_t*>(d) + arrays), ncopies, st);
  uint64_t* back = nullptr;
  if (k) {
    const Options o = decompress_options(c);
    size_t temp = 0;
    nv(a.decompress_temp(k, kChunkBytes, o, &temp, raw, st), c, "DecompressGetTempSize");
    void* tmp = temp ? s.temp.get<void>(temp, st) : nullptr;
    nv(a.decompress(reinterpret_cast<const void* const*>(d), reinterpret_cast<const size_t*>(d + m),
                    reinterpret_cast<const size_t*>(d + 2 * m), reinterpret_cast<size_t*>(d + 3 * m), k, tmp, temp,
                    reinterpret_cast<void* const*>(d + 4 * m), o, reinterpret_cast<Status*>(d + 5 * m), st),
       c, "DecompressAsync");
    back = s.back.get<uint64_t>(3 * m * 8, st);
    to_host(back, d + 3 * m, 3 * m * 8, st);  // sizes out, (pointers), statuses
  }
  if (dst != y) check(cudaMemcpyAsync(y, dst, raw, cudaMemcpyDeviceToDevice, st), "cudaMemcpyAsync");
  check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  const Status* status = back ? reinterpret_cast<const Status*>(back + 2 * m) : nullptr;
  for (size_t j = 0; j < k; ++j)
    if (status[j] != 0 || back[j] != h[2 * m + j])
      throw Error(ErrorKind::codec, std::string("corrupt lossless frame: nvCOMP ") + nv_name(c) +
                                        " could not restore a chunk (status " + std::to_string(status[j]) + ")");
}

}  // namespace mpicomp::cuda
