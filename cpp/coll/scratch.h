// Host memory a thread reuses from call to call (wire segments, float32 accumulators, staged
// copies of GPU data), and the bound on what it keeps between calls. Reuse is what makes a
// training loop's repeated calls allocation-free; without a bound, one 256 MiB int8 allreduce
// left 451 MiB held by the calling thread for the life of the process. When a top-level call
// returns (CallScope, deadline.h), the thread's buffers beyond Config::cache_bytes are freed,
// largest first.
#pragma once
#include <cstddef>
#include <memory>

namespace mpicomp {

class Scratch {
 public:
  Scratch();
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  // At least n elements of T; the contents are not kept when it grows.
  template <class T = char>
  T* get(size_t n) {
    return reinterpret_cast<T*>(bytes(n * sizeof(T)));
  }
  size_t held() const { return size_; }
  void release();
  // Gives the buffer up without freeing it: MPI may still read or write it (deadline.h).
  void abandon();

 private:
  char* bytes(size_t n);
  std::unique_ptr<char[]> p_;
  size_t size_ = 0;
};

// Frees this thread's scratch buffers, largest first, until at most `cap` bytes are held.
void trim_scratch(size_t cap);
// Bytes of scratch this thread holds.
size_t scratch_held();
// After a timed-out call: this thread's buffers are left to requests MPI may still complete
// and never freed (one call's worth per timeout); later calls allocate new ones.
void abandon_scratch();

}  // namespace mpicomp
