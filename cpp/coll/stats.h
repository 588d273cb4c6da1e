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

#include "handshake.h"

namespace mpicomp {

// Why a call travelled uncompressed. The first four are the core's decisions; the rest are
// the interposer's, for calls it hands to the MPI library without reaching the core.
enum class Skip : uint8_t {
  codec_none,   // the codec asked for is "none"
  small,        // input below Config::min_bytes
  single_rank,  // a communicator of one rank: nothing to send
  local,        // all ranks share one node and Config::skip_local is set
  off,          // interposer: no codec set for this collective (MPICOMP_CODEC unset or off)
  datatype,     // interposer: not MPI_FLOAT / MPI_DOUBLE / 16-bit float, or mixed send/receive types
  op,           // interposer: an op other than MPI_SUM
  intercomm,    // interposer: an inter-communicator
  threads,      // interposer: non-blocking call below MPI_THREAD_MULTIPLE
  count_
};
constexpr int kSkips = int(Skip::count_);
const char* skip_name(Skip s);

// Index 0 is unused; 1..4 are the Coll values (send counts send/recv).
constexpr int kStatColls = 5;

struct CollStats {
  double calls = 0, compressed = 0;
  double bytes_in = 0;    // input bytes (allgather: this rank's part; reduce_scatter: all parts)
  double bytes_wire = 0;  // payload bytes this rank sent (see stats_record)
  double bytes_plain = 0; // what the same calls send uncompressed: bytes_plain / bytes_wire is
                          // the saving on the wire
  double seconds = 0;     // inside the collective, this rank
  double skipped[kSkips] = {};
};

struct Stats {
  CollStats coll[kStatColls];
};

// A call of `coll` on `size` ranks with `bytes_in` input bytes. wire_bytes: the bytes this rank
// sent for a compressed call; an uncompressed one (skip set) counts what the bandwidth-optimal
// algorithm sends (uncompressed_wire_bytes), whatever path MPI took.
void stats_record(Coll coll, int size, size_t bytes_in, size_t wire_bytes, double seconds, const Skip* skip);
// The bytes an uncompressed call of `coll` sends per rank: (size - 1) / size of the data per
// stage (two stages for allreduce, one for reduce_scatter; allgather's data is size parts).
size_t uncompressed_wire_bytes(Coll coll, int size, size_t bytes_in);
Stats stats();
void stats_reset();
// The statistics as a table a person can read and a script can parse ('#' comment lines, one
// row per collective that ran). title: the first comment line.
std::string stats_table(const Stats& s, const std::string& title);

// The verbose notice: at Config::verbose, the first time a collective travels uncompressed for
// a reason other than codec "none", rank 0 of MPI_COMM_WORLD prints one line saying why.
void notice_skip(Coll coll, Skip why, size_t bytes_in);

}  // namespace mpicomp
