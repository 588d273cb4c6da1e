#include "handshake.h"

#include <cstring>
#include <string>

#include "exchange.h"

namespace mpicomp {

size_t accum_size(DType t) { return (t == DType::f16 || t == DType::bf16) ? 4 : dtype_size(t); }

std::string describe(const Signature& s) {
  if (s.invalid) return "rejected its own arguments";
  std::string d = std::string(coll_name(s.coll)) + " of " + std::to_string(s.count) + " " + dtype_name(s.dtype) +
                  " with codec " + (s.adaptive ? "auto:" : "") + codec_name(s.codec);
  if (is_blockwise(s.codec)) d += " (block " + std::to_string(s.block) + ")";
  if (s.wire != s.codec) d += " sent as " + std::string(codec_name(s.wire));
  if (s.segment && s.wire == CodecId::none && s.codec != CodecId::bound)  // collectives.cpp: in_pieces
    d += " in pieces of " + std::to_string(s.segment) + " bytes (cache_bytes / 2)";
  else if (s.segment)
    d += " in segments of " + std::to_string(s.segment) + " bytes (" + std::to_string(s.gpu_segment) +
         " with GPU buffers)";
  if (s.coll == Coll::allreduce || s.coll == Coll::reduce_scatter) d += s.avg ? ", op avg" : ", op sum";
  if (s.flat) d += ", hierarchy flat";
  return d;
}

namespace {

using namespace agreement;

// Returns whether any rank's buffers are on a GPU (Signature::device).
bool exchange(MPI_Comm comm, const Signature& mine, const Payload& data, double* most) {
  CommInfo ci(comm);
  Exchange ex;
  std::memset(&ex.mine, 0, sizeof(Header));
  ex.mine.magic = kMagic;
  ex.mine.rank = ci.rank;
  ex.mine.sig = mine;
  ex.mine.witness_rank[0] = ex.mine.witness_rank[1] = -1;
  ex.mine.most = most ? *most : 0;
  ex.data = data;
  ex.src = static_cast<const char*>(data.in);
  ex.elem = accum_size(mine.dtype);
  if (data.kind == Payload::gather) {
    char* own = static_cast<char*>(data.out) + size_t(ci.rank) * data.count;
    // First, as MPICH's allgather does: a copy overlapped with the exchange would not be
    // (on shared memory a transfer progresses only while the ranks are inside MPI).
    if (data.count && data.in != own) std::memcpy(own, data.in, data.count);
  } else if (ci.size == 1 && data.kind != Payload::none && data.in != data.out) {
    std::memcpy(data.out, data.in, data.count * ex.elem);
  }
  if (ci.size > 1) {
    const NodeLayout& nodes = node_layout(comm);  // made by then: signature() asks for it
    Links links(nodes);  // where the data goes, for the statistics (two_levels: by phase)
    if (data.kind == Payload::halve && !nodes.hierarchical())
      halving(ex, comm, ci.rank, ci.size);
    else if (nodes.hierarchical())
      two_levels(ex, ci, nodes);
    else
      doubling(ex, comm, ci.rank, ci.size, Blocks{static_cast<char*>(data.out), data.count});
  }
  if (mine.invalid || (ex.mine.flags & kDisagree)) {
    const Header& h = ex.mine;
    std::string msg = std::string(coll_name(mine.coll)) + ": ranks disagree: ";
    if (h.witness_rank[0] >= 0)
      msg += "rank " + std::to_string(h.witness_rank[0]) + " " + describe(h.witness[0]) + ", but rank " +
             std::to_string(h.witness_rank[1]) + " " + describe(h.witness[1]);
    else
      msg += "this rank " + describe(mine);
    throw Error(ErrorKind::shape_mismatch, msg);
  }
  if (most) *most = ex.mine.most;
  return ex.mine.sig.device;
}

}  // namespace

void agree(MPI_Comm comm, Signature& mine, double* most) { mine.device = exchange(comm, mine, Payload{}, most); }

void eager_collective(MPI_Comm comm, const Signature& mine, const Payload& data, double* most) {
  exchange(comm, mine, data, most);
}

}  // namespace mpicomp