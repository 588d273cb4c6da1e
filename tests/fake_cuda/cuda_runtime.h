// A stand-in for the CUDA runtime, for testing the GPU engine on machines without a GPU
// (tests/test_fake_cuda.py): "device" memory is host memory kept in a registry, so every copy
// and kernel launch can check that its pointers are of the kind they must be, and work queued
// on a stream runs at once. Kernels (kernels.cu, compiled as C++) run on the CPU with a warp's
// lanes as fibers (fake_device.cpp), so warp shuffles and votes behave as on a GPU. Two
// devices, a current one per thread as CUDA keeps it: a kernel given memory of the device
// that is not current stops, as one without peer access faults. Only what mpicomp's CUDA
// sources use.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

typedef int cudaError_t;
constexpr cudaError_t cudaSuccess = 0, cudaErrorInvalidValue = 1;
typedef struct FakeStream* cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };

enum cudaMemoryType { cudaMemoryTypeUnregistered, cudaMemoryTypeHost, cudaMemoryTypeDevice, cudaMemoryTypeManaged };
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
};
#define cudaStreamLegacy reinterpret_cast<cudaStream_t>(1)
#define cudaStreamPerThread reinterpret_cast<cudaStream_t>(2)

extern "C" {  // as CUDA's: tests/fake_cuda/python_check.py calls them through ctypes
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p);
cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t e);

// The test's view of the registry: whether p lies in memory cudaMalloc returned, and whether
// on the calling thread's current device.
bool fake_cuda_is_device(const void* p);
bool fake_cuda_on_current_device(const void* p);
}

// ---- device code ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
// As aligned as CUDA's: a misaligned vector load is a fault on a GPU, and here a report of
// -fsanitize=alignment, which the kernels are built with.
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// What every lane of `mask` put in, once all of them have (the calling lane's fiber waits).
const uint32_t* fake_cuda_warp_exchange(unsigned mask, uint32_t mine);

template <class T>
uint32_t fake_cuda_bits(T v) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
template <class T>
T fake_cuda_shuffle(unsigned mask, T v, unsigned src) {
  const uint32_t* all = fake_cuda_warp_exchange(mask, fake_cuda_bits(v));
  T r;
  std::memcpy(&r, &all[src < 32 ? src : threadIdx.x % 32], 4);  // past the warp's end: its own value
  return r;
}
template <class T>
T __shfl_sync(unsigned mask, T v, int src) { return fake_cuda_shuffle(mask, v, unsigned(src) % 32); }
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lanes) { return fake_cuda_shuffle(mask, v, (threadIdx.x % 32) ^ unsigned(lanes)); }
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta) { return fake_cuda_shuffle(mask, v, threadIdx.x % 32 + delta); }
inline unsigned __ballot_sync(unsigned mask, int pred) {
  const uint32_t* all = fake_cuda_warp_exchange(mask, pred != 0);
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) bits |= (mask >> l & 1u) && all[l] ? 1u << l : 0u;
  return bits;
}

// Queues work on the stream (fake_runtime.cpp runs it when something waits for it).
void fake_cuda_enqueue(std::function<void()> work);
// Runs body once per thread of a grid x block launch (fake_device.cpp).
void fake_cuda_run(unsigned grid, unsigned block, const std::function<void()>& body);
void fake_cuda_fail(const char* what, const void* p);
// kernels.cu's launch(): every pointer among the kernel's arguments must be device memory
// (or null); the kernel runs when the stream is waited for.
template <class... A>
void fake_cuda_launch(unsigned grid, unsigned block, cudaStream_t, std::function<void()> body, const A&... args) {
  auto pointer = [](const auto& a) {
    if constexpr (std::is_pointer_v<std::decay_t<decltype(a)>>) {
      if (a && !fake_cuda_is_device(a)) fake_cuda_fail("kernel argument off the device", a);
      if (a && !fake_cuda_on_current_device(a)) fake_cuda_fail("kernel argument on a device not current", a);
    }
  };
  (pointer(args), ...);
  fake_cuda_enqueue([grid, block, body = std::move(body)] { fake_cuda_run(grid, block, body); });
}
