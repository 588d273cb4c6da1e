// Compressed send / recv. The first message is a header with the sender's signature and
// segment length, on the caller's communicator and tag: matching (MPI_ANY_SOURCE,
// MPI_ANY_TAG, the order of messages between two ranks) is exactly MPI's. The payload follows
// in segments, each sent as soon as it is encoded, on a communicator private to the pair of
// ranks and under a tag the header names, so that no other message can take a segment's
// place: not the user's own traffic, not another mpicomp message between the same two ranks
// sent from another thread. A receiver that expected something else still takes every
// segment the header announces (the sender's messages are all matched) before it raises, so
// the pair stays usable. Uncompressed messages up to Config::eager_bytes travel inside the
// header message instead: one message, one latency, as MPI_Send's own eager protocol.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "../codecs/bound.h"
#include "budget.h"
#include "coll.h"
#include "config.h"
#include "deadline.h"
#include "mpi_count.h"
#include "scratch.h"
#include "stages.h"
#include "stats.h"

namespace mpicomp {
namespace {

constexpr uint32_t kMagic = 0x4d503251;
constexpr int kPairTag = 0x6d67;  // MPI_Comm_create_group's

struct Header {
  uint32_t magic;
  int32_t rank;
  uint64_t seg;
  uint32_t channel;  // the payload's tag on the pair's communicator
  uint32_t reserved;
  Signature sig;
};

// The communicators of the pairs a rank has exchanged payloads with, kept as an attribute of
// the caller's communicator and freed with it. Each is made by MPI_Comm_create_group, a
// collective of the two ranks alone, the first time a payload goes between them: the sender
// makes it after its header went out, the receiver after it took that header. One mutex per
// peer: two threads of a rank never make the same pair twice (the peer would pair their calls
// up the other way round and keep a different communicator).
struct Pairs {
  struct Entry {
    std::mutex m;
    MPI_Comm comm = MPI_COMM_NULL;
  };
  std::mutex m;
  std::map<int, std::unique_ptr<Entry>> by_peer;
};

int free_pairs(MPI_Comm, int, void* value, void*) {
  auto* pairs = static_cast<Pairs*>(value);
  for (auto& [peer, e] : pairs->by_peer)
    if (e->comm != MPI_COMM_NULL) PMPI_Comm_free(&e->comm);
  delete pairs;
  return MPI_SUCCESS;
}

Pairs& pairs_of(MPI_Comm comm) {
  static Keyval key(free_pairs);
  static std::mutex m;  // two threads' first calls on comm make one Pairs
  const int keyval = key.get();
  std::lock_guard<std::mutex> g(m);
  void* value = nullptr;
  int found = 0;
  mpi_check(PMPI_Comm_get_attr(comm, keyval, &value, &found), "MPI_Comm_get_attr");
  if (!found) {
    value = new Pairs;
    mpi_check(PMPI_Comm_set_attr(comm, keyval, value), "MPI_Comm_set_attr");
  }
  return *static_cast<Pairs*>(value);
}

struct Pair {
  MPI_Comm comm;
  int peer;  // its rank there
};

Pair pair_of(MPI_Comm comm, int me, int peer) {
  Pairs& pairs = pairs_of(comm);
  Pairs::Entry* e;
  {
    std::lock_guard<std::mutex> g(pairs.m);
    auto& slot = pairs.by_peer[peer];
    if (!slot) slot = std::make_unique<Pairs::Entry>();
    e = slot.get();
  }
  std::lock_guard<std::mutex> g(e->m);
  if (e->comm == MPI_COMM_NULL) {
    MPI_Group all, two;
    int ranks[2] = {std::min(me, peer), std::max(me, peer)};
    mpi_check(PMPI_Comm_group(comm, &all), "MPI_Comm_group");
    mpi_check(PMPI_Group_incl(all, me == peer ? 1 : 2, ranks, &two), "MPI_Group_incl");
    int rc = PMPI_Comm_create_group(comm, two, kPairTag, &e->comm);
    PMPI_Group_free(&two);
    PMPI_Group_free(&all);
    mpi_check(rc, "MPI_Comm_create_group");
    mpi_check(PMPI_Comm_set_errhandler(e->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  }
  return Pair{e->comm, peer > me ? 1 : 0};
}

// A tag for each payload a rank sends: distinct among its messages in flight to one peer
// (MPI guarantees tags up to 32767).
uint32_t next_channel() {
  static std::atomic<uint32_t> n{0};
  return n.fetch_add(1, std::memory_order_relaxed) % 32767;
}

Signature p2p_signature(const CollArgs& a, const Config& cfg) {
  Signature s;
  s.coll = Coll::send;
  s.count = a.count;
  s.codec = a.spec.id;
  s.block = is_blockwise(a.spec.id) || a.spec.id == CodecId::bound ? a.spec.block : 0;
  s.dtype = a.dtype;
  size_t bytes = a.count * dtype_size(a.dtype);
  s.wire = bytes < cfg.min_bytes ? CodecId::none : a.spec.id;
  s.eager = s.wire == CodecId::none && !a.engine && bytes <= cfg.eager_bytes;
  return s;
}

// The header message's buffer, with room for an eager payload.
char* message(size_t payload) {
  thread_local Scratch b;
  return b.get(sizeof(Header) + payload);
}

size_t nsegs(size_t n, size_t seg) { return (n + seg - 1) / seg; }

}  // namespace

void send(MPI_Comm comm, const void* x, int dest, int tag, const CollArgs& a) {
  Config cfg = config();
  cfg.timeout_s = timeout_of(comm, cfg.timeout_s);
  // Not marked when it times out: its requests are cancelled, the communicator stays usable.
  CallScope scope(cfg);
  const auto t0 = std::chrono::steady_clock::now();
  Header h{kMagic, 0, 0, 0, 0, p2p_signature(a, cfg)};
  std::optional<Skip> skip;
  if (a.spec.id == CodecId::none)
    skip = Skip::codec_none;
  else if (h.sig.wire == CodecId::none)
    skip = Skip::small;
  size_t sent = 0;
  auto record = [&] {
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_record(Coll::send, 2, a.count * dtype_size(a.dtype), Sent{sent}, Algo::flat, dt, skip ? &*skip : nullptr);
  };
  mpi_check(PMPI_Comm_rank(comm, &h.rank), "MPI_Comm_rank");
  Spec wire{h.sig.wire, a.spec.block};
  if (wire.id == CodecId::bound) {
    // The bound of one encoding: relative to the message's largest magnitude. One that
    // cannot be kept fails here, and the receiver, told so, fails too.
    try {
      if (a.engine) throw Error(ErrorKind::backend, "codec bound runs on host buffers only");
      const double top = finite_absmax(a.dtype, x, a.count), asked = bound_value(wire.block);
      wire = bound_stage(wire, a.dtype, bound_relative(wire.block) ? asked * top : asked, top, 1.0, 1);
    } catch (const Error&) {
      h.sig.invalid = 1;
      mpi_check(PMPI_Send(&h, int(sizeof h), MPI_BYTE, dest, tag, comm), "MPI_Send");
      throw;
    }
  }
  const size_t bytes = a.count * dtype_size(a.dtype);
  const size_t attached = h.sig.eager ? bytes : 0;
  if (!h.sig.eager) {
    h.seg = segment_elems(wire, a.dtype, cfg.segment_bytes);
    h.channel = next_channel();
  }
  char* m = message(attached);
  std::memcpy(m, &h, sizeof h);
  if (attached) std::memcpy(m + sizeof h, x, attached);
  MPI_Request head = MPI_REQUEST_NULL;
  Posted posted_head(&head, 1, Posted::sends);
  mpi_check(PMPI_Isend(m, int(sizeof h + attached), MPI_BYTE, dest, tag, comm, &head), "MPI_Isend");
  wait_all(1, &head, "MPI_Wait");
  if (h.sig.eager) return record();

  Pair pair = pair_of(comm, h.rank, dest);
  Engine& e = a.engine ? *a.engine : cpu_engine();
  const size_t dts = dtype_size(a.dtype);
  // Uncompressed host data goes out from the caller's buffer as it is.
  bool direct = wire.id == CodecId::none && !a.engine;
  uint8_t* buf = direct ? nullptr : e.wire(1, part_bytes(wire, a.dtype, a.count, h.seg));
  std::vector<MPI_Request> reqs(nsegs(a.count, h.seg), MPI_REQUEST_NULL);
  Posted posted(reqs, Posted::sends);
  for (size_t k = 0; k < reqs.size(); ++k) {
    size_t first = k * h.seg, n = std::min<size_t>(h.seg, a.count - first);
    size_t off = segment_offset(wire, a.dtype, h.seg, k), seg_bytes = n * dts;
    const void* src = static_cast<const char*>(x) + first * dts;
    if (!direct) {
      seg_bytes = e.encode(wire, a.dtype, src, n, a.residual ? a.residual + first : nullptr, buf + off);
      src = buf + off;
    }
    sent += seg_bytes;
    mpic::isend_bytes(src, seg_bytes, pair.peer, int(h.channel), pair.comm, &reqs[k]);
  }
  wait_all(int(reqs.size()), reqs.data(), "MPI_Waitall");
  record();
}

void recv(MPI_Comm comm, void* y, int source, int tag, const CollArgs& a) {
  Config cfg = config();
  cfg.timeout_s = timeout_of(comm, cfg.timeout_s);
  // Not marked when it times out: its requests are cancelled, the communicator stays usable.
  CallScope scope(cfg);
  // Room for the largest eager payload any sender may attach (all ranks share the config).
  const int room = int(sizeof(Header) + cfg.eager_bytes);
  char* m = message(cfg.eager_bytes);
  MPI_Request head = MPI_REQUEST_NULL;
  Posted posted_head(&head, 1, Posted::receives);
  mpi_check(PMPI_Irecv(m, room, MPI_BYTE, source, tag, comm, &head), "MPI_Irecv");
  MPI_Status st;
  wait_one(&head, &st, "MPI_Wait");
  Header h;
  std::memcpy(&h, m, sizeof h);
  source = st.MPI_SOURCE;
  Signature mine = p2p_signature(a, cfg);
  Spec wire{h.sig.wire, h.sig.block ? h.sig.block : a.spec.block};
  if (h.magic != kMagic) throw Error(ErrorKind::shape_mismatch, "recv: the message from rank " + std::to_string(source) +
                                                                    " was not sent by mpicomp.send");
  int me = 0;
  mpi_check(PMPI_Comm_rank(comm, &me), "MPI_Comm_rank");
  if (h.sig.invalid)
    throw Error(ErrorKind::shape_mismatch, "recv: rank " + std::to_string(h.rank) +
                                               " rejected its own send (an error there says why); nothing was sent");
  if (!(h.sig == mine)) {
    if (!h.sig.eager) {
      Pair pair = pair_of(comm, me, source);
      std::vector<uint8_t> sink;
      for (size_t k = 0; k < nsegs(h.sig.count, h.seg); ++k) {
        size_t n = std::min<size_t>(h.seg, h.sig.count - k * h.seg);
        sink.resize(encoded_bytes(wire, h.sig.dtype, n));
        mpic::recv_bytes(sink.data(), sink.size(), pair.peer, int(h.channel), pair.comm);
      }
    }
    throw Error(ErrorKind::shape_mismatch, "recv: rank " + std::to_string(h.rank) + " sent " + describe(h.sig) +
                                               ", but this rank expects " + describe(mine));
  }
  const size_t dts = dtype_size(a.dtype);
  if (h.sig.eager) {
    if (a.count) std::memcpy(y, m + sizeof h, a.count * dts);
    return;
  }
  Pair pair = pair_of(comm, me, source);
  Engine& e = a.engine ? *a.engine : cpu_engine();
  bool direct = wire.id == CodecId::none && !a.engine;
  uint8_t* buf = direct ? static_cast<uint8_t*>(y) : e.wire(0, part_bytes(wire, a.dtype, a.count, h.seg));
  std::vector<MPI_Request> reqs(nsegs(a.count, h.seg), MPI_REQUEST_NULL);
  Posted posted(reqs, Posted::receives);
  for (size_t k = 0; k < reqs.size(); ++k) {
    size_t first = k * h.seg, n = std::min<size_t>(h.seg, a.count - first);
    mpic::irecv_bytes(buf + segment_offset(wire, a.dtype, h.seg, k), encoded_bytes(wire, a.dtype, n), pair.peer,
                      int(h.channel), pair.comm, &reqs[k]);
  }
  for (size_t done = 0; done < reqs.size(); ++done) {
    int k = wait_any(int(reqs.size()), reqs.data(), "MPI_Waitany");
    if (direct) continue;
    size_t first = size_t(k) * h.seg, n = std::min<size_t>(h.seg, a.count - first);
    e.decode(wire, a.dtype, buf + segment_offset(wire, a.dtype, h.seg, k), n, 1.f, static_cast<char*>(y) + first * dts);
  }
}

}  // namespace mpicomp
