// The parts every collective call (collectives.cpp) is made of: what it agrees to send
// (signature), how it is counted (Recorder), the uncompressed paths that ride the agreement
// or go through host memory, and its cut into segments. Internal to the core.
#pragma once
#include <chrono>
#include <functional>
#include <optional>

#include "algorithms.h"
#include "coll.h"
#include "config.h"
#include "mpi_util.h"
#include "stats.h"

namespace mpicomp::call {

Engine& engine_of(const CollArgs& a);

extern thread_local bool t_inner;  // inside via_host or in_pieces: the outer call is the one counted
extern thread_local bool t_probe;  // codec "auto" measuring (adaptive.h): compressed as asked, not counted
// The last call counted on this thread (Recorder): what codec "auto" judges it by. A small call
// takes microseconds: timed and sized once.
struct Counted {
  double seconds = 0;
  size_t bytes_in = 0;
};
extern thread_local Counted t_counted;

// Sets one of those flags for its lifetime, whether the calls inside return or throw.
// (Nested: an allreduce in pieces, each of which may go via_host.)
class Inside {
 public:
  explicit Inside(bool& flag) : flag_(flag), was_(flag) { flag_ = true; }
  ~Inside() { flag_ = was_; }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;

 private:
  bool& flag_;
  bool was_;
};

// What travels: the codec asked for, except where a policy says compression cannot pay
// (below min_bytes, nobody to talk to, skip_local on one node, codec "auto"'s measurements);
// `skip` says which.
Signature signature(Coll coll, const CollArgs& a, const CommInfo& ci, const Config& cfg, MPI_Comm comm,
                    std::optional<Skip>& skip);

// Counts one call in the statistics when it returns (not when it fails), under the algorithm
// the call set.
class Recorder {
 public:
  // A call inside another (t_inner) leaves the bytes it sends to the outer one's count.
  Recorder(Coll coll, const CommInfo& ci, size_t bytes_in, const std::optional<Skip>& skip)
      : coll_(coll), size_(ci.size), bytes_in_(bytes_in), skip_(skip), t0_(std::chrono::steady_clock::now()) {
    if (!t_inner) take_sent_bytes();
  }
  ~Recorder();
  Algo algo = Algo::mpi;

 private:
  Coll coll_;
  int size_;
  size_t bytes_in_;
  const std::optional<Skip>& skip_;  // the call's, which may still change its mind (bounded)
  std::chrono::steady_clock::time_point t0_;
};

// The mean from the sum, for results the MPI library (or the eager exchange) summed.
void divide(void* y, DType t, size_t n, int size);

// Whether an uncompressed collective travels inside the agreement: when it fits
// eager_bytes (`small`) or when two ranks make that MPI's own exchange (`pair`); eager_bytes
// 0 turns it off.
bool rides_agreement(const Signature& sig, const Config& cfg, bool small, bool pair);

// Codec bound needs the largest finite input over the ranks (budget.h), which rides the
// agreement: this rank's, in top, and where to agree it; null where it is not needed.
double* largest_input(const CollArgs& a, const Signature& sig, const void* x, size_t n, double& top);

// x, or a copy of it where an uncompressed reduction that rides the agreement writes its
// result over it: codec bound may have to run the call again, compressed (budget.h). Not
// for an absolute bound on 2 ranks: the sum's one rounding is within any bound the codec
// accepts (a relative one may still find the result smaller than it estimated).
const void* kept(const CollArgs& a, int size, const void* x, const void* y, size_t bytes);

// Uncompressed data that MPI moves itself (as the agreement's payload, or in MPI's own
// collective) is in host memory on every rank: a rank with GPU buffers copies them there and
// takes the host's path, so that ranks with GPU and with host buffers meet in the same
// messages, and a small GPU collective costs two copies rather than a pipeline of launches.
// The engine's staging memory (pinned, for a GPU) is kept for calls within cache_bytes;
// larger ones take the thread's scratch, freed after the call as all scratch beyond it is.
void via_host(Coll coll, MPI_Comm comm, const void* x, size_t x_bytes, void* y, size_t y_bytes, const CollArgs& a,
              const Config& cfg);

// Sums n elements of x (dtype t) over all ranks inside the agreement (sig.eager), and stores
// elements [first, first + len) of the sum (the mean with avg) into y as t; kind is sum or
// halve (handshake.h: eager_collective; most: agreed with it). The sum goes straight into y
// when y takes all of it and t is summed as itself (no 16-bit widening).
void eager_sum(MPI_Comm comm, const Signature& sig, Engine& e, Payload::Kind kind, DType t, const void* x, size_t n,
               size_t first, size_t len, bool avg, int size, void* y, double* most);

// The cut of a call's buffers; `blocks`: the output holds that many times count elements.
// Where any rank's buffers are on a GPU (agreed), the segments are gpu_segment_bytes long on
// every rank: each costs the GPU engine kernel launches and a stream synchronisation.
Tiling tiling(const Signature& sig, const CollArgs& a, const Config& cfg, int blocks = 1);

// The error feedback a call keeps: none for exact calls and for codec bound, whose error
// is bounded in every call (its residual stays zero).
float* residual_of(const Tiling& T, const CollArgs& a);

// Runs once(T, x), T the call's tiling: as it is, or for codec bound with the share of the
// bound each of the `encodings` a value goes through may take (budget.h; top: the largest
// input over ranks); x has nx elements, y ny. A reduction codec bound sends uncompressed
// (below min_bytes, codec auto's choice) keeps MPI's sums only where they keep the bound,
// and else runs as codec bound (`skip` then cleared: counted as compressed); done: its sums
// rode the agreement, y holds them and x is intact. Returns the codec that ran last.
CodecId bounded(MPI_Comm comm, const CommInfo& ci, const Signature& sig, const Config& cfg, const CollArgs& a,
                double top, const void* x, size_t nx, void* y, size_t ny, double scale, int encodings, bool reduction,
                bool done, std::optional<Skip>& skip, const std::function<void(const Tiling&, const void*)>& once);

}  // namespace mpicomp::call
