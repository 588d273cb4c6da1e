// One agreement's messages (handshake.h): the header every rank sends, the payload that rides
// with it, and the exchange of both between two ranks; the patterns that pair the ranks up
// (rounds.cpp) and the agreement itself (handshake.cpp) are built on it. Internal to the
// collectives layer.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cstring>

#include "deadline.h"
#include "handshake.h"
#include "mpi_count.h"
#include "mpi_util.h"
#include "scratch.h"
#include "stages.h"
#include "topology.h"

namespace mpicomp {
namespace agreement {

constexpr int kTag = 0x6d63;      // "mc": on the private communicator only
constexpr int kDataTag = 0x6d66;  // eager data, a message of its own: sent from where it lies
                                  // (stages.cpp's tags are 0x6d64 and 0x6d65)
constexpr uint32_t kMagic = 0x4d504331;
constexpr uint32_t kDisagree = 1;

struct Header {
  uint32_t magic;
  uint32_t flags;
  int32_t rank;
  int32_t witness_rank[2];
  uint64_t payload_bytes;  // the eager data message that follows (0: none)
  uint64_t expect_bytes;   // what this rank expects in return from the same peer
  double most;             // the largest of the ranks' values seen so far (agree's `most`)
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

inline void add_payload(DType t, void* acc, const void* src, const void* in, size_t n) {
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

// Per-thread scratch, kept between calls: an agreement allocates only when a payload grows.
inline char* scratch(int which, size_t bytes) {
  thread_local Scratch b[5];
  return b[which].get(bytes);
}

inline void wait(MPI_Request* r, const char* what) { wait_all(1, r, what); }

// The first kInline bytes of a payload are copied into the header message; the rest, if any,
// travels as a message of its own straight from the caller's buffer. Inside a node, a message
// that fits one of MPICH's 8 KiB shared-memory cells (less their own header) costs half of one
// that does not: 4.8 vs 10 us for a 2-rank exchange of 8100 vs 8192 bytes. Between nodes each
// message pays the network's own cost, which a copy costs less than: there a payload of up to
// kWholeBetween goes whole in the header message, and a larger one is cut as inside a node.
// bench/netem's 10 Gbit/s TCP links, a rank per node, 2 ranks, uncompressed allreduce, fastest
// of 5 rounds in 3 runs each: 16 KiB 48.6-55.3 us cut, 36.2-43.0 whole; 64 KiB cut at 7 KiB
// 59-74 us, at 32 KiB 70-91. Both ends of a pair cut alike (crosses_nodes).
constexpr size_t kInline = 7 * 1024, kWholeBetween = 32 * 1024;
constexpr size_t kMessageMax = sizeof(Header) + kWholeBetween;
inline size_t rest(size_t bytes, int peer) {
  return bytes <= kInline || (bytes <= kWholeBetween && crosses_nodes(peer)) ? 0 : bytes - kInline;
}

struct Span {
  void* p;
  size_t n;  // bytes
};

// One agreement. The rest of a payload is received while the headers are: both are posted
// before either is waited for. Only when the headers show the ranks disagree on the payload
// is a posted receive cancelled, or an unexpected rest drained: every message is matched.
struct Exchange {
  Header mine;
  Payload data;
  const char* src;  // sums: what this rank sends, its input and then the running sum
  size_t elem;      // bytes per summed element
  char* out = scratch(2, kMessageMax);
  char* in_msg = scratch(3, kMessageMax);

  const Header& in() const { return *reinterpret_cast<const Header*>(in_msg); }
  bool agreed() const { return !(mine.flags & kDisagree); }

  // Folds a peer's header into this rank's view of the agreement.
  void note(const Header& other) {
    mine.flags |= other.flags;
    mine.most = std::max(mine.most, other.most);
    mine.sig.device |= other.sig.device;
    if (agreed() && !(other.sig == mine.sig)) {
      mine.flags |= kDisagree;
      mine.witness[0] = mine.sig;  mine.witness_rank[0] = mine.rank;
      mine.witness[1] = other.sig; mine.witness_rank[1] = other.rank;
    } else if ((other.flags & kDisagree) && mine.witness_rank[0] < 0) {
      std::memcpy(mine.witness, other.witness, sizeof mine.witness);
      std::memcpy(mine.witness_rank, other.witness_rank, sizeof mine.witness_rank);
    }
  }
  // Sums: out[at..] = src[at..] + the received values; sends go from the sum from then on.
  void add(size_t at, const void* received, size_t bytes) {
    char* acc = static_cast<char*>(data.out);
    add_payload(mine.sig.dtype, acc + at, src + at, received, bytes / elem);
    src = acc;
  }

  void post_send(MPI_Comm c, int peer, Span s, size_t expect, MPI_Request* r) {
    mine.payload_bytes = s.n;
    mine.expect_bytes = expect;
    std::memcpy(out, &mine, sizeof(Header));
    const size_t beside = rest(s.n, peer), head = s.n - beside;
    if (head) std::memcpy(out + sizeof(Header), s.p, head);
    mpi_check(PMPI_Isend(out, int(sizeof(Header) + head), MPI_BYTE, peer, kTag, c, &r[0]), "MPI_Isend");
    note_sent(s.n, peer);
    r[1] = MPI_REQUEST_NULL;
    if (beside) mpic::isend_bytes(static_cast<const char*>(s.p) + head, beside, peer, kDataTag, c, &r[1]);
  }
  void post_recv(MPI_Comm c, int peer, Span into, MPI_Request* r) {
    mpi_check(PMPI_Irecv(in_msg, int(kMessageMax), MPI_BYTE, peer, kTag, c, &r[0]), "MPI_Irecv");
    r[1] = MPI_REQUEST_NULL;
    if (const size_t beside = rest(into.n, peer))
      mpic::irecv_bytes(static_cast<char*>(into.p) + (into.n - beside), beside, peer, kDataTag, c, &r[1]);
  }
  // Completes a posted receive and notes the header; true when the payload arrived as this
  // rank posted for it. When the sizes differ the signatures do too: the data is unused.
  bool finish_recv(MPI_Comm c, int peer, Span into, MPI_Request* r) {
    wait(&r[0], "MPI_Wait");
    note(in());
    const uint64_t theirs = in().payload_bytes;
    if (theirs == into.n) {
      const size_t beside = rest(into.n, peer);
      if (beside) wait(&r[1], "MPI_Wait");
      if (into.n) std::memcpy(into.p, in_msg + sizeof(Header), into.n - beside);
      return true;
    }
    const size_t theirs_beside = rest(theirs, peer);
    if (r[1] != MPI_REQUEST_NULL) {
      if (!theirs_beside) mpi_check(PMPI_Cancel(&r[1]), "MPI_Cancel");
      PMPI_Wait(&r[1], MPI_STATUS_IGNORE);  // cancelled, or truncated: either way discarded
    } else if (theirs_beside) {
      mpic::recv_bytes(scratch(1, theirs_beside), theirs_beside, peer, kDataTag, c);
    }
    return false;
  }

  void send(MPI_Comm c, int peer, Span s) {
    MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    Posted posted(r, 2, Posted::sends);
    post_send(c, peer, s, 0, r);
    wait_all(2, r, "MPI_Waitall");
  }
  // True when the payload arrived and everyone so far agrees: it may be used.
  bool recv(MPI_Comm c, int peer, Span into) {
    MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    Posted posted(r, 2, Posted::receives);
    post_recv(c, peer, into, r);
    return finish_recv(c, peer, into, r) && agreed();
  }
  bool sendrecv(MPI_Comm c, int peer, Span s, Span into) {
    MPI_Request r[4] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    Posted receives(r, 2, Posted::receives), sends(r + 2, 2, Posted::sends);
    post_recv(c, peer, into, r);
    post_send(c, peer, s, into.n, r + 2);
    bool same = finish_recv(c, peer, into, r);
    wait_all(2, r + 2, "MPI_Waitall");
    if (!same || in().expect_bytes != s.n) {
      // A size differed in one direction or both, which both sides see. Meet once more before
      // returning, so that the peer cannot reach its next call, whose payload a receive not
      // yet cancelled could take.
      mpi_check(PMPI_Sendrecv(nullptr, 0, MPI_BYTE, peer, kTag, nullptr, 0, MPI_BYTE, peer, kTag, c,
                              MPI_STATUS_IGNORE),
                "MPI_Sendrecv");
    }
    return same && agreed();
  }
};

// Where a gather's blocks lie in `base`, B bytes each: unit u's (a rank's, or on two levels a
// node's) from block first[u] on (first null: block shift + u), for u up to the group's size.
// For a sum, B is the elements it carries (0: headers alone, a lane that does not carry them).
struct Blocks {
  char* base = nullptr;
  size_t B = 0;
  const int* first = nullptr;
  int shift = 0;
  char* at(int u) const { return base + size_t(first ? first[u] : shift + u) * B; }
  Span units(int lo, int hi) const { return Span{at(lo), size_t(at(hi) - at(lo))}; }
};

// Recursive doubling among `size` ranks of c, this one `r`: sums, gathers or headers alone.
void doubling(Exchange& ex, MPI_Comm c, int r, int size, const Blocks& blk);
// Recursive halving among `size` ranks of c: a reduce-scatter (Payload::halve).
void halving(Exchange& ex, MPI_Comm c, int r, int size);
// The agreement on nodes of several ranks: inside each node, between nodes, down each node.
void two_levels(Exchange& ex, const CommInfo& ci, const NodeLayout& L);

}  // namespace agreement
}  // namespace mpicomp
