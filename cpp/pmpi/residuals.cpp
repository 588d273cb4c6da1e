#include "residuals.h"

#include <list>
#include <map>
#include <mutex>
#include <tuple>

namespace mpicomp::pmpi {
namespace {

using Key = std::tuple<MPI_Comm, const void*, MPI_Count>;

// Most recently used first. Threads of an MPI_THREAD_MULTIPLE program call at once, each on
// its own communicator: everything is under one lock, held only for the lookup.
struct Store {
  std::mutex m;
  std::list<std::pair<Key, Residual>> lru;
  std::map<Key, std::list<std::pair<Key, Residual>>::iterator> index;
  size_t bytes = 0;

  void drop(std::list<std::pair<Key, Residual>>::iterator it) {
    bytes -= it->second->size() * sizeof(float);
    index.erase(it->first);
    lru.erase(it);
  }
};

Store& store() {
  static Store s;
  return s;
}

}  // namespace

Residual residual_for(MPI_Comm comm, const void* buffer, MPI_Count count, size_t n, size_t limit_bytes) {
  Store& s = store();
  std::lock_guard<std::mutex> g(s.m);
  Key key{comm, buffer, count};
  auto found = s.index.find(key);
  if (found != s.index.end()) {
    s.lru.splice(s.lru.begin(), s.lru, found->second);
    Residual& r = s.lru.front().second;
    if (r->size() == n) return r;
    s.drop(s.lru.begin());
  }
  while (!s.lru.empty() && s.bytes + n * sizeof(float) > limit_bytes) s.drop(std::prev(s.lru.end()));
  s.lru.emplace_front(key, std::make_shared<std::vector<float>>(n, 0.f));
  s.index[key] = s.lru.begin();
  s.bytes += n * sizeof(float);
  return s.lru.front().second;
}

void forget_residuals(MPI_Comm comm) {
  Store& s = store();
  std::lock_guard<std::mutex> g(s.m);
  for (auto it = s.lru.begin(); it != s.lru.end();) {
    auto next = std::next(it);
    if (std::get<0>(it->first) == comm) s.drop(it);
    it = next;
  }
}

void clear_residuals() {
  Store& s = store();
  std::lock_guard<std::mutex> g(s.m);
  s.lru.clear();
  s.index.clear();
  s.bytes = 0;
}

size_t residual_bytes() {
  Store& s = store();
  std::lock_guard<std::mutex> g(s.m);
  return s.bytes;
}

}  // namespace mpicomp::pmpi
