// Process-wide tuning of the collectives. Set from Python (mpicomp.config) or, in the
// interposer, from environment variables; read once at the start of every call.
#pragma once
#include <cstddef>
#include <cstdint>

namespace mpicomp {

// Whether a collective on ranks spread over several nodes runs in two levels (topology.h).
enum class Hierarchy : uint8_t { automatic = 0, flat = 1 };

struct Config {
  // Messages smaller than this (bytes of input) are sent uncompressed: they are latency
  // bound, and encoding only adds time. Default from bench/results (see README).
  size_t min_bytes = 64 * 1024;
  // Uncompressed collectives up to this many bytes (allreduce input, reduce-scatter input,
  // allgather output) are done inside the agreement exchange, the data attached to its
  // messages: one exchange pattern in all. On two ranks all of them are, whatever the size.
  size_t eager_bytes = 32 * 1024;
  // Input bytes per pipelined message: encoding of one segment overlaps the transfer of
  // the previous ones. An allreduce goes a tile of one segment per rank at a time, so that
  // a rank's float32 sums stay in cache (call.cpp: tiling).
  size_t segment_bytes = 1 << 19;
  // Skip compression when all ranks share one node's memory, where the MPI library's
  // shared-memory copies beat encoding (bench/results). Off by default: the codec a user
  // names is the codec applied, on one node as on many, so numerics do not change with
  // placement; skipping is a policy the user asks for.
  bool skip_local = false;
  // Rank 0 prints a line the first time a collective travels uncompressed for a new reason
  // (stats.h). Does not shape the wire.
  bool verbose = false;
  // Seconds a call may wait for other ranks before it raises ErrorKind::timeout (deadline.h);
  // 0: no limit, as MPI. Does not shape the wire.
  double timeout_s = 0;
  // Scratch bytes a thread keeps between calls (scratch.h); the rest is freed after each
  // call. Large enough for a torch DDP bucket's buffers (25 MiB of float32) many times over, so
  // a training loop allocates nothing. Shapes the wire of one kind of call only: an
  // uncompressed allreduce above it goes in pieces of half of it (agreed).
  size_t cache_bytes = size_t(128) << 20;
  // automatic: on communicators spanning more than one node with more than one rank on some
  // node, allreduce runs in two levels: exact inside each node, compressed between nodes, so
  // that each byte crosses a node's network card once (reduce_scatter and allgather are flat
  // yet). flat: every rank exchanges with every other, as on nodes of one rank. Shapes the
  // wire (agreed).
  Hierarchy hierarchy = Hierarchy::automatic;
  // 0: nodes are what MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) says. K: ranks r of
  // MPI_COMM_WORLD with the same r / K form a node (emulated nodes, block placement). Read
  // when a communicator is first used: its layout is fixed from then on (topology.h).
  size_t ranks_per_node = 0;
  // Codec "auto" measures a communicator again when its calls drift from the times it
  // measured, at most this often (seconds); 0: never again (adaptive.h). Agreed (the
  // longest of the ranks').
  double auto_reprobe_s = 60;
  // segment_bytes for a call where any rank's buffers are on a GPU (agreed, like
  // segment_bytes): each segment costs the GPU engine kernel launches and a stream
  // synchronisation, so its segments are longer (docs/gpu.md). Shapes the wire.
  size_t gpu_segment_bytes = size_t(32) << 20;
};

Config config();
void set_config(const Config& c);
// config().verbose without a copy of the configuration: asked after every call sent
// uncompressed, which on shared memory takes a microsecond or two.
bool verbose();

}  // namespace mpicomp
