// The stand-in runtime of cuda_runtime.h: "device" and pinned memory are host memory in
// registries, with guard bytes on both sides of every allocation that are checked when it is
// freed (a kernel writing out of bounds corrupts a GPU's memory silently; here it stops).
// Work queued on a stream (kernels, copies between device and pinned memory, memsets,
// nvCOMP's batches) runs only at the next point that waits for it: cudaStreamSynchronize,
// cudaFree, a copy from or to pageable memory. That is the latest a GPU may run it, so code
// that reads a result before waiting for it reads stale bytes here, every time. Each
// allocation belongs to the device current when it was made.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "cuda_runtime.h"

namespace {
constexpr size_t kAlign = 256, kGuard = 64;  // cudaMalloc's alignment; bytes checked each side
constexpr unsigned char kGuardByte = 0xC3;
constexpr int kDevices = 2;
thread_local int t_current = 0;  // as CUDA's: per host thread, device 0 until set

struct Allocation {
  size_t bytes;
  int device;
};
std::mutex g_mutex;
std::map<const char*, Allocation> g_device, g_pinned;

// One queue for all streams: order within each stream is kept, and waiting for one stream
// runs the others' work too, which can only hide a missing wait, never invent one.
std::mutex g_queue_mutex;
std::deque<std::function<void()>> g_queue;
// Held while work runs: two threads that wait at once (one may be freeing memory, as a
// Python thread dropping a temporary array does) must not run two items of the queue side
// by side, which would break the order within a stream. Recursive: a work item may wait.
std::recursive_mutex g_run_mutex;

void flush() {
  std::lock_guard<std::recursive_mutex> running(g_run_mutex);
  for (;;) {
    std::function<void()> work;
    {
      std::lock_guard<std::mutex> g(g_queue_mutex);
      if (g_queue.empty()) return;
      work = std::move(g_queue.front());
      g_queue.pop_front();
    }
    work();
  }
}

// The device of the allocation that holds [p, p + bytes), or -1 when none does.
int owner(const std::map<const char*, Allocation>& m, const void* p, size_t bytes) {
  std::lock_guard<std::mutex> g(g_mutex);
  auto c = static_cast<const char*>(p);
  auto it = m.upper_bound(c);
  if (it == m.begin()) return -1;
  --it;
  return c >= it->first && c + bytes <= it->first + it->second.bytes ? it->second.device : -1;
}
bool inside(const std::map<const char*, Allocation>& m, const void* p, size_t bytes) { return owner(m, p, bytes) >= 0; }
bool device(const void* p, size_t bytes) { return inside(g_device, p, bytes ? bytes : 1); }

cudaError_t alloc(std::map<const char*, Allocation>& m, void** p, size_t bytes) {
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(kAlign, kAlign + (bytes + kGuard + kAlign - 1) / kAlign * kAlign));
  std::memset(base + kAlign - kGuard, kGuardByte, kGuard);
  std::memset(base + kAlign, 0xA5, bytes);  // garbage, as fresh device memory may hold
  std::memset(base + kAlign + bytes, kGuardByte, kGuard);
  *p = base + kAlign;
  std::lock_guard<std::mutex> g(g_mutex);
  m[static_cast<const char*>(*p)] = Allocation{bytes, t_current};
  return cudaSuccess;
}
cudaError_t release(std::map<const char*, Allocation>& m, void* p) {
  flush();  // as cudaFree: queued work may still use the memory
  size_t bytes;
  {
    std::lock_guard<std::mutex> g(g_mutex);
    auto it = m.find(static_cast<const char*>(p));
    if (it == m.end()) return cudaErrorInvalidValue;
    bytes = it->second.bytes;
    m.erase(it);
  }
  auto* c = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < kGuard; ++i)
    if (c[-1 - ptrdiff_t(i)] != kGuardByte || c[bytes + i] != kGuardByte) fake_cuda_fail("write out of an allocation's bounds", p);
  std::free(c - kAlign);
  return cudaSuccess;
}
}  // namespace

extern "C" bool fake_cuda_is_device(const void* p) { return device(p, 1); }
extern "C" bool fake_cuda_on_current_device(const void* p) { return owner(g_device, p, 1) == t_current; }

void fake_cuda_enqueue(std::function<void()> work) {
  std::lock_guard<std::mutex> g(g_queue_mutex);
  g_queue.push_back(std::move(work));
}

cudaError_t cudaGetDeviceCount(int* count) { return *count = kDevices, cudaSuccess; }
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return cudaErrorInvalidValue;
  t_current = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) { return *device = t_current, cudaSuccess; }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  const int dev = owner(g_device, p, 1), pinned = owner(g_pinned, p, 1);
  a->type = dev >= 0 ? cudaMemoryTypeDevice : pinned >= 0 ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
  a->device = dev >= 0 ? dev : pinned >= 0 ? pinned : -2;  // -2: as CUDA 11+ reports plain host memory
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) { return alloc(g_device, p, bytes); }
cudaError_t cudaFree(void* p) { return release(g_device, p); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return alloc(g_pinned, p, bytes); }
cudaError_t cudaFreeHost(void* p) { return release(g_pinned, p); }

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  bool to_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool from_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (device(dst, bytes) != to_dev) fake_cuda_fail(to_dev ? "copy into non-device memory" : "copy to the host into device memory", dst);
  if (device(src, bytes) != from_dev) fake_cuda_fail(from_dev ? "copy from non-device memory" : "copy from the host out of device memory", src);
  const void* host = to_dev ? (from_dev ? nullptr : src) : dst;
  if (host && !inside(g_pinned, host, bytes ? bytes : 1)) {  // pageable: CUDA waits for the stream, copies, returns
    flush();
    std::memmove(dst, src, bytes);
  } else {
    fake_cuda_enqueue([=] { std::memmove(dst, src, bytes); });
  }
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (!device(p, bytes)) fake_cuda_fail("memset of non-device memory", p);
  fake_cuda_enqueue([=] { std::memset(p, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  flush();
  return cudaSuccess;
}
cudaError_t cudaGetLastError() { return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t) { return "fake CUDA error"; }
