// What the CUDA files share: CUDA errors as backend Errors, the current device, and buffers
// that grow on demand.
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <string>

#include "../errors.h"

namespace mpicomp::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(ErrorKind::backend, std::string(what) + ": " + cudaGetErrorString(e));
}

// Makes `device` current for a scope, then the caller's again: the caller's thread must not
// find itself on another GPU after a call (its next allocation or launch would go there).
class DeviceScope {
 public:
  explicit DeviceScope(int device) : device_(device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (device_ != previous_) check(cudaSetDevice(device_), "cudaSetDevice");
  }
  ~DeviceScope() {
    if (device_ != previous_) cudaSetDevice(previous_);  // a destructor cannot report an error
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int device_, previous_ = 0;
};

// This thread's T for the current device: memory allocated on one GPU serves only that GPU's
// calls (another GPU's kernels cannot reach it without peer access).
template <class T>
T& per_device() {
  thread_local std::map<int, T> by_device;
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return by_device[device];
}

// Device or pinned host memory that grows, never shrinks, and is reused between calls.
// Before memory that queued work may still use is freed, the stream is drained.
struct Buffer {
  bool host;  // pinned host memory, else device memory
  void* p = nullptr;
  size_t size = 0;
  explicit Buffer(bool h) : host(h) {}
  ~Buffer() {
    if (p) host ? cudaFreeHost(p) : cudaFree(p);  // at thread exit: errors cannot be reported
  }
  template <class T>
  T* get(size_t bytes, cudaStream_t s) {
    if (bytes > size) {
      if (p) {
        check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
        check(host ? cudaFreeHost(p) : cudaFree(p), "cudaFree");
        p = nullptr, size = 0;
      }
      check(host ? cudaMallocHost(&p, bytes) : cudaMalloc(&p, bytes), host ? "cudaMallocHost" : "cudaMalloc");
      size = bytes;
    }
    return static_cast<T*>(p);
  }
};

}  // namespace mpicomp::cuda
