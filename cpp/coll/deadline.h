// The core's waits for MPI requests, under the optional timeout Config::timeout_s. Without
// one they are MPI's own (MPI_Waitall, ...). With one they poll, and a call that is still
// waiting when its time is up gives up what it has posted (Posted) and raises
// ErrorKind::timeout: a rank that never reaches a collective makes the others fail instead of
// hanging forever. The time is counted from the start of the top-level call (CallScope).
#pragma once
#include <mpi.h>

#include <chrono>
#include <vector>

#include "config.h"
#include "mpi_count.h"

namespace mpicomp {

// How every wait for another rank backs off, the core's and the Python layer's
// (mpicomp/_waits.py reads these): a wait that has not completed within kWaitSpin sleeps
// between polls, kWaitNap longer each time up to kWaitMaxNap. A rank waiting for one that is
// late, or gone, does not hold a core for the whole timeout (30 minutes by default in
// Python), while a wait that completes within kWaitSpin costs no sleep, and the socket
// buffers of a TCP link hold far more than kWaitMaxNap of its traffic. A short spin leaves
// the core to the compute a non-blocking call overlaps (DDP's backward pass: docs/torch.md);
// 0.1 ms and 2 ms gave the same shared-memory latencies, within a 2-core machine's noise.
// Measured: a rank waiting 2 s uses 0.22 s of CPU.
constexpr std::chrono::microseconds kWaitSpin{100}, kWaitNap{10}, kWaitMaxNap{250};

// Set up by every top-level call (a collective, send, recv, reject) for its duration: its
// deadline (Config::timeout_s, or the communicator's own: set_timeout), and on return the
// bound on the scratch memory its thread keeps (scratch.h).
// Calls made inside one (via_host's) keep the outer deadline. A collective's communicator
// (`comm`) on which a call timed out is marked: messages of that call may still arrive and
// would match the next call's, so every later call on it raises at once.
class CallScope {
 public:
  explicit CallScope(const Config& c, MPI_Comm comm = MPI_COMM_NULL);
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;

 private:
  bool outer_;
  size_t cache_bytes_;
  MPI_Comm comm_;
};

// Requests a call has posted and may not have completed when a wait expires: all of them
// are abandoned then, not only the ones waited for, so that no late message can land in a
// buffer after the call has given it up. Registered for the guard's lifetime; guards may end
// in any order (an allreduce's stages in flight together). Every request a wait may expire
// on is registered, with its kind: receives are cancelled, sends only freed (deadline.cpp).
class Posted {
 public:
  enum Kind { receives, sends };
  Posted(std::vector<MPI_Request>& v, Kind k);
  Posted(MPI_Request* r, int n, Kind k);
  ~Posted();
  Posted(const Posted&) = delete;
  Posted& operator=(const Posted&) = delete;
};

// Calls on comm (and on communicators duplicated from it afterwards) wait at most `seconds`
// (0: no limit) whatever Config::timeout_s says: a torch process group's timeout, an
// optimizer's. Local.
void set_timeout(MPI_Comm comm, double seconds);
// comm's own timeout if set_timeout gave it one, else `configured`.
double timeout_of(MPI_Comm comm, double configured);

// Whether a call on comm timed out. Such a communicator is never freed (by mpicomp, its
// owner): MPI may reuse a freed communicator's context for a new one, and the timed-out call's
// messages, still on their way, would then match that one's.
bool timed_out(MPI_Comm comm);

// Runs call(rs), one of MPI's own collectives (mpi_count.h): blocking (rs null), as fast as
// MPI has it, unless the current call has a deadline or the node's ranks outnumber its cores
// (mpi_waits); then started nonblocking and polled, yielding the core to the rank waited for
// (3 ranks on 2 cores, tests/fake_cuda's engine check: 68 s spinning in MPI's blocking
// calls, 2.7 s polled). A collective's requests can be neither cancelled nor freed (MPI): on
// a timeout they are left as they are, and their buffers may still be written, so the
// caller's must outlive the failed call (the Python layer keeps them: mpicomp/collectives.py).
bool mpi_waits();
void wait_collectives(mpic::Requests& rs, const char* what);
template <class Call>
void mpi_collective(const char* what, Call call) {
  if (mpi_waits()) return call(nullptr);
  mpic::Requests rs;
  call(&rs);
  wait_collectives(rs, what);
}

// MPI_Allreduce of one value v of MPI type t, through mpi_collective. Its buffers are on the
// heap, and left there if the call times out: MPI may still write the result.
template <class T>
T allreduce_one(MPI_Comm comm, T v, MPI_Datatype t, MPI_Op op) {
  T* b = new T[2]{v, T()};
  mpi_collective("MPI_Allreduce", [&](mpic::Requests* rs) { mpic::allreduce(b, b + 1, 1, t, op, comm, rs); });
  const T r = b[1];
  delete[] b;
  return r;
}

void wait_all(int n, MPI_Request* r, const char* what);
void wait_one(MPI_Request* r, MPI_Status* status, const char* what);
// The index of the request that completed.
int wait_any(int n, MPI_Request* r, const char* what);
// How many completed (their indices in idx), or MPI_UNDEFINED when none was active.
int wait_some(int n, MPI_Request* r, int* idx, const char* what);

}  // namespace mpicomp
