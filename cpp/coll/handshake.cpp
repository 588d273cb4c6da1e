#include "handshake.h"

#include <cstring>
#include <vector>

#include "mpi_util.h"

namespace mpicomp {
namespace {

constexpr int kTag = 0x6d63;      // "mc": on the private communicator only
constexpr int kDataTag = 0x6d64;  // eager data, a message of its own: sent from where it lies
constexpr uint32_t kMagic = 0x4d504331;
constexpr uint32_t kDisagree = 1;

struct Header {
  uint32_t magic;
  uint32_t flags;
  int32_t rank;
  int32_t witness_rank[2];
  uint64_t payload_bytes;  // the eager data message that follows (0: none)
  Signature sig;
  Signature witness[2];  // two ranks that disagree, for the message
};

// acc = src + in, elementwise (src may be acc).
template <class T>
void add(void* acc, const void* src, const void* in, size_t n) {
  T* a = static_cast<T*>(acc);
  const T* s = static_cast<const T*>(src);
  const T* b = static_cast<const T*>(in);
  for (size_t i = 0; i < n; ++i) a[i] = s[i] + b[i];
}

void add_payload(DType t, void* acc, const void* src, const void* in, size_t n) {
  switch (t) {
    case DType::f64: add<double>(acc, src, in, n); break;
    case DType::i8: add<int8_t>(acc, src, in, n); break;
    case DType::u8: add<uint8_t>(acc, src, in, n); break;
    case DType::i16: add<int16_t>(acc, src, in, n); break;
    case DType::i32: add<int32_t>(acc, src, in, n); break;
    case DType::i64: add<int64_t>(acc, src, in, n); break;
    default: add<float>(acc, src, in, n); break;  // f32, and 16-bit floats accumulated as f32
  }
}

// acc = src | in, bytewise: an allgather's payloads, zero outside each rank's own block.
void or_bytes(void* acc, const void* src, const void* in, size_t n) {
  uint8_t* a = static_cast<uint8_t*>(acc);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  const uint8_t* b = static_cast<const uint8_t*>(in);
  for (size_t i = 0; i < n; ++i) a[i] = s[i] | b[i];
}

// Per-thread scratch, kept between calls: an agreement allocates only when a payload grows.
char* scratch(int which, size_t bytes) {
  thread_local std::vector<char> b[4];
  if (b[which].size() < bytes) b[which].resize(bytes);
  return b[which].data();
}

void wait(MPI_Request* r, const char* what) { mpi_check(PMPI_Wait(r, MPI_STATUS_IGNORE), what); }

// The first kInline bytes of a payload are copied into the header message; the rest, if
// any, travels as a message of its own straight from the caller's buffer. A message that fits
// one of MPICH's 8 KiB shared-memory cells (less their own header) costs half of one that
// does not: 4.8 vs 10 us for a 2-rank exchange of 8100 vs 8192 bytes.
constexpr size_t kInline = 7 * 1024;
constexpr size_t kMessageMax = sizeof(Header) + kInline;
size_t rest(size_t bytes) { return bytes > kInline ? bytes - kInline : 0; }

// One agreement. The rest of a payload is received while the headers are: both are posted
// before either is waited for. Only when the headers show the ranks disagree on the payload
// is a posted receive cancelled, or an unexpected rest drained: every message is matched.
struct Exchange {
  Header mine;
  const void* src;  // what this rank sends: its input, then the running sum
  void* acc;        // the running sum
  size_t bytes;     // of the payload, the same on every rank that agrees
  DType dtype;
  bool gather;      // payloads are combined by bitwise or (allgather), not summed
  char* out = scratch(2, kMessageMax);
  char* in_msg = scratch(3, kMessageMax);

  const Header& in() const { return *reinterpret_cast<const Header*>(in_msg); }

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
    if (!(mine.flags & kDisagree) && bytes) {
      if (gather) or_bytes(acc, src, payload, bytes);
      else add_payload(dtype, acc, src, payload, bytes / accum_size(dtype));
      src = acc;
    }
  }

  void post_send(MPI_Comm c, int peer, MPI_Request* r) {
    mine.payload_bytes = bytes;
    std::memcpy(out, &mine, sizeof(Header));
    size_t head = bytes - rest(bytes);
    if (head) std::memcpy(out + sizeof(Header), src, head);
    mpi_check(PMPI_Isend(out, int(sizeof(Header) + head), MPI_BYTE, peer, kTag, c, &r[0]), "MPI_Isend");
    r[1] = MPI_REQUEST_NULL;
    if (rest(bytes))
      mpi_check(PMPI_Isend_c(static_cast<const char*>(src) + head, MPI_Count(rest(bytes)), MPI_BYTE, peer, kDataTag,
                             c, &r[1]),
                "MPI_Isend");
  }
  // Receives a peer's header and payload, the payload into `into`.
  void post_recv(MPI_Comm c, int peer, void* into, MPI_Request* r) {
    mpi_check(PMPI_Irecv(in_msg, int(kMessageMax), MPI_BYTE, peer, kTag, c, &r[0]), "MPI_Irecv");
    r[1] = MPI_REQUEST_NULL;
    if (rest(bytes))
      mpi_check(PMPI_Irecv_c(static_cast<char*>(into) + kInline, MPI_Count(rest(bytes)), MPI_BYTE, peer, kDataTag, c,
                             &r[1]),
                "MPI_Irecv");
  }
  // Completes a posted receive; true when the payload arrived as this rank posted for it.
  // When the sizes differ the signatures do too (the count is in them): the data is unused.
  bool finish_recv(MPI_Comm c, int peer, void* into, MPI_Request* r) {
    wait(&r[0], "MPI_Wait");
    const uint64_t theirs = in().payload_bytes;
    if (theirs == bytes) {
      if (rest(bytes)) wait(&r[1], "MPI_Wait");
      if (bytes) std::memcpy(into, in_msg + sizeof(Header), bytes - rest(bytes));
      return true;
    }
    if (r[1] != MPI_REQUEST_NULL) {
      if (!rest(theirs)) mpi_check(PMPI_Cancel(&r[1]), "MPI_Cancel");
      PMPI_Wait(&r[1], MPI_STATUS_IGNORE);  // cancelled, or truncated: either way discarded
    } else if (rest(theirs)) {
      mpi_check(PMPI_Recv_c(scratch(1, rest(theirs)), MPI_Count(rest(theirs)), MPI_BYTE, peer, kDataTag, c,
                            MPI_STATUS_IGNORE),
                "MPI_Recv");
    }
    return false;
  }

  void send(MPI_Comm c, int peer) {
    MPI_Request r[2];
    post_send(c, peer, r);
    mpi_check(PMPI_Waitall(2, r, MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
  bool recv(MPI_Comm c, int peer, void* into) {
    MPI_Request r[2];
    post_recv(c, peer, into, r);
    return finish_recv(c, peer, into, r);
  }
  void sendrecv(MPI_Comm c, int peer) {
    MPI_Request r[4];
    void* tmp = scratch(0, bytes);
    post_recv(c, peer, tmp, r);
    post_send(c, peer, r + 2);
    bool same = finish_recv(c, peer, tmp, r);
    mpi_check(PMPI_Waitall(2, r + 2, MPI_STATUSES_IGNORE), "MPI_Waitall");
    merge(in(), same ? tmp : nullptr);
    if (!same) {
      // Both sides saw the sizes differ. Meet once more before returning, so that the peer
      // cannot reach its next call, whose payload a receive not yet cancelled could take.
      mpi_check(PMPI_Sendrecv(nullptr, 0, MPI_BYTE, peer, kTag, nullptr, 0, MPI_BYTE, peer, kTag, c,
                              MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
    }
  }
};

}  // namespace

size_t accum_size(DType t) { return (t == DType::f16 || t == DType::bf16) ? 4 : dtype_size(t); }

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

void handshake(MPI_Comm comm, const Signature& mine, const void* eager_in, void* eager_out, size_t eager_count) {
  CommInfo ci(comm);
  Exchange ex;
  std::memset(&ex.mine, 0, sizeof(Header));
  ex.mine.magic = kMagic;
  ex.mine.rank = ci.rank;
  ex.mine.sig = mine;
  ex.mine.witness_rank[0] = ex.mine.witness_rank[1] = -1;
  ex.dtype = mine.dtype;
  ex.gather = mine.coll == Coll::allgather;
  ex.src = eager_in;
  ex.acc = eager_out;
  ex.bytes = !eager_out ? 0 : ex.gather ? eager_count : eager_count * accum_size(mine.dtype);
  if (ci.size == 1 && ex.bytes && eager_in != eager_out) std::memcpy(eager_out, eager_in, ex.bytes);
  if (ci.size > 1) {
    // Recursive doubling; the first 2*rem ranks pair up first so a power of two remains.
    int pof2 = 1;
    while (pof2 * 2 <= ci.size) pof2 *= 2;
    int rem = ci.size - pof2, r = ci.rank, newrank;
    if (r < 2 * rem) {
      if (r % 2 == 0) {
        void* tmp = scratch(0, ex.bytes);
        bool same = ex.recv(comm, r + 1, tmp);
        ex.merge(ex.in(), same ? tmp : nullptr);
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
        ex.src = ex.acc;
        ex.send(comm, r + 1);
      } else {
        ex.recv(comm, r - 1, ex.acc);  // the sum, straight into place
        const Header& h = ex.in();
        ex.mine.flags = h.flags;
        std::memcpy(ex.mine.witness, h.witness, sizeof h.witness);
        std::memcpy(ex.mine.witness_rank, h.witness_rank, sizeof h.witness_rank);
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
