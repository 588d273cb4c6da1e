#include "handshake.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "deadline.h"
#include "mpi_count.h"
#include "mpi_util.h"
#include "scratch.h"
#include "stages.h"
#include "topology.h"

namespace mpicomp {
namespace {

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

// Per-thread scratch, kept between calls: an agreement allocates only when a payload grows.
char* scratch(int which, size_t bytes) {
  thread_local Scratch b[5];
  return b[which].get(bytes);
}

void wait(MPI_Request* r, const char* what) { wait_all(1, r, what); }

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
size_t rest(size_t bytes, int peer) {
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

// The ranks of recursive doubling and halving, as MPICH's: of `size` ranks the first 2 * rem
// pair up, the odd one of each pair handing its data to the even one and sitting out the
// rounds among the pof2 that remain, numbered 0 .. pof2-1 (newranks).
struct Newranks {
  int pof2 = 1, rem = 0, nr = -1;  // nr: this rank's newrank; -1: it sits out
  Newranks(int r, int size) {
    while (pof2 * 2 <= size) pof2 *= 2;
    rem = size - pof2;
    nr = r < 2 * rem ? (r % 2 ? -1 : r / 2) : r - rem;
  }
  // Newrank k's rank, which is also the first of the ranks' units it holds (rank(pof2): size).
  int rank(int k) const { return k < rem ? 2 * k : k + rem; }
};

// Recursive doubling among `size` ranks of c, this one `r` (as MPICH's allreduce): the first
// 2 * rem ranks pair up, the odd one handing its data to the even one, the pof2 that remain
// exchange with partners at distance 1, 2, 4, ..., and the even ranks hand the result back.
// Sums exchange the whole vector each round; a gather exchanges the blocks it holds, which
// are always a contiguous run of units, received straight into place.
void doubling(Exchange& ex, MPI_Comm c, int r, int size, const Blocks& blk) {
  const Newranks n(r, size);
  const int pof2 = n.pof2, rem = n.rem, nr = n.nr;
  const bool gather = ex.data.kind == Payload::gather;
  const size_t bytes = gather ? 0 : blk.B * ex.elem;  // a sum's (blk.B elements; none: headers alone)
  char* tmp = gather ? nullptr : scratch(0, bytes);
  auto held = [&](int lo, int k) { return blk.units(n.rank(lo), n.rank(std::min(lo + k, pof2))); };
  auto whole = [&] { return Span{const_cast<char*>(ex.src), bytes}; };  // a sum's
  if (r < 2 * rem) {
    if (r % 2)
      ex.send(c, r - 1, gather ? blk.units(r, r + 1) : whole());
    else if (gather)
      ex.recv(c, r + 1, blk.units(r + 1, r + 2));
    else if (ex.recv(c, r + 1, Span{tmp, bytes}))
      ex.add(0, tmp, bytes);
  }
  for (int mask = 1; nr >= 0 && mask < pof2; mask <<= 1) {
    const int pn = nr ^ mask, peer = n.rank(pn);
    if (gather) {
      ex.sendrecv(c, peer, held(nr & ~(mask - 1), mask), held(pn & ~(mask - 1), mask));
    } else if (ex.sendrecv(c, peer, whole(), Span{tmp, bytes})) {
      ex.add(0, tmp, bytes);
    }
  }
  if (r < 2 * rem) {
    Span result = gather ? blk.units(0, size) : Span{ex.data.out, bytes};
    if (r % 2 == 0) {
      ex.send(c, r + 1, result);
    } else {
      ex.recv(c, r - 1, result);  // straight into place
      ex.src = static_cast<const char*>(ex.data.out);  // what this rank sends on (two_levels)
    }
  }
}

// Where the copies of a payload that a node's other lanes would send reach this many bytes,
// it crosses between nodes once per node (two_levels): below, the extra round inside the node
// costs more than those copies take on the link. Bench/netem's 2 nodes of 2, uncompressed
// allreduce: at 1 Gbit/s 32 KiB took 558 us in every lane and 283-380 us in one, 16 KiB 285
// and 234-271 us; at 10 Gbit/s, where a round inside these emulated nodes (TCP on 2 shared
// cores) costs more than the link saves, 16-32 KiB took 184-301 and 241-366 us.
constexpr size_t kOneLaneBytes = 16 * 1024;

// On nodes of several ranks, in up to three phases, as MPI libraries' node-aware small
// allreduces go (Open MPI's HAN, MPICH's compositions): (1) each node's ranks by recursive
// doubling among themselves; (2) the ranks with the same index on every node (a lane), among
// themselves: each then holds everything; (3) the node's first rank hands the outcome down
// its node in a binomial tree, to the ranks that need it. On two levels (not Config::hierarchy
// flat, nor codec auto's flat path), a payload whose other lanes' copies come to kOneLaneBytes
// crosses in lane 0 only, the other lanes exchanging their headers alone, and all of the
// node's ranks need phase 3: one copy per node on the network card instead of one per lane.
// Others (the agreement alone included) cross in every lane, and only the ranks beyond the
// smallest node's size (no lane) need phase 3: two phases, as doubling over all ranks.
// Which ranks need phase 3 follows from what the node agreed in phase 1, so its ranks decide
// alike: where they disagree, all of them take phase 3. A gather collects the blocks in node
// order (node 0's ranks, then node 1's, ...): in place where that is rank order, else in
// scratch, put in rank order at the end.
void two_levels(Exchange& ex, const CommInfo& ci, const NodeLayout& L) {
  const std::vector<int>& first = L.node_first;
  const bool gather = ex.data.kind == Payload::gather;
  const size_t B = ex.data.count;
  char* out = static_cast<char*>(ex.data.out);
  char* G = gather && !L.node_ordered ? scratch(4, B * ci.size) : out;
  if (G != out) std::memcpy(G + size_t(first[L.node] + L.local) * B, out + ci.rank * B, B);
  const Span result = gather ? Span{G, B * ci.size} : Span{out, B * ex.elem};

  const int k = L.node_size[L.node];
  Links inside(false);
  doubling(ex, L.intra, L.local, k, Blocks{G, B, nullptr, first[L.node]});
  const bool one_lane = !ex.mine.sig.flat && size_t(L.lanes - 1) * result.n >= kOneLaneBytes;
  const bool node_agreed = ex.agreed();
  if (L.local < L.lanes) {
    Links across(true);
    const bool header_only = one_lane && L.local > 0;
    doubling(ex, L.inter, L.node, L.nodes, Blocks{G, header_only ? 0 : B, first.data(), 0});
  }
  auto needs = [&](int local) { return local >= L.lanes || one_lane || !node_agreed; };
  int mask = 1;
  while (mask < k) mask <<= 1;
  for (mask >>= 1; mask >= 1; mask >>= 1) {
    if (L.local % (2 * mask) == 0 && L.local + mask < k && needs(L.local + mask))
      ex.send(L.intra, L.local + mask, result);
    else if (L.local % (2 * mask) == mask && needs(L.local))
      ex.recv(L.intra, L.local - mask, result);
  }
  if (G != out)
    for (int at = 0; at < ci.size; ++at) std::memcpy(out + L.order[at] * B, G + at * B, B);
}

// A reduce-scatter by recursive halving (MPICH's for commutative operations): the first 2 * rem
// ranks pair up as in doubling(), the odd one handing its vector to the even one; then each of
// the pof2 that remain sends its partner, at distance pof2 / 2, pof2 / 4, ..., 1, the half of
// the parts it still holds that the partner keeps, and adds in what it receives: about one
// vector in all, where recursive doubling sends the whole one each round. 4 ranks, codec
// none, one run each: on shared memory 16 KiB took 19 us against 51 us, 32 KiB 44 against 53
// (MPI_Reduce_scatter_block 29-33 and 50-59 us); flat over bench/netem's 2 nodes of 2 at
// 10 Gbit/s, 16 KiB 153 against 186 us.
// The headers meet as in doubling(): every rank's reaches every rank. On two ranks it is the
// single exchange MPI's reduce-scatter makes: half the vector each way.
void halving(Exchange& ex, MPI_Comm c, int r, int size) {
  const Newranks n(r, size);
  const int pof2 = n.pof2, rem = n.rem, nr = n.nr;
  const size_t part = ex.data.count / size * ex.elem, whole = ex.data.count * ex.elem;
  auto first = [&](int k) { return size_t(n.rank(k)); };  // a newrank's first part
  if (r < 2 * rem) {
    char* tmp = r % 2 ? nullptr : scratch(0, whole);
    if (r % 2)
      ex.send(c, r - 1, Span{const_cast<char*>(ex.src), whole});
    else if (ex.recv(c, r + 1, Span{tmp, whole}))
      ex.add(0, tmp, whole);
  }
  for (int lo = 0, mask = pof2 / 2; nr >= 0 && mask >= 1; mask >>= 1) {
    const int pn = nr ^ mask, peer = n.rank(pn);
    const int keep = nr & mask ? lo + mask : lo, give = nr & mask ? lo : lo + mask;
    const size_t at = first(keep) * part, bytes = (first(keep + mask) - first(keep)) * part;
    const size_t from = first(give) * part, sent = (first(give + mask) - first(give)) * part;
    char* tmp = scratch(0, bytes);  // the halves shrink: one buffer serves every round
    if (ex.sendrecv(c, peer, Span{const_cast<char*>(ex.src) + from, sent}, Span{tmp, bytes})) ex.add(at, tmp, bytes);
    lo = keep;
  }
  if (r < 2 * rem) {  // the even rank holds its odd partner's part too
    char* out = static_cast<char*>(ex.data.out);
    if (r % 2 == 0)
      ex.send(c, r + 1, Span{out + size_t(r + 1) * part, part});
    else
      ex.recv(c, r - 1, Span{out + size_t(r) * part, part});
  }
}

}  // namespace

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
