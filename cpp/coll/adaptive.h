// Layer 2: codec "auto" (CollArgs::adaptive). Compression pays on slow links and costs on
// fast ones, by a margin that depends on the size: so each call is compressed or not by its
// size, from times measured on its own communicator. On the first "auto" call of a
// communicator for a (collective, dtype, codec), after that call, every rank times the
// collective itself both ways (uncompressed, and with the codec) at sizes from 1 KiB up, on
// the caller's own data tiled to size, and on nodes both hierarchies where they are different
// paths (AutoModel); the slowest rank's times are agreed, so all ranks hold
// the same model and take the same decisions without talking. Timing the real call rather
// than the link and the codec apart measures everything a model would have to guess (the
// pipeline's overlap, the eager path, two levels on nodes, cache effects).
//
// Every few calls (kMinCheckCalls at least, and enough of the model's time that the check's
// own exchange costs about 0.5% of it) the ranks compare the calls' times with the model's.
// When even the fastest call of every rank ran kDrift times slower (or every call faster)
// than predicted (of the calls predicted to take kDriftFloor or more), and
// Config::auto_reprobe_s has passed since the last probe, they measure again (another job on
// the card, congestion).
// Otherwise the calls' own times replace the model's at their sizes, each way they went: a
// probe's short bursts miss what a stream of calls meets (a token bucket's credit, caches),
// and a decision that a sustained stream shows wrong is corrected at the next check (each
// class's median time, the slowest rank's, as a probe's). A size class whose calls all took
// one path is sent every path in turn for a window now and then, to time the others again. A rank
// that waits for a late peer sees a slow call, but the late rank does not: drift is judged by
// the rank that waited least, and skew between ranks alone does not re-probe.
#pragma once
#include <mpi.h>

#include <array>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "coll.h"
#include "stats.h"

namespace mpicomp {

// A collective's time both ways at increasing sizes (bytes_in as stats_record counts them:
// allreduce input, reduce_scatter all parts, allgather this rank's part), on the hierarchy
// Config::hierarchy sets and, where the communicator's layout has two levels and the flat
// hierarchy is another path, on that one too: each way takes the faster (on 2 nodes of 2 at
// 1 Gbit/s, MPI's flat allreduce took 0.6x the two-level one's time at 32 KiB, and flat int8
// 0.66x two-level int8's at 16 MiB over 10 Gbit/s: docs/measurements.md).
struct AutoModel {
  std::vector<double> bytes, plain, packed;  // seconds uncompressed and compressed at each size
  std::vector<double> plain_flat, packed_flat;  // the same on the flat hierarchy; empty: no other path
  // Above these bytes the flat uncompressed path is the two-level one (flat_differs: MPI's own
  // collective either way), and is taken: the interposer then hands the call to MPI untouched.
  double plain_same = std::numeric_limits<double>::infinity();
  const std::vector<double>& times(bool compressed, bool flat) const {
    return flat ? (compressed ? packed_flat : plain_flat) : (compressed ? packed : plain);
  }
  std::vector<double>& times(bool compressed, bool flat) {
    return flat ? (compressed ? packed_flat : plain_flat) : (compressed ? packed : plain);
  }
  bool has_flat(bool compressed) const { return !times(compressed, true).empty(); }
  // Predicted seconds at b bytes one way, on the faster hierarchy: piecewise linear through
  // the points, the first point's below it, the last two points' slope above the last (the
  // bandwidth-bound regime).
  double predict(bool compressed, double b) const;
  // The same on one hierarchy (flat without flat times: the other).
  double predict(bool compressed, bool flat, double b) const;
  // Whether that way has flat times and they are the faster at b bytes.
  bool flat(bool compressed, double b) const;
  // nullopt: compress a call of b bytes; else why not (Skip::auto_small below a size from
  // which compressing wins, Skip::auto_link where it wins at no larger size either).
  std::optional<Skip> decide(double b) const;
  // The smallest size from which compression wins (infinity: never), for people to read.
  double break_even() const;
  // "int8 from 3.2 KiB" (and where the flat hierarchy is taken), for people to read.
  std::string describe(const char* codec) const;
  // Time t measured at b bytes one way on one hierarchy: that size's point (within 1%), or a
  // new one whose other times are as predicted.
  void set(bool compressed, bool flat, double b, double t);
  // Whether every curve has a time at every size.
  bool well_formed() const;

 private:
  double predict(const std::vector<double>& t, double b) const;
  double best(bool compressed, size_t i) const;  // at point i, the faster hierarchy
};

// "3.2 KiB", for people to read.
std::string size_text(double bytes);

// The fewest calls between checks; a check's values (4, then the median time of the latest
// calls on each of 4 paths, 2 ways on 2 hierarchies, in 28 size classes) and the calls'
// predicted time it waits for, in units of its own exchange's; the drift that re-probes; the
// predicted time below which a call is not judged (latency bound, noisy).
constexpr int kMinCheckCalls = 8, kCheckValues = 4 + 4 * 28;
constexpr double kCheckCost = 200, kDrift = 1.5, kDriftFloor = 100e-6;

// Where a call goes besides compressed or not (auto_decision).
struct Route {
  bool flat = false;  // the flat hierarchy, a path the model times apart (CollArgs::flat)
  bool mpi = false;   // uncompressed, and the MPI library's own collective is its path: the flat
                      // one, or the only one (the interposer hands such a call over untouched)
};

// The decision for a call of `bytes_in` bytes: nullopt (compress), Skip::auto_small /
// auto_link, or Skip::auto_probe when this communicator has no model for it yet or the call
// goes uncompressed to be timed; and its route. Local.
std::optional<Skip> auto_decision(MPI_Comm comm, Coll coll, const CollArgs& a, size_t bytes_in, Route& route);

// Runs a collective of coll on host buffers with the given args, compressed as they say
// (args.spec none: uncompressed) whatever min_bytes says, and not counted in the statistics.
using ProbeRun = std::function<void(const CollArgs&, const void* x, void* y)>;

// After an "auto" call that returned on every rank (collective: every rank makes the same
// calls): measures the model when the call had none, else records its time, and every few
// calls checks for drift (re-measures, or refines the model). x: the call's input, the
// probe's data.
void auto_after(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in,
                std::optional<Skip> skip, double seconds, const ProbeRun& run);

// Up to which bytes_in the flat hierarchy (CollArgs::flat) is another path than the one
// Config::hierarchy sets, for a call of coll uncompressed and compressed (0: at no size,
// SIZE_MAX: at every size): measured too where it is. Uncompressed, at every size only float32
// allreduce on nodes that only Config::ranks_per_node tells of, whose flat path is MPI's own
// allreduce; else up to where calls ride the agreement, on nodes of two lanes or more. Defined
// with the paths, in collectives.cpp.
std::array<size_t, 2> flat_differs(Coll coll, MPI_Comm comm, const CollArgs& a);

// The model comm holds for (coll, dtype, codec), if any, and how often it was measured.
std::optional<AutoModel> auto_model(MPI_Comm comm, Coll coll, DType t, Spec codec, int* probes = nullptr);
// Installs a model given by each rank (a saved one; tests): the ranks' times are agreed as a
// probe's are (the slowest rank's), and it counts as measured now. Collective.
void auto_install(MPI_Comm comm, Coll coll, DType t, Spec codec, AutoModel mine);

}  // namespace mpicomp
