#include <algorithm>

#include "../codecs/codec.h"
#include "../codecs/host_codec.h"
#include "engine.h"
#include "scratch.h"

namespace mpicomp {
namespace {

// One per thread: an iallreduce's worker thread and the caller's thread never share buffers.
struct CpuEngine final : Engine {
  Scratch sums[2];  // accumulators (scratch)
  Scratch bytes[4];  // wire slots: an allgather stage (0, 1), the next tile's reduce-scatter (2, 3)

  size_t encode(Spec s, DType t, const void* x, size_t n, float* res, uint8_t* w) override {
    return host_encode(s, t, x, n, res, w);
  }
  void decode(Spec s, DType t, const uint8_t* w, size_t n, float scale, void* y, bool stream) override {
    host_decode(s, t, w, n, scale, y, stream);
  }
  void decode_accumulate(Spec s, DType t, const uint8_t* w, size_t n, DType sum_t, void* acc, const void* base) override {
    host_decode_accumulate(s, t, w, n, sum_t, acc, base);
  }
  void store(DType sum_t, const void* acc, size_t n, double scale, DType t, void* y) override {
    host_store(sum_t, acc, n, scale, t, y);
  }
  void load(DType t, const void* x, size_t n, float* res, DType sum_t, void* acc) override {
    if (res) {  // error feedback: lossy codecs, whose accumulators are float32
      std::copy(res, res + n, static_cast<float*>(acc));
      std::fill(res, res + n, 0.f);
    } else if (n) {
      std::memset(acc, 0, n * dtype_size(sum_t));
    }
    host_decode_accumulate(Spec{}, t, static_cast<const uint8_t*>(x), n, sum_t, acc, acc);
  }
  void* scratch(int slot, size_t bytes) override { return sums[slot].get(bytes); }
  uint8_t* wire(int slot, size_t n) override { return bytes[slot].get<uint8_t>(n); }
  bool mpi_takes_buffers() const override { return true; }
};

}  // namespace

Engine& cpu_engine() {
  thread_local CpuEngine e;
  return e;
}

}  // namespace mpicomp
