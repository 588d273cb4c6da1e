// The GPU engine (CUDA builds only): inputs, outputs, accumulators and error-feedback
// residuals in device memory, codecs run as CUDA kernels on the caller's stream. Wire bytes:
// with a CUDA-aware MPI they stay on the device; otherwise every wire buffer is pinned host
// memory with a device mirror of the same size, and a segment is encoded into the mirror,
// copied to the host and sent while stages.cpp encodes the next one (received segments go
// the other way: copied up, then decoded). Work is ordered on one stream, so the caller's
// earlier kernels on it finish before a collective reads its input.
#include "../codecs/cuda/codec_cuda.h"
#include "../codecs/cuda/runtime.h"
#include "../codecs/host_codec.h"
#include "engine.h"

namespace mpicomp {
namespace {

using cuda::Buffer;
using cuda::check;

struct CudaEngine final : Engine {
  cudaStream_t stream = nullptr;
  bool direct = false;
  Buffer sums[2] = {Buffer(false), Buffer(false)};  // accumulators (scratch)
  // Wire slots: an allgather stage (0, 1) and the next tile's reduce-scatter (2, 3).
  Buffer host[4] = {Buffer(true), Buffer(true), Buffer(true), Buffer(true)};  // staged wire bytes
  Buffer mirror[4] = {Buffer(false), Buffer(false), Buffer(false), Buffer(false)};  // device copies (direct: the wire)
  Buffer restored{false};                             // a lossless frame's bytes, to accumulate
  // Uncompressed calls' data on the host (via_host), pinned: a copy from pageable memory runs
  // at a fraction of the bus's speed (2 ranks sharing an H100 under MPS, codec none, 1-64 MiB:
  // 0.41-0.69x MPI's allreduce staged through pinned memory, 1.05-1.57x from here).
  Buffer staged[2] = {Buffer(true), Buffer(true)};

  // The device copy of staged wire bytes at w.
  uint8_t* on_device(const uint8_t* w) {
    for (int i = 0; i < 4; ++i) {
      auto* base = static_cast<const uint8_t*>(host[i].p);
      if (base && w >= base && w < base + host[i].size) return static_cast<uint8_t*>(mirror[i].p) + (w - base);
    }
    throw Error(ErrorKind::backend, "cuda engine: wire bytes outside its staging buffers");
  }
  // The wire bytes of a received segment, on the device (a frame's own size, read from its
  // header, rather than the room made for it).
  const uint8_t* upload(Spec s, DType t, const uint8_t* w, size_t n) {
    if (direct) return w;
    uint8_t* d = on_device(w);
    size_t bytes = is_lossless(s.id) ? frame_bytes(w, n * dtype_size(t)) : encoded_bytes(s, t, n);
    check(cudaMemcpyAsync(d, w, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    return d;
  }
  // A lossless frame's bytes restored at y (device); the header is read where it is staged.
  void restore(Spec s, DType t, const uint8_t* w, size_t n, void* y) {
    cuda::frame_decode(s.id, upload(s, t, w, n), direct ? nullptr : w, n * dtype_size(t), static_cast<uint8_t*>(y),
                       stream);
  }

  size_t encode(Spec s, DType t, const void* x, size_t n, float* res, uint8_t* w) override {
    uint8_t* d = direct ? w : on_device(w);
    if (is_lossless(s.id)) return cuda::frame_encode(s.id, t, x, n * dtype_size(t), d, direct ? nullptr : w, stream);
    cuda::encode(s, t, x, n, res, d, stream);
    if (!direct)
      check(cudaMemcpyAsync(w, d, encoded_bytes(s, t, n), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // MPI sends it next
    return encoded_bytes(s, t, n);
  }
  void decode(Spec s, DType t, const uint8_t* w, size_t n, float scale, void* y, bool) override {
    if (!is_lossless(s.id)) return cuda::decode(s, t, upload(s, t, w, n), n, scale, y, stream);
    require_unscaled(scale);
    restore(s, t, w, n, y);
  }
  void decode_accumulate(Spec s, DType t, const uint8_t* w, size_t n, DType sum_t, void* acc, const void* base) override {
    if (base && base != acc && n)
      check(cudaMemcpyAsync(acc, base, n * dtype_size(sum_t), cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    if (!is_lossless(s.id)) return cuda::decode_accumulate(s, t, upload(s, t, w, n), n, sum_t, acc, stream);
    uint8_t* bytes = restored.get<uint8_t>(n * dtype_size(t), stream);
    restore(s, t, w, n, bytes);
    cuda::decode_accumulate(Spec{}, t, bytes, n, sum_t, acc, stream);
  }
  void store(DType sum_t, const void* acc, size_t n, double scale, DType t, void* y) override {
    cuda::store(sum_t, acc, n, scale, t, y, stream);
  }
  void load(DType t, const void* x, size_t n, float* res, DType sum_t, void* acc) override {
    if (res) {  // error feedback: lossy codecs, whose sums are float32
      check(cudaMemcpyAsync(acc, res, n * sizeof(float), cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
      check(cudaMemsetAsync(res, 0, n * sizeof(float), stream), "cudaMemsetAsync");
    } else {
      check(cudaMemsetAsync(acc, 0, n * dtype_size(sum_t), stream), "cudaMemsetAsync");
    }
    cuda::decode_accumulate(Spec{}, t, static_cast<const uint8_t*>(x), n, sum_t, acc, stream);
  }
  void* scratch(int slot, size_t bytes) override { return sums[slot].get<uint8_t>(bytes, stream); }
  uint8_t* wire(int slot, size_t bytes) override {
    // MPI may write into it as soon as a receive is posted, outside the stream's order: the
    // copies and kernels still queued on the stream that read it (the last segments of a
    // reduce-scatter stage, when the allgather stage takes the same slot) must be done first.
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    uint8_t* d = mirror[slot].get<uint8_t>(bytes ? bytes : 1, stream);
    return direct ? d : host[slot].get<uint8_t>(bytes ? bytes : 1, stream);
  }
  void copy(void* dst, const void* src, size_t bytes, bool to_host) override {
    check(cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  void* staging(int slot, size_t bytes) override { return staged[slot].get<uint8_t>(bytes ? bytes : 1, stream); }
  void abandon_staging() override {
    for (Buffer& b : staged) b.p = nullptr, b.size = 0;
  }
  void finish() override { check(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
};

}  // namespace

Engine& cuda_engine(void* stream, bool direct) {
  CudaEngine& e = cuda::per_device<CudaEngine>();  // a worker thread (iallreduce) has its own buffers
  e.stream = static_cast<cudaStream_t>(stream);
  e.direct = direct;
  return e;
}

}  // namespace mpicomp
