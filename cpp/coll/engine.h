// Where a collective's buffers live and where its codecs run: the host (CPU kernels) or a
// GPU (CUDA kernels, cuda_engine.cpp). The algorithms in stages.cpp only see this interface.
// Wire buffers (what MPI sends and receives) are always host memory unless the engine says
// the MPI can take its device pointers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "../codecs/format.h"

namespace mpicomp {

struct Engine {
  virtual ~Engine() = default;
  // Encode n elements of x (dtype t, engine memory) into wire; see host_encode (host_codec.h),
  // whose byte count it returns. The bytes are in place (ready to send) when it returns.
  virtual size_t encode(Spec s, DType t, const void* x, size_t n, float* residual, uint8_t* wire) = 0;
  // stream: y is large and written once; the host engine writes float32 around the cache
  // (host_decode). Same values either way.
  virtual void decode(Spec s, DType t, const uint8_t* wire, size_t n, float scale, void* y, bool stream = false) = 0;
  // Accumulators (acc, base) are of dtype `sum_t`: float32, or float64 for float64 that the wire
  // carries exactly (format.h: acc_dtype).
  // acc = base + the decoded elements (base null: acc += them).
  virtual void decode_accumulate(Spec s, DType t, const uint8_t* wire, size_t n, DType sum_t, void* acc,
                                 const void* base = nullptr) = 0;
  // y = acc * scale, stored as dtype t.
  virtual void store(DType sum_t, const void* acc, size_t n, double scale, DType t, void* y) = 0;
  // acc = x (converted to sum_t) + residual (float32, if any); the residual is then zeroed.
  virtual void load(DType t, const void* x, size_t n, float* residual, DType sum_t, void* acc) = 0;
  // Scratch for accumulators in engine memory, valid until the next call of the same slot.
  virtual void* scratch(int slot, size_t bytes) = 0;
  // Host (or, for CUDA-aware MPI, device) memory for wire bytes, which MPI may write from the
  // moment this returns: no earlier work of the engine still reads it.
  virtual uint8_t* wire(int slot, size_t bytes) = 0;
  // Host memory that a whole buffer of engine memory is staged through (slot 0: input, 1:
  // output) for the host's path, kept between calls; null: the caller's own scratch.
  virtual void* staging(int /*slot*/, size_t /*bytes*/) { return nullptr; }
  // After a failed call MPI may still write into the staging memory: let it go, unfreed.
  virtual void abandon_staging() {}
  // Copies bytes from engine memory to host memory (to_host) or back; done when it returns.
  virtual void copy(void* dst, const void* src, size_t bytes, bool to_host) { std::memcpy(dst, src, bytes); }
  // The collective is over: results are in place when this returns.
  virtual void finish() {}
  // Whether the MPI library may send from and receive into this engine's buffers as they are
  // (host memory): exact stages (codec none) then skip the copy into a wire buffer, which
  // would hold the same bytes.
  virtual bool mpi_takes_buffers() const { return false; }
};

Engine& cpu_engine();
// CUDA builds only (cuda_engine.cpp): this thread's GPU engine, running on `stream` (a
// cudaStream_t) of the current device. `direct`: the MPI library takes device pointers
// (CUDA-aware), so wire bytes stay on the GPU; otherwise they are staged through pinned host
// memory, one segment at a time, while the next segment encodes.
Engine& cuda_engine(void* stream, bool direct);
// Whether the MPI library says it takes CUDA device pointers (MPICH's MPIX_GPU_query_support,
// Open MPI's MPIX_Query_cuda_support); false when it cannot say.
bool mpi_cuda_aware();

}  // namespace mpicomp
