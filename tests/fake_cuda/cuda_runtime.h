// A stand-in for the CUDA runtime, for testing the GPU engine's host-side logic on machines
// without a GPU (tests/test_fake_cuda.py): "device" memory is host memory kept in a
// registry, so every copy can check that its pointers are of the kind its direction says,
// and work queued on a stream runs at once. Only what mpicomp's CUDA sources call.
#pragma once
#include <cstddef>

typedef int cudaError_t;
constexpr cudaError_t cudaSuccess = 0, cudaErrorInvalidValue = 1;
typedef struct FakeStream* cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };

cudaError_t cudaMalloc(void** p, size_t bytes);
cudaError_t cudaFree(void* p);
cudaError_t cudaMallocHost(void** p, size_t bytes);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaGetLastError();
const char* cudaGetErrorString(cudaError_t e);

// The test's view of the registry: whether p lies in memory cudaMalloc returned.
extern "C" bool fake_cuda_is_device(const void* p);
