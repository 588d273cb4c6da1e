// Agreement before every collective: all ranks exchange what they are about to do (the
// collective, codec, dtype, count, op) by recursive doubling (on nodes of several ranks, in
// two levels: inside each node, between nodes, down each node), so a disagreement is found on
// every rank, in log2(size) rounds, with every message matched: the communicator stays
// usable. The same messages can carry an uncompressed collective's data (eager_collective:
// small ones; on two ranks all), which then costs one exchange pattern in all.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

#include "../codecs/format.h"
#include "coll_id.h"

namespace mpicomp {

// What one rank intends; all ranks of one call must send equal signatures.
struct Signature {
  uint64_t count = 0;   // elements of the input on this rank
  uint64_t segment = 0; // Config::segment_bytes when compressed: the pipeline's message sizes follow from it;
                        // uncompressed, the pieces of an allreduce above cache_bytes (collectives.cpp)
  uint64_t gpu_segment = 0; // Config::gpu_segment_bytes when compressed: the segment where any rank has `device`
  uint32_t block = 0;
  Coll coll = Coll::allreduce;
  CodecId codec = CodecId::none;  // as requested
  CodecId wire = CodecId::none;   // as used on the wire (after the size threshold)
  DType dtype = DType::f32;
  uint8_t avg = 0;
  uint8_t eager = 0;    // data rides along with the agreement
  uint8_t invalid = 0;  // this rank rejected its own arguments
  uint8_t flat = 0;     // Config::hierarchy is flat (topology.h: the layout itself is agreed when it is made)
  uint8_t adaptive = 0; // codec "auto", `codec` where it pays (adaptive.h)
  // This rank's buffers are on a GPU. Not compared: agree() folds it over the ranks, so that
  // a call where any rank has GPU buffers takes gpu_segment on every rank (ranks with GPU and
  // with host buffers meet in one call).
  uint8_t device = 0;
  // Uncompressed on the flat path that codec "auto" times apart from two levels (CollArgs::flat,
  // Route::flat): above eager_bytes, not riding the agreement but the MPI library's own
  // allreduce, as an unmodified program's (up to it, the data rides in every lane: `flat`).
  // Not compared: every rank derives it from the same model.
  uint8_t mpi_own = 0;
  bool operator==(const Signature& o) const {
    return count == o.count && segment == o.segment && gpu_segment == o.gpu_segment && block == o.block &&
           coll == o.coll && codec == o.codec && wire == o.wire && dtype == o.dtype && avg == o.avg &&
           eager == o.eager && flat == o.flat && adaptive == o.adaptive && !invalid && !o.invalid;
  }
};

std::string describe(const Signature& s);

// Data that travels with the agreement (the agreement and the data share every message).
struct Payload {
  enum Kind : uint8_t {
    none,    // agree() alone
    sum,     // in, out: count elements; out = the sum over ranks (recursive doubling)
    halve,   // in, out: count elements in `size` equal parts; part `rank` of out = the sum of
             // everyone's part `rank`, the rest of out is scratch (recursive halving; on
             // nodes of several ranks, two levels, the whole sum is made)
    gather,  // in: this rank's block of count bytes; out: size blocks, all ranks' in, in rank
             // order (recursive doubling, each block received straight into place)
  } kind = none;
  const void* in = nullptr;
  void* out = nullptr;  // may be in (sum, halve), or hold in at block `rank` (gather)
  size_t count = 0;
};

// Exchanges `mine` with all ranks of comm. Throws ShapeMismatchError on every rank when any
// two disagree; every message is matched either way. `most`, where given, is this rank's
// value of a number the ranks need the largest of, and returns that largest (codec bound's
// largest input: one round trip fewer than a reduction of its own). mine.device returns
// whether any rank's buffers are on a GPU.
void agree(MPI_Comm comm, Signature& mine, double* most = nullptr);
// An uncompressed collective whose data moves in agree()'s messages (sums in the
// accumulation type of mine.dtype: float32 for 16-bit floats); complete when it returns, and
// it throws as agree() does, the data then unused.
void eager_collective(MPI_Comm comm, const Signature& mine, const Payload& data, double* most = nullptr);

// Bytes per element in which eager payloads are summed: float32 for 16-bit floats, else the
// dtype itself.
size_t accum_size(DType t);


}  // namespace mpicomp
