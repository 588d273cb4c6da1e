#include "parallel.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace mpicomp {
namespace {

int default_threads() { return std::max(1, affinity_cores() / local_ranks()); }

std::atomic<int> g_setting{0};

// Workers that wait for a job of `parts` ranges and take ranges until none is left. One job
// at a time (`busy`): a call that finds the pool taken runs alone rather than queueing.
class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  bool try_run(size_t parts, const std::function<void(size_t)>& part) {
    std::unique_lock<std::mutex> owner(busy_, std::try_to_lock);
    if (!owner.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> g(m_);
      while (workers_.size() + 1 < parts) workers_.emplace_back([this] { serve(); });
      job_ = &part, parts_ = parts, next_ = 0, done_ = 0, ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> g(m_);
    finished_.wait(g, [&] { return done_ == parts_; });
    job_ = nullptr;
    return true;
  }

 private:
  // Takes ranges of the current job until none is left.
  void work() {
    for (;;) {
      size_t i;
      const std::function<void(size_t)>* job;
      {
        std::lock_guard<std::mutex> g(m_);
        if (!job_ || next_ >= parts_) return;
        i = next_++;
        job = job_;
      }
      (*job)(i);
      std::lock_guard<std::mutex> g(m_);
      if (++done_ == parts_) finished_.notify_one();
    }
  }
  void serve() {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> g(m_);
        wake_.wait(g, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
      }
      work();
    }
  }

  std::mutex busy_, m_;
  std::condition_variable wake_, finished_;
  std::vector<std::thread> workers_;
  const std::function<void(size_t)>* job_ = nullptr;
  size_t parts_ = 0, next_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: workers may outlive static destruction order
  return *p;
}

}  // namespace

int affinity_cores() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof(set), &set) == 0 ? std::max(1, CPU_COUNT(&set)) : 1;
}

int local_ranks() {
  int local = 1;
  for (const char* var : {"MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    if (const char* v = std::getenv(var)) local = std::max(1, std::atoi(v));
  return local;
}

void set_codec_threads(int n) { g_setting.store(std::max(0, n), std::memory_order_relaxed); }

int codec_threads() {
  static const int fallback = default_threads();
  int n = g_setting.load(std::memory_order_relaxed);
  return n > 0 ? n : fallback;
}

void parallel_ranges(size_t units, size_t min_units, const std::function<void(size_t, size_t)>& f) {
  const size_t parts = std::min<size_t>(codec_threads(), units / std::max<size_t>(min_units, 1));
  if (parts <= 1) return f(0, units);
  auto range = [&](size_t i) { f(units * i / parts, units * (i + 1) / parts); };
  if (!pool().try_run(parts, range)) f(0, units);
}

}  // namespace mpicomp
