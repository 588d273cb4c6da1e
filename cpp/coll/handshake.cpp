#include "handshake.h"

#include <cstring>
#include <vector>

#include "mpi_util.h"

namespace mpicomp {
namespace {

constexpr int kTag = 0x6d63;  // "mc": on the private communicator only
constexpr uint32_t kMagic = 0x4d504331;
constexpr uint32_t kDisagree = 1;

struct Header {
  uint32_t magic;
  uint32_t flags;
  int32_t rank;
  int32_t witness_rank[2];
  uint32_t payload_bytes;
  Signature sig;
  Signature witness[2];  // two ranks that disagree, for the message
};

template <class T>
void add(void* acc, const void* in, size_t n) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

void add_payload(DType t, void* acc, const void* in, size_t n) {
  switch (t) {
    case DType::f64: add<double>(acc, in, n); break;
    case DType::i8: add<int8_t>(acc, in, n); break;
    case DType::u8: add<uint8_t>(acc, in, n); break;
    case DType::i16: add<int16_t>(acc, in, n); break;
    case DType::i32: add<int32_t>(acc, in, n); break;
    case DType::i64: add<int64_t>(acc, in, n); break;
    default: add<float>(acc, in, n); break;  // f32, and 16-bit floats accumulated as f32
  }
}

size_t accum_size(DType t) { return (t == DType::f16 || t == DType::bf16) ? 4 : dtype_size(t); }

// Per-thread message buffers, allocated once: an agreement costs no allocation.
std::vector<char>& buffer(int which) {
  thread_local std::vector<char> b[2];
  if (b[which].size() < sizeof(Header) + kEagerMax) b[which].resize(sizeof(Header) + kEagerMax);
  return b[which];
}

struct Exchange {
  Header mine;
  std::vector<char>& in = buffer(0);
  std::vector<char>& out = buffer(1);
  void* eager;
  size_t eager_bytes;
  DType dtype;

  void merge(const Header& other, const void* payload) {
    mine.flags |= other.flags;
    if (!(mine.flags & kDisagree) && !(other.sig == mine.sig)) {
      mine.flags |= kDisagree;
      mine.witness[0] = mine.sig;  mine.witness_rank[0] = mine.rank;
      mine.witness[1] = other.sig; mine.witness_rank[1] = other.rank;
    } else if ((other.flags & kDisagree) && mine.witness_rank[0] < 0) {
      std::memcpy(mine.witness, other.witness, sizeof mine.witness);
      std::memcpy(mine.witness_rank, other.witness_rank, sizeof mine.witness_rank);
    }
    if (!(mine.flags & kDisagree) && eager_bytes)
      add_payload(dtype, eager, payload, eager_bytes / accum_size(dtype));
  }

  // The outgoing message: header, then the running eager sum.
  int pack() {
    std::memcpy(out.data(), &mine, sizeof(Header));
    if (eager_bytes) std::memcpy(out.data() + sizeof(Header), eager, eager_bytes);
    return int(sizeof(Header) + eager_bytes);
  }
  void send(MPI_Comm c, int peer) {
    int n = pack();
    mpi_check(PMPI_Send(out.data(), n, MPI_BYTE, peer, kTag, c), "MPI_Send");
  }
  // The buffer is the largest any rank can send, so a disagreeing peer is never truncated.
  const Header& recv(MPI_Comm c, int peer) {
    mpi_check(PMPI_Recv(in.data(), int(in.size()), MPI_BYTE, peer, kTag, c, MPI_STATUS_IGNORE), "MPI_Recv");
    return *reinterpret_cast<const Header*>(in.data());
  }
  void sendrecv(MPI_Comm c, int peer) {
    int n = pack();
    mpi_check(PMPI_Sendrecv(out.data(), n, MPI_BYTE, peer, kTag, in.data(), int(in.size()), MPI_BYTE,
                            peer, kTag, c, MPI_STATUS_IGNORE),
              "MPI_Sendrecv");
    const Header& h = *reinterpret_cast<const Header*>(in.data());
    merge(h, in.data() + sizeof(Header));
  }
};

}  // namespace

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::allreduce: return "allreduce";
    case Coll::reduce_scatter: return "reduce_scatter";
    case Coll::allgather: return "allgather";
    default: return "send/recv";
  }
}
const char* codec_name(CodecId c) {
  static const char* names[] = {"none", "fp16", "bf16", "int8", "int4", "sign"};
  return names[int(c)];
}
const char* dtype_name(DType t) {
  static const char* names[] = {"float32", "float16", "bfloat16", "float64", "int8",
                                "uint8",   "int16",   "int32",    "int64"};
  return names[int(t)];
}

std::string describe(const Signature& s) {
  if (s.invalid) return "rejected its own arguments";
  std::string d = std::string(coll_name(s.coll)) + " of " + std::to_string(s.count) + " " + dtype_name(s.dtype) +
                  " with codec " + codec_name(s.codec);
  if (is_blockwise(s.codec)) d += " (block " + std::to_string(s.block) + ")";
  if (s.wire != s.codec) d += " sent as " + std::string(codec_name(s.wire));
  if (s.coll == Coll::allreduce || s.coll == Coll::reduce_scatter) d += s.avg ? ", op avg" : ", op sum";
  return d;
}

void handshake(MPI_Comm comm, const Signature& mine, void* eager, size_t eager_count) {
  CommInfo ci(comm);
  Exchange ex;
  std::memset(&ex.mine, 0, sizeof(Header));
  ex.mine.magic = kMagic;
  ex.mine.rank = ci.rank;
  ex.mine.sig = mine;
  ex.mine.witness_rank[0] = ex.mine.witness_rank[1] = -1;
  ex.dtype = mine.dtype;
  ex.eager = eager;
  ex.eager_bytes = eager ? eager_count * accum_size(mine.dtype) : 0;
  if (ci.size > 1) {
    // Recursive doubling; the first 2*rem ranks pair up first so a power of two remains.
    int pof2 = 1;
    while (pof2 * 2 <= ci.size) pof2 *= 2;
    int rem = ci.size - pof2, r = ci.rank, newrank;
    if (r < 2 * rem) {
      if (r % 2 == 0) {
        const Header& h = ex.recv(comm, r + 1);
        ex.merge(h, ex.in.data() + sizeof(Header));
        newrank = r / 2;
      } else {
        ex.send(comm, r - 1);
        newrank = -1;
      }
    } else {
      newrank = r - rem;
    }
    if (newrank >= 0) {
      for (int mask = 1; mask < pof2; mask <<= 1) {
        int pn = newrank ^ mask;
        ex.sendrecv(comm, pn < rem ? pn * 2 : pn + rem);
      }
    }
    if (r < 2 * rem) {
      if (r % 2 == 0) {
        ex.send(comm, r + 1);
      } else {
        const Header& h = ex.recv(comm, r - 1);
        ex.mine.flags = h.flags;
        std::memcpy(ex.mine.witness, h.witness, sizeof h.witness);
        std::memcpy(ex.mine.witness_rank, h.witness_rank, sizeof h.witness_rank);
        if (ex.eager_bytes && !(h.flags & kDisagree))
          std::memcpy(eager, ex.in.data() + sizeof(Header), ex.eager_bytes);
      }
    }
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
}

}  // namespace mpicomp
