// Agreement before every collective: all ranks exchange what they are about to do (the
// collective, codec, dtype, count, op) by recursive doubling, so a disagreement is found on
// every rank, in log2(size) rounds, with every message matched: the communicator stays
// usable. Uncompressed allreduces (small ones; on two ranks all) carry their data along and
// are complete when it returns.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <string>

#include "../codecs/format.h"

namespace mpicomp {

enum class Coll : uint8_t { allreduce = 1, reduce_scatter = 2, allgather = 3, send = 4 };

// What one rank intends; all ranks of one call must send equal signatures.
struct Signature {
  uint64_t count = 0;   // elements of the input on this rank
  uint32_t block = 0;
  Coll coll = Coll::allreduce;
  CodecId codec = CodecId::none;  // as requested
  CodecId wire = CodecId::none;   // as used on the wire (after the size threshold)
  DType dtype = DType::f32;
  uint8_t avg = 0;
  uint8_t eager = 0;    // data rides along with the agreement
  uint8_t invalid = 0;  // this rank rejected its own arguments
  bool operator==(const Signature& o) const {
    return count == o.count && block == o.block && coll == o.coll && codec == o.codec && wire == o.wire &&
           dtype == o.dtype && avg == o.avg && eager == o.eager && !invalid && !o.invalid;
  }
};

std::string describe(const Signature& s);

// Exchanges `mine` with all ranks of comm. Throws ShapeMismatchError on every rank when any
// two disagree. With eager data, sums eager_in (eager_count elements of the accumulation type
// of mine.dtype: float for 16-bit floats) over all ranks into eager_out, which may be
// eager_in; for an allgather, ors eager_count bytes instead.
void handshake(MPI_Comm comm, const Signature& mine, const void* eager_in = nullptr, void* eager_out = nullptr,
               size_t eager_count = 0);

// Bytes per element in which eager payloads are summed: float32 for 16-bit floats, else the
// dtype itself.
size_t accum_size(DType t);

const char* coll_name(Coll c);
const char* codec_name(CodecId c);
const char* dtype_name(DType t);

}  // namespace mpicomp
