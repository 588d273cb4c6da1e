#include "deadline.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "../codecs/parallel.h"
#include "mpi_util.h"
#include "scratch.h"

namespace mpicomp {
namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_depth = 0;
thread_local bool t_timed = false;
thread_local double t_seconds = 0;
thread_local Clock::time_point t_deadline;
thread_local bool t_expired = false;  // the current call timed out

struct Registered {
  std::vector<MPI_Request>* v;
  MPI_Request* r;
  int n;
  Posted::Kind kind;
  const Posted* guard;  // whose registration it is
};
thread_local std::vector<Registered> t_posted;

// The calls of this process that timed out, and the longest timeout among them.
std::atomic<int> g_timeouts{0};
std::atomic<double> g_longest{0};
constexpr double kFinalizeGrace = 30;

// After a call of this process timed out, MPI_Finalize may wait forever for the rank that
// never came (MPICH's and Open MPI's do). From the start of MPI_Finalize, however it is called
// (mpi4py's at exit, a script's, a C program's), a process still alive after the longest
// timeout seen plus kFinalizeGrace says why and ends (exit status 1); the launcher then ends
// the job, the stalled rank with it. MPI_Finalize starts by deleting MPI_COMM_SELF's
// attributes (MPI-4.1 section 11.2.4): the hook. MPI_Finalized cannot tell a finalize that
// returned from one that waits (Open MPI's says true once it began), so a process that works
// on that long after MPI_Finalize returns is ended too: one whose calls timed out only.
int bound_finalize(MPI_Comm, int, void*, void*) {
  const int n = g_timeouts.load();
  const double within = g_longest.load() + kFinalizeGrace;
  std::thread([n, within] {
    std::this_thread::sleep_for(std::chrono::duration<double>(within));
    std::fprintf(stderr, "mpicomp: %d call%s of this process timed out (CommTimeoutError), and the process is "
                 "still in or after MPI_Finalize %g s later, which waits for the rank that never came: ending it "
                 "(exit status 1), so that the launcher ends the job\n", n, n == 1 ? "" : "s", within);
    std::fflush(stderr);
    std::_Exit(1);
  }).detach();
  return MPI_SUCCESS;
}

void note_timeout() {
  if (g_timeouts.fetch_add(1) == 0) {
    static Keyval key(bound_finalize);
    PMPI_Comm_set_attr(MPI_COMM_SELF, key.get(), nullptr);
  }
  for (double was = g_longest.load(); t_seconds > was && !g_longest.compare_exchange_weak(was, t_seconds);) {
  }
}

// Gives up on requests still active after a timeout. Receives are cancelled and completed,
// so a late rank's message can never land in memory reused later. Sends cannot be taken back
// reliably (MPI-4 deprecates cancelling them, and MPICH 5 over UCX can crash in
// ucp_request_cancel: seen in the fault tests' stalled ZeRO1 steps) and are freed, to
// complete when matched. A request found complete is only completed.
void abandon(int n, MPI_Request* r, Posted::Kind kind) {
  for (int i = 0; i < n; ++i) {
    int done = 0;
    if (r[i] != MPI_REQUEST_NULL) PMPI_Test(&r[i], &done, MPI_STATUS_IGNORE);
    if (r[i] != MPI_REQUEST_NULL && !done && kind == Posted::receives) PMPI_Cancel(&r[i]);
  }
  const auto grace = Clock::now() + std::chrono::milliseconds(kind == Posted::receives ? 100 : 0);
  for (int i = 0; i < n; ++i) {
    int done = 0;
    while (r[i] != MPI_REQUEST_NULL && !done && Clock::now() < grace) PMPI_Test(&r[i], &done, MPI_STATUS_IGNORE);
    if (r[i] != MPI_REQUEST_NULL && !done) PMPI_Request_free(&r[i]);
  }
}

[[noreturn]] void expire(const char* what) {
  for (Registered& p : t_posted)
    p.v ? abandon(int(p.v->size()), p.v->data(), p.kind) : abandon(p.n, p.r, p.kind);
  abandon_scratch();  // the abandoned requests may still use them
  t_expired = true;
  note_timeout();
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", t_seconds);
  throw Error(ErrorKind::timeout,
              std::string(what) + " still waiting after " + secs +
                  " s (config.timeout_s, MPICOMP_TIMEOUT): a rank of the communicator has not reached this call, "
                  "or has stopped in it. mpicomp will not use this communicator again: free it");
}

// Whether this node's ranks outnumber the cores they may run on (4 ranks on 2 cores). Then a
// rank spinning in MPI_Wait holds a core that the rank it waits for needs, and every step of
// a pipeline costs a scheduler time slice: such ranks poll and yield the core between polls,
// as Open MPI's ranks do when it finds a node oversubscribed (mpi_yield_when_idle). Measured
// (docs/measurements.md): 4 ranks on 2 cores, 64 MiB int8 allreduce, 250 ms spinning, 89 ms
// yielding.
bool oversubscribed() {
  static const bool over = local_ranks() > affinity_cores();
  return over;
}

// MPI's own nonblocking collectives progress only while polled, so each of their rounds
// could wait out a nap: they spin (poll's spin_for) as MPI's blocking call would, for calls
// up to some megabytes. Measured, 3 ranks on 2 cores, 1 MiB uncompressed allreduce: 1.7 ms
// blocking, 2.1-2.7 ms polled with kWaitSpin, 1.3-2.3 ms (the blocking call's noise there)
// with this.
constexpr auto kCollectiveSpin = std::chrono::milliseconds(20);

// Polls `test` until it reports progress or the deadline (if any) passes, backing off as
// deadline.h's kWaitSpin / kWaitNap / kWaitMaxNap say.
template <class Test>
void poll(const char* what, Test test, std::chrono::microseconds spin_for = kWaitSpin) {
  const bool yield = oversubscribed();
  const auto start = Clock::now();
  auto nap = std::chrono::microseconds(0);  // > 0: past spin_for, a nap after every poll
  for (unsigned spin = 0;; ++spin) {
    if (test()) return;
    if (nap.count() || spin % 64 == 63) {
      const auto now = Clock::now();
      if (t_timed && now >= t_deadline) expire(what);
      if (now - start > spin_for) {
        nap = std::min(nap + kWaitNap, kWaitMaxNap);
        std::this_thread::sleep_for(nap);
        continue;
      }
    }
    if (yield) sched_yield();
  }
}

}  // namespace

Posted::Posted(std::vector<MPI_Request>& v, Kind k) { t_posted.push_back({&v, nullptr, 0, k, this}); }
Posted::Posted(MPI_Request* r, int n, Kind k) { t_posted.push_back({nullptr, r, n, k, this}); }
Posted::~Posted() {
  for (size_t i = t_posted.size(); i-- > 0;)
    if (t_posted[i].guard == this) {
      t_posted.erase(t_posted.begin() + std::ptrdiff_t(i));
      return;
    }
}

namespace {

// The attribute that marks a communicator on which a call timed out.
int timed_out_keyval() {
  static Keyval key;
  return key.get();
}

}  // namespace

namespace {

int copy_timeout(MPI_Comm, int, void*, void* in, void* out, int* flag) {
  *static_cast<void**>(out) = new double(*static_cast<double*>(in));
  *flag = 1;
  return MPI_SUCCESS;
}
int free_timeout(MPI_Comm, int, void* value, void*) {
  delete static_cast<double*>(value);
  return MPI_SUCCESS;
}
int timeout_keyval() {
  static Keyval key(free_timeout, copy_timeout);
  return key.get();
}

}  // namespace

double timeout_of(MPI_Comm comm, double configured) {
  if (comm == MPI_COMM_NULL) return configured;
  void* value = nullptr;
  int found = 0;
  mpi_check(PMPI_Comm_get_attr(comm, timeout_keyval(), &value, &found), "MPI_Comm_get_attr");
  return found ? *static_cast<double*>(value) : configured;
}

void set_timeout(MPI_Comm comm, double seconds) {
  mpi_check(PMPI_Comm_set_attr(comm, timeout_keyval(), new double(seconds)), "MPI_Comm_set_attr");
}

bool timed_out(MPI_Comm comm) {
  void* value = nullptr;
  int found = 0;
  mpi_check(PMPI_Comm_get_attr(comm, timed_out_keyval(), &value, &found), "MPI_Comm_get_attr");
  return found != 0;
}

CallScope::CallScope(const Config& c, MPI_Comm comm) : outer_(t_depth == 0), cache_bytes_(c.cache_bytes), comm_(comm) {
  if (!outer_) {
    ++t_depth;
    return;
  }
  if (comm != MPI_COMM_NULL && timed_out(comm))
      throw Error(ErrorKind::timeout, "an earlier call on this communicator timed out (config.timeout_s, "
                                      "MPICOMP_TIMEOUT): its messages may still arrive, so mpicomp does not use it "
                                      "again; free it and use a new one");
  ++t_depth;
  t_expired = false;
  t_seconds = timeout_of(comm, c.timeout_s);
  t_timed = t_seconds > 0;
  if (t_timed) t_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(t_seconds));
}

CallScope::~CallScope() {
  --t_depth;
  if (!outer_) return;
  if (t_expired && comm_ != MPI_COMM_NULL) PMPI_Comm_set_attr(comm_, timed_out_keyval(), nullptr);
  trim_scratch(cache_bytes_);
}

void wait_all(int n, MPI_Request* r, const char* what) {
  if (n == 0) return;
  if (mpi_waits()) return mpi_check(PMPI_Waitall(n, r, MPI_STATUSES_IGNORE), what);
  poll(what, [&] {
    int done = 0;
    mpi_check(PMPI_Testall(n, r, &done, MPI_STATUSES_IGNORE), what);
    return done != 0;
  });
}

// Whether a wait can be MPI's own blocking one: no deadline to check, and a core to spin on.
bool mpi_waits() { return !t_timed && !oversubscribed(); }

void wait_collectives(mpic::Requests& rs, const char* what) {
  const int n = int(rs.size());
  poll(what, [&] {  // registered nowhere: MPI's collectives can be neither cancelled nor freed
    int done = 0;
    mpi_check(PMPI_Testall(n, rs.data(), &done, MPI_STATUSES_IGNORE), what);
    return done != 0;
  }, kCollectiveSpin);
}

void wait_one(MPI_Request* r, MPI_Status* status, const char* what) {
  if (mpi_waits()) return mpi_check(PMPI_Wait(r, status), what);
  poll(what, [&] {
    int done = 0;
    mpi_check(PMPI_Test(r, &done, status), what);
    return done != 0;
  });
}

int wait_any(int n, MPI_Request* r, const char* what) {
  int k = MPI_UNDEFINED;
  if (mpi_waits()) {
    mpi_check(PMPI_Waitany(n, r, &k, MPI_STATUS_IGNORE), what);
    return k;
  }
  poll(what, [&] {
    int done = 0;
    mpi_check(PMPI_Testany(n, r, &k, &done, MPI_STATUS_IGNORE), what);
    return done != 0;
  });
  return k;
}

int wait_some(int n, MPI_Request* r, int* idx, const char* what) {
  int count = 0;
  if (mpi_waits()) {
    mpi_check(PMPI_Waitsome(n, r, &count, idx, MPI_STATUSES_IGNORE), what);
    return count;
  }
  poll(what, [&] {
    mpi_check(PMPI_Testsome(n, r, &count, idx, MPI_STATUSES_IGNORE), what);
    return count != 0;
  });
  return count;
}

}  // namespace mpicomp
