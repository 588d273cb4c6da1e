// The stand-in runtime (cuda_runtime.h here) and the CUDA codecs of codec_cuda.h run by the
// CPU kernels on "device" memory, which is what the GPU's kernels compute bit for bit.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "../../cpp/codecs/codec.h"
#include "../../cpp/codecs/cuda/codec_cuda.h"
#include "cuda_runtime.h"

namespace {
std::mutex g_mutex;
std::map<const char*, size_t> g_device, g_pinned;

bool inside(const std::map<const char*, size_t>& m, const void* p, size_t bytes) {
  std::lock_guard<std::mutex> g(g_mutex);
  auto c = static_cast<const char*>(p);
  auto it = m.upper_bound(c);
  if (it == m.begin()) return false;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second;
}
bool device(const void* p, size_t bytes) { return inside(g_device, p, bytes ? bytes : 1); }

void fail(const char* what, const void* p) {
  std::fprintf(stderr, "fake CUDA: %s (%p)\n", what, p);
  std::abort();  // a wrong pointer kind is a bug in the code under test: stop loudly
}

cudaError_t alloc(std::map<const char*, size_t>& m, void** p, size_t bytes) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  std::memset(*p, 0xA5, bytes);  // garbage, as fresh device memory may hold
  std::lock_guard<std::mutex> g(g_mutex);
  m[static_cast<const char*>(*p)] = bytes;
  return cudaSuccess;
}
cudaError_t release(std::map<const char*, size_t>& m, void* p) {
  std::lock_guard<std::mutex> g(g_mutex);
  if (!m.erase(static_cast<const char*>(p))) return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}
}  // namespace

extern "C" bool fake_cuda_is_device(const void* p) { return device(p, 1); }

cudaError_t cudaMalloc(void** p, size_t bytes) { return alloc(g_device, p, bytes); }
cudaError_t cudaFree(void* p) { return release(g_device, p); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return alloc(g_pinned, p, bytes); }
cudaError_t cudaFreeHost(void* p) { return release(g_pinned, p); }

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  bool to_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool from_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (device(dst, bytes) != to_dev) fail(to_dev ? "copy into non-device memory" : "copy to the host into device memory", dst);
  if (device(src, bytes) != from_dev) fail(from_dev ? "copy from non-device memory" : "copy from the host out of device memory", src);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (!device(p, bytes)) fail("memset of non-device memory", p);
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t) { return "fake CUDA error"; }

namespace mpicomp::cuda {

bool available() { return true; }

void encode(Spec s, DType t, const void* x, size_t n, float* res, uint8_t* out, void*) {
  if (n && (!device(x, n * dtype_size(t)) || !device(out, encoded_bytes(s, t, n)))) fail("encode off the device", x);
  cpu_kernels().encode(s, t, x, n, res, out);
}
void decode(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y, void*) {
  if (n && (!device(in, encoded_bytes(s, t, n)) || !device(y, n * dtype_size(t)))) fail("decode off the device", in);
  cpu_kernels().decode(s, t, in, n, scale, y);
}
void decode_accumulate(Spec s, DType t, const uint8_t* in, size_t n, float* acc, void*) {
  if (n && (!device(in, encoded_bytes(s, t, n)) || !device(acc, 4 * n))) fail("accumulate off the device", in);
  cpu_kernels().decode_accumulate(s, t, in, n, acc);
}
void store(const float* acc, size_t n, float scale, DType t, void* y, void*) {
  if (n && (!device(acc, 4 * n) || !device(y, n * dtype_size(t)))) fail("store off the device", acc);
  cpu_kernels().store(acc, n, scale, t, y);
}
void copy_chunks(const ChunkCopy* list, size_t count, void*) {
  if (count && !device(list, count * sizeof(ChunkCopy))) fail("chunk list off the device", list);
  for (size_t i = 0; i < count; ++i) {
    const ChunkCopy& c = list[i];
    if (!device(c.src, c.bytes) || !device(c.dst, c.padded)) fail("chunk copy off the device", c.src);
    std::memmove(c.dst, c.src, c.bytes);
    std::memset(c.dst + c.bytes, 0, c.padded - c.bytes);
  }
}

}  // namespace mpicomp::cuda
