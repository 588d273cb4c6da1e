#include "scratch.h"

#include <algorithm>
#include <vector>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace mpicomp {
namespace {

// This thread's buffers. Made by the first Scratch's constructor, so it outlives them all.
std::vector<Scratch*>& registry() {
  thread_local std::vector<Scratch*> all;
  return all;
}

}  // namespace

Scratch::Scratch() { registry().push_back(this); }

Scratch::~Scratch() {
  auto& all = registry();
  all.erase(std::remove(all.begin(), all.end(), this), all.end());
}

char* Scratch::bytes(size_t n) {
  if (n > size_) {
    p_.reset();  // the old buffer goes first: growing never holds both
    p_.reset(new char[n]);  // untouched pages cost nothing until used
    size_ = n;
  }
  return p_.get();
}

void Scratch::release() {
  p_.reset();
  size_ = 0;
}

void Scratch::abandon() {
  (void)p_.release();  // deliberately leaked
  size_ = 0;
}

void abandon_scratch() {
  for (Scratch* s : registry()) s->abandon();
}

size_t scratch_held() {
  size_t sum = 0;
  for (const Scratch* s : registry()) sum += s->held();
  return sum;
}

void trim_scratch(size_t cap) {
  size_t held = scratch_held();
  if (held <= cap) return;
  std::vector<Scratch*> by_size = registry();
  std::sort(by_size.begin(), by_size.end(), [](const Scratch* a, const Scratch* b) { return a->held() > b->held(); });
  for (Scratch* s : by_size) {
    if (held <= cap) break;
    held -= s->held();
    s->release();
  }
#if defined(__GLIBC__)
  // Blocks under glibc's mmap threshold (which rises to 32 MiB as large blocks are freed) go
  // back to the heap, not to the system: give the heap's free pages back too.
  malloc_trim(0);
#endif
}

}  // namespace mpicomp
