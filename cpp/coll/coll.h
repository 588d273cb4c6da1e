// Layer 2: compressed collectives over MPI with plain C arguments, shared by the Python
// bindings and the LD_PRELOAD interposer. Every call first agrees with the other ranks on
// what is being done (handshake.h), then moves the data. Buffers are engine memory (host
// for the CPU engine); x and y may be the same buffer for allreduce.
#pragma once
#include <mpi.h>

#include "engine.h"
#include "handshake.h"

namespace mpicomp {

enum class Skip : uint8_t;  // stats.h

struct CollArgs {
  Spec spec;                   // codec as requested (below Config::min_bytes, none is used)
  bool adaptive = false;       // codec "auto": spec where it pays, by size, measured (adaptive.h); min_bytes unused
  DType dtype = DType::f32;
  size_t count = 0;            // see each function
  bool avg = false;            // divide the sum by the communicator's size
  float* residual = nullptr;   // error feedback, float32 with as many elements as the input
  Engine* engine = nullptr;    // null: the CPU engine
  bool flat = false;           // the flat hierarchy, whatever Config::hierarchy says (codec "auto"'s measurements)
};

// A call's input bytes on a communicator of `size` ranks (for reduce_scatter all its parts), as
// the statistics count them and codec "auto" decides by.
inline size_t bytes_in(Coll coll, const CollArgs& a, int size) {
  return a.count * dtype_size(a.dtype) * (coll == Coll::reduce_scatter ? size_t(size) : 1);
}

// allreduce and allgather outputs of this many bytes and more are decoded into place with
// streaming stores, around the cache (Engine::decode): no longer fitting in cache, each line
// of them would be read from memory before it is written. 10 Gbit/s, 2 ranks, int4
// allreduce: 64 MiB 21.5-22.1 -> 16.1-16.9 ms, 32 MiB 9.8 -> 7.2-8.0 ms; at 16 MiB, which
// stays in cache between calls, sign was slower (docs/measurements.md). mpicomp.bench.bound
// times its decodes the same way (_core.STREAM_BYTES).
constexpr size_t kStreamBytes = size_t(32) << 20;

// y[i] = sum (or mean) over ranks of x[i]; count elements each.
void allreduce(MPI_Comm comm, const void* x, void* y, const CollArgs& a);
// x holds size * count elements; y (count) = the sum over ranks of part `rank` of x. y does
// not overlap x (MPI's rule too: the Python layer refuses it, the interposer copies an
// MPI_IN_PLACE input).
void reduce_scatter(MPI_Comm comm, const void* x, void* y, const CollArgs& a);
// x holds count elements; y (size * count) = the concatenation of all ranks' x.
void allgather(MPI_Comm comm, const void* x, void* y, const CollArgs& a);
// One of the three above, by its Coll id (the bindings receive it as a number).
void collective(Coll coll, MPI_Comm comm, const void* x, void* y, const CollArgs& a);
// A codec "auto" call that the model sent uncompressed (`why`) and that the caller handed to
// the MPI library itself (the interposer), in `seconds`: timed for the model as the core's
// own calls are (adaptive.h). x: its input. Collective, as the call was.
void auto_passed(Coll coll, MPI_Comm comm, const void* x, const CollArgs& a, Skip why, double seconds);
// Point to point on the caller's communicator and tag; count elements.
void send(MPI_Comm comm, const void* x, int dest, int tag, const CollArgs& a);
void recv(MPI_Comm comm, void* y, int source, int tag, const CollArgs& a);
// True when every rank of comm shares this node's memory (topology.h). Collective on the
// first call for a communicator, cached after.
bool node_local(MPI_Comm comm);
// This rank found its own arguments invalid: takes part in the agreement so that every
// other rank of the collective raises ShapeMismatchError instead of waiting forever.
void reject(MPI_Comm comm, Coll coll);

}  // namespace mpicomp
