#include "async.h"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "../codecs/errors.h"

namespace mpicomp::pmpi {
namespace {

struct Job {
  MPI_Comm comm;
  const void* x;
  void* y;
  CollArgs args;
  MPI_Request req;
  std::shared_ptr<void> keep;
  int error = MPI_SUCCESS;
};

std::mutex g_mutex;
std::condition_variable g_cv;
std::deque<Job*> g_queue;
std::thread g_worker;
bool g_stop = false;

int query(void* state, MPI_Status* status) {
  PMPI_Status_set_elements(status, MPI_BYTE, 0);
  PMPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
  status->MPI_ERROR = static_cast<Job*>(state)->error;
  return static_cast<Job*>(state)->error;
}
int release(void* state) {
  delete static_cast<Job*>(state);
  return MPI_SUCCESS;
}
int cancel(void*, int) { return MPI_SUCCESS; }  // a started collective cannot be cancelled

void work() {
  for (;;) {
    Job* job;
    {
      std::unique_lock<std::mutex> lock(g_mutex);
      g_cv.wait(lock, [] { return g_stop || !g_queue.empty(); });
      if (g_queue.empty()) return;
      job = g_queue.front();
      g_queue.pop_front();
    }
    try {
      allreduce(job->comm, job->x, job->y, job->args);
    } catch (const Error& e) {
      std::fprintf(stderr, "mpicomp (LD_PRELOAD): MPI_Iallreduce: %s\n", e.what());
      job->error = MPI_ERR_OTHER;
    }
    PMPI_Grequest_complete(job->req);
  }
}

}  // namespace

void start_async(MPI_Comm comm, const void* x, void* y, const CollArgs& a, MPI_Request* req,
                 std::shared_ptr<void> keep) {
  Job* job = new Job{comm, x, y, a, MPI_REQUEST_NULL, std::move(keep)};
  int rc = PMPI_Grequest_start(query, release, cancel, job, req);
  if (rc != MPI_SUCCESS) {
    delete job;
    throw Error(ErrorKind::backend, "MPI_Grequest_start failed");
  }
  job->req = *req;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_worker.joinable()) g_worker = std::thread(work);
  g_queue.push_back(job);
  g_cv.notify_one();
}

void stop_async() {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_stop = true;
    g_cv.notify_one();
  }
  if (g_worker.joinable()) g_worker.join();
}

}  // namespace mpicomp::pmpi
