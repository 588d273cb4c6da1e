// Per-process statistics of the collectives: calls, how many were compressed, bytes in and
// on the wire, and for every call that travelled uncompressed, why. The codec a user names is
// the codec applied; every exception to that (below min_bytes, one rank, skip_local, ...) is
// an explicit policy, and counted here so a user can see it (mpicomp.stats(), MPICOMP_STATS,
// and one line per new reason at MPICOMP_VERBOSE=1). Shared by the Python bindings and the
// interposer, which adds the reasons it passes a call to the MPI library untouched.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "handshake.h"

namespace mpicomp {

// Why a call travelled uncompressed. The first seven are the core's decisions; the rest are
// the interposer's, for calls it hands to the MPI library without reaching the core.
enum class Skip : uint8_t {
  codec_none,   // the codec asked for is "none"
  small,        // input below Config::min_bytes
  single_rank,  // a communicator of one rank: nothing to send
  local,        // all ranks share one node and Config::skip_local is set
  auto_probe,   // codec "auto": measuring (a first call of its kind, or one timed uncompressed; adaptive.h)
  auto_small,   // codec "auto": below the size from which compression wins on this communicator
  auto_link,    // codec "auto": compression wins at no size here (the link is faster than the codec)
  off,          // interposer: no codec set for this collective (MPICOMP_CODEC unset or off)
  datatype,     // interposer: not MPI_FLOAT / MPI_DOUBLE / 16-bit float, or mixed send/receive types
  op,           // interposer: an op other than MPI_SUM
  intercomm,    // interposer: an inter-communicator
  threads,      // interposer: non-blocking call below MPI_THREAD_MULTIPLE
  count_
};
constexpr int kSkips = int(Skip::count_);
const char* skip_name(Skip s);

// How a call moved its data: inside the agreement's own messages (eager), by the MPI
// library's collective (mpi), mpicomp's stages among all ranks (flat), or in two levels,
// exact inside each node and compressed between nodes (two_level; topology.h).
enum class Algo : uint8_t { eager, mpi, flat, two_level, count_ };
constexpr int kAlgos = int(Algo::count_);
const char* algo_name(Algo a);

// Index 0 is unused; 1..4 are the Coll values (send counts send/recv).
constexpr int kStatColls = 5;

struct CollStats {
  double calls = 0, compressed = 0;
  double bytes_in = 0;    // input bytes (allgather: this rank's part; reduce_scatter: all parts)
  double bytes_wire = 0;  // payload bytes this rank sent (see stats_record)
  double bytes_plain = 0; // what the same calls send uncompressed: bytes_plain / bytes_wire is
                          // the saving on the wire
  double bytes_inter = 0; // of bytes_wire, what mpicomp's own messages carried to other nodes
  double bytes_intra = 0; // ... and to ranks on this rank's node (MPI's own collectives: neither)
  double seconds = 0;     // inside the collective, this rank
  double skipped[kSkips] = {};
  double algorithm[kAlgos] = {};  // calls per Algo
  double probes = 0, probe_seconds = 0;  // codec "auto"'s measurements (adaptive.h), and their time
};

struct Stats {
  CollStats coll[kStatColls];
};

// Bytes mpicomp's own messages carried, and of them those that left this rank's node
// (inter) and those that did not (intra), where the collective knew its communicator's
// layout (send/recv does not ask: that would be a collective).
struct Sent {
  size_t bytes = 0, inter = 0, intra = 0;
};

// A call of `coll` on `size` ranks with `bytes_in` input bytes, moved by `algo`. sent: the
// bytes this rank's own messages carried, which bytes_wire counts for a compressed call; an
// uncompressed one (skip set) counts what the bandwidth-optimal algorithm sends
// (uncompressed_wire_bytes), whatever path MPI took.
void stats_record(Coll coll, int size, size_t bytes_in, Sent sent, Algo algo, double seconds, const Skip* skip);
// The bytes an uncompressed call of `coll` sends per rank: (size - 1) / size of the data per
// stage (two stages for allreduce, one for reduce_scatter; allgather's data is size parts).
size_t uncompressed_wire_bytes(Coll coll, int size, size_t bytes_in);
// A measurement of codec "auto" for coll, which took `seconds`: a probe (counted), or a
// size measured further (its time only).
void stats_probe(Coll coll, double seconds, bool probe = true);
Stats stats();
// The bytes_wire and bytes_plain of the calls recorded on this thread so far: a layer that
// counts its traffic by purpose (mpicomp.torch.traffic) reads them around its own calls.
std::pair<double, double> thread_bytes();
void stats_reset();
// The statistics as a table a person can read and a script can parse ('#' comment lines, one
// row per collective that ran). title: the first comment line.
std::string stats_table(const Stats& s, const std::string& title);

// The verbose notice: at Config::verbose, the first time a collective travels uncompressed for
// a reason other than codec "none", rank 0 of MPI_COMM_WORLD prints one line saying why.
void notice_skip(Coll coll, Skip why, size_t bytes_in);

}  // namespace mpicomp
