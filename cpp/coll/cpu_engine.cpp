#include <algorithm>

#include "../codecs/codec.h"
#include "../codecs/host_codec.h"
#include "engine.h"
#include "scratch.h"

namespace mpicomp {
namespace {

// One per thread: an iallreduce's worker thread and the caller's thread never share buffers.
struct CpuEngine final : Engine {
  Scratch f32[2];
  Scratch bytes[4];  // wire slots: an allgather stage (0, 1), the next tile's reduce-scatter (2, 3)

  size_t encode(Spec s, DType t, const void* x, size_t n, float* res, uint8_t* w) override {
    return host_encode(s, t, x, n, res, w);
  }
  void decode(Spec s, DType t, const uint8_t* w, size_t n, float scale, void* y, bool stream) override {
    host_decode(s, t, w, n, scale, y, stream);
  }
  void decode_accumulate(Spec s, DType t, const uint8_t* w, size_t n, float* acc, const float* base) override {
    host_decode_accumulate(s, t, w, n, acc, base);
  }
  void store(const float* acc, size_t n, float scale, DType t, void* y) override {
    cpu_kernels().store(acc, n, scale, t, y);
  }
  void load(DType t, const void* x, size_t n, float* res, float* acc) override {
    if (res) {
      std::copy(res, res + n, acc);
      std::fill(res, res + n, 0.f);
    } else {
      std::fill(acc, acc + n, 0.f);
    }
    cpu_kernels().decode_accumulate(Spec{}, t, static_cast<const uint8_t*>(x), n, acc, acc);
  }
  float* scratch_f32(int slot, size_t n) override { return f32[slot].get<float>(n); }
  uint8_t* wire(int slot, size_t n) override { return bytes[slot].get<uint8_t>(n); }
  bool mpi_takes_buffers() const override { return true; }
};

}  // namespace

Engine& cpu_engine() {
  thread_local CpuEngine e;
  return e;
}

}  // namespace mpicomp
