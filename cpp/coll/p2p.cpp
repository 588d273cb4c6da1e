// Compressed send / recv. The first message is a header with the sender's signature and
// segment length; the payload follows in segments, each sent as soon as it is encoded. A
// receiver that expected something else still takes every segment the header announces
// (the sender's messages are all matched) before it raises, so the pair stays usable.
// Uncompressed messages up to Config::eager_bytes travel inside the header message instead:
// one message, one latency, as MPI_Send's own eager protocol.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "coll.h"
#include "config.h"
#include "mpi_count.h"
#include "stages.h"
#include "stats.h"

namespace mpicomp {
namespace {

constexpr uint32_t kMagic = 0x4d503250;

struct Header {
  uint32_t magic;
  int32_t rank;
  uint64_t seg;
  Signature sig;
};

Signature p2p_signature(const CollArgs& a, const Config& cfg) {
  Signature s;
  s.coll = Coll::send;
  s.count = a.count;
  s.codec = a.spec.id;
  s.block = is_blockwise(a.spec.id) ? a.spec.block : 0;
  s.dtype = a.dtype;
  size_t bytes = a.count * dtype_size(a.dtype);
  s.wire = bytes < cfg.min_bytes ? CodecId::none : a.spec.id;
  s.eager = s.wire == CodecId::none && !a.engine && bytes <= cfg.eager_bytes;
  return s;
}

// The header message's buffer, with room for an eager payload.
std::vector<char>& message(size_t payload) {
  thread_local std::vector<char> b;
  if (b.size() < sizeof(Header) + payload) b.resize(sizeof(Header) + payload);
  return b;
}

size_t nsegs(size_t n, size_t seg) { return (n + seg - 1) / seg; }

}  // namespace

void send(MPI_Comm comm, const void* x, int dest, int tag, const CollArgs& a) {
  const Config cfg = config();
  const auto t0 = std::chrono::steady_clock::now();
  Header h{kMagic, 0, 0, p2p_signature(a, cfg)};
  std::optional<Skip> skip;
  if (a.spec.id == CodecId::none)
    skip = Skip::codec_none;
  else if (h.sig.wire == CodecId::none)
    skip = Skip::small;
  size_t sent = 0;
  auto record = [&] {
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_record(Coll::send, 2, a.count * dtype_size(a.dtype), sent, dt, skip ? &*skip : nullptr);
  };
  mpi_check(PMPI_Comm_rank(comm, &h.rank), "MPI_Comm_rank");
  Spec wire{h.sig.wire, a.spec.block};
  if (h.sig.eager) {
    size_t bytes = a.count * dtype_size(a.dtype);
    std::vector<char>& m = message(bytes);
    std::memcpy(m.data(), &h, sizeof h);
    if (bytes) std::memcpy(m.data() + sizeof h, x, bytes);
    mpi_check(PMPI_Send(m.data(), int(sizeof h + bytes), MPI_BYTE, dest, tag, comm), "MPI_Send");
    return record();
  }
  h.seg = segment_elems(wire, a.dtype, cfg.segment_bytes);
  mpi_check(PMPI_Send(&h, sizeof h, MPI_BYTE, dest, tag, comm), "MPI_Send");
  Engine& e = a.engine ? *a.engine : cpu_engine();
  const size_t dts = dtype_size(a.dtype);
  // Uncompressed host data goes out from the caller's buffer as it is.
  bool direct = wire.id == CodecId::none && !a.engine;
  uint8_t* buf = direct ? nullptr : e.wire(1, part_bytes(wire, a.dtype, a.count, h.seg));
  std::vector<MPI_Request> reqs(nsegs(a.count, h.seg));
  for (size_t k = 0; k < reqs.size(); ++k) {
    size_t first = k * h.seg, n = std::min<size_t>(h.seg, a.count - first);
    size_t off = segment_offset(wire, a.dtype, h.seg, k), bytes = n * dts;
    const void* src = static_cast<const char*>(x) + first * dts;
    if (!direct) {
      bytes = e.encode(wire, a.dtype, src, n, a.residual ? a.residual + first : nullptr, buf + off);
      src = buf + off;
    }
    sent += bytes;
    mpic::isend_bytes(src, bytes, dest, tag, comm, &reqs[k]);
  }
  if (!reqs.empty()) mpi_check(PMPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  record();
}

void recv(MPI_Comm comm, void* y, int source, int tag, const CollArgs& a) {
  const Config cfg = config();
  // Room for the largest eager payload any sender may attach (all ranks share the config).
  std::vector<char>& m = message(cfg.eager_bytes);
  MPI_Status st;
  mpi_check(PMPI_Recv(m.data(), int(m.size()), MPI_BYTE, source, tag, comm, &st), "MPI_Recv");
  Header h;
  std::memcpy(&h, m.data(), sizeof h);
  source = st.MPI_SOURCE;
  tag = st.MPI_TAG;
  Signature mine = p2p_signature(a, cfg);
  Spec wire{h.sig.wire, h.sig.block ? h.sig.block : a.spec.block};
  if (h.magic != kMagic) throw Error(ErrorKind::shape_mismatch, "recv: the message from rank " + std::to_string(source) +
                                                                    " was not sent by mpicomp.send");
  if (!(h.sig == mine)) {
    std::vector<uint8_t> sink;
    for (size_t k = 0; !h.sig.eager && k < nsegs(h.sig.count, h.seg); ++k) {
      size_t n = std::min<size_t>(h.seg, h.sig.count - k * h.seg);
      sink.resize(encoded_bytes(wire, h.sig.dtype, n));
      mpic::recv_bytes(sink.data(), sink.size(), source, tag, comm);
    }
    throw Error(ErrorKind::shape_mismatch, "recv: rank " + std::to_string(h.rank) + " sent " + describe(h.sig) +
                                               ", but this rank expects " + describe(mine));
  }
  const size_t dts = dtype_size(a.dtype);
  if (h.sig.eager) {
    if (a.count) std::memcpy(y, m.data() + sizeof h, a.count * dts);
    return;
  }
  Engine& e = a.engine ? *a.engine : cpu_engine();
  bool direct = wire.id == CodecId::none && !a.engine;
  uint8_t* buf = direct ? static_cast<uint8_t*>(y) : e.wire(0, part_bytes(wire, a.dtype, a.count, h.seg));
  std::vector<MPI_Request> reqs(nsegs(a.count, h.seg));
  for (size_t k = 0; k < reqs.size(); ++k) {
    size_t first = k * h.seg, n = std::min<size_t>(h.seg, a.count - first);
    mpic::irecv_bytes(buf + segment_offset(wire, a.dtype, h.seg, k), encoded_bytes(wire, a.dtype, n), source, tag,
                      comm, &reqs[k]);
  }
  for (size_t done = 0; done < reqs.size(); ++done) {
    int k;
    mpi_check(PMPI_Waitany(int(reqs.size()), reqs.data(), &k, MPI_STATUS_IGNORE), "MPI_Waitany");
    if (direct) continue;
    size_t first = size_t(k) * h.seg, n = std::min<size_t>(h.seg, a.count - first);
    e.decode(wire, a.dtype, buf + segment_offset(wire, a.dtype, h.seg, k), n, 1.f, static_cast<char*>(y) + first * dts);
  }
}

}  // namespace mpicomp
