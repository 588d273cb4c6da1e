// Kernels on the CPU (cuda_runtime.h's fake_cuda_run): blocks and warps one after another,
// since mpicomp's kernels share nothing between warps. A warp's lanes first run as plain
// calls; only a kernel whose lane 0 reaches a warp shuffle or vote runs its lanes as fibers
// (started with ucontext, switched with _setjmp/_longjmp, which unlike swapcontext make no
// system call), each waiting at that operation until every lane of its mask has arrived,
// which is what __shfl_*_sync and __ballot_sync need. A lane that leaves while others wait
// for it, lanes at different operations or with different masks: the kernel is wrong, and it
// stops.
#undef _FORTIFY_SOURCE  // its longjmp check refuses jumps between stacks, which fibers are
#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_runtime.h"

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

void fake_cuda_fail(const char* what, const void* p) {
  std::fprintf(stderr, "fake CUDA: %s (%p)\n", what, p);
  std::abort();  // a bug in the code under test: stop loudly
}

namespace {

constexpr size_t kStack = 256 << 10;

struct Lane {
  jmp_buf env;
  std::vector<char> stack = std::vector<char>(kStack);
  bool done = false, waiting = false;
  unsigned ops = 0;  // warp operations arrived at
  unsigned mask = 0;
};

struct Warp {
  jmp_buf scheduler;
  Lane lane[32];
  uint32_t slot[2][32];  // by operation parity: a lane's next deposit never meets a pending read
  const std::function<void()>* body = nullptr;
  unsigned first = 0, count = 0, running = 0;  // threads [first, first + count) of the block
  bool fibers = false;
};
thread_local Warp* t_warp = nullptr;

void at(Warp& w, unsigned l) {
  threadIdx.x = w.first + l;
  w.running = l;
}

[[noreturn]] void lane_main() {
  Warp& w = *t_warp;
  (*w.body)();
  w.lane[w.running].done = true;
  _longjmp(w.scheduler, 1);
}

void start(Warp& w, unsigned l) {
  Lane& L = w.lane[l];
  L.done = L.waiting = false;
  L.ops = L.mask = 0;
  ucontext_t here, lane;
  getcontext(&lane);
  lane.uc_stack.ss_sp = L.stack.data();
  lane.uc_stack.ss_size = L.stack.size();
  lane.uc_link = nullptr;
  makecontext(&lane, lane_main, 0);
  at(w, l);
  if (!_setjmp(w.scheduler)) swapcontext(&here, &lane);  // back by _longjmp at its first wait or end
}

void resume(Warp& w, unsigned l) {
  at(w, l);
  if (!_setjmp(w.scheduler)) _longjmp(w.lane[l].env, 1);
}

// Lanes run until each has finished or waits at a warp operation; then the operation is
// complete for all of them, and they run on.
void run_fibers(Warp& w) {
  for (unsigned l = 1; l < w.count; ++l) start(w, l);
  for (;;) {
    unsigned ops = ~0u, mask = 0, waiting = 0, done = 0;
    for (unsigned l = 0; l < w.count; ++l) {
      Lane& L = w.lane[l];
      if (L.done) { done |= 1u << l; continue; }
      if (ops != ~0u && (L.ops != ops || L.mask != mask)) fake_cuda_fail("lanes of a warp at different warp operations", nullptr);
      ops = L.ops, mask = L.mask, waiting |= 1u << l;
    }
    if (!waiting) return;
    if (mask & done) fake_cuda_fail("a warp operation waits for a lane that has left the kernel", nullptr);
    if (mask != waiting) fake_cuda_fail("a warp operation's mask is not the set of lanes calling it", nullptr);
    for (unsigned l = 0; l < w.count; ++l)
      if (!w.lane[l].done) w.lane[l].waiting = false, resume(w, l);
  }
}

void run_warp(Warp& w) {
  w.fibers = true;  // lane 0 on a fiber finds out whether the kernel needs them
  start(w, 0);
  if (w.lane[0].ops == 0) {  // never met a warp operation: the other lanes cannot either
    w.fibers = false;
    for (unsigned l = 1; l < w.count; ++l) at(w, l), (*w.body)();
    return;
  }
  run_fibers(w);
}

}  // namespace

const uint32_t* fake_cuda_warp_exchange(unsigned mask, uint32_t mine) {
  Warp* w = t_warp;
  if (!w || !w->fibers) fake_cuda_fail("a warp operation that lane 0 did not reach", nullptr);
  const unsigned l = w->running;
  Lane& L = w->lane[l];
  const unsigned parity = L.ops & 1;
  w->slot[parity][l] = mine;
  L.mask = mask;
  L.waiting = true;
  ++L.ops;
  if (!_setjmp(L.env)) _longjmp(w->scheduler, 1);
  at(*w, l);  // the scheduler ran other lanes meanwhile
  return w->slot[parity];
}

void fake_cuda_run(unsigned grid, unsigned block, const std::function<void()>& body) {
  thread_local Warp w;
  Warp* outer = t_warp;
  t_warp = &w;
  w.body = &body;
  gridDim.x = grid, blockDim.x = block;
  for (unsigned b = 0; b < grid; ++b) {
    blockIdx.x = b;
    for (w.first = 0; w.first < block; w.first += 32) {
      w.count = block - w.first < 32 ? block - w.first : 32;
      run_warp(w);
    }
  }
  t_warp = outer;
}
