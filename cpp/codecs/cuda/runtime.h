// What the CUDA files share: CUDA errors as backend Errors, and buffers that grow on demand.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "../../core/errors.h"

namespace mpicomp::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(ErrorKind::backend, std::string(what) + ": " + cudaGetErrorString(e));
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
