#include "stages.h"

#include <algorithm>
#include <cstring>

#include "deadline.h"
#include "mpi_count.h"

namespace mpicomp {
namespace {

constexpr int kTagRS = 0x6d64, kTagAG = 0x6d65;

size_t nsegs(size_t len, size_t seg) { return (len + seg - 1) / seg; }
size_t seg_len(size_t len, size_t seg, size_t k) { return std::min(seg, len - k * seg); }
template <class T>
const T* at(const void* p, size_t bytes) { return reinterpret_cast<const T*>(static_cast<const char*>(p) + bytes); }
template <class T>
T* at(void* p, size_t bytes) { return reinterpret_cast<T*>(static_cast<char*>(p) + bytes); }

thread_local Sent t_sent;
thread_local const Links* t_links = nullptr;

void isend(const void* buf, size_t bytes, int peer, int tag, MPI_Comm c, std::vector<MPI_Request>& reqs) {
  t_sent.bytes += bytes;
  note_sent(bytes, peer);
  reqs.emplace_back();
  mpic::isend_bytes(buf, bytes, peer, tag, c, &reqs.back());
}
void irecv(void* buf, size_t bytes, int peer, int tag, MPI_Comm c, MPI_Request* req) {
  mpic::irecv_bytes(buf, bytes, peer, tag, c, req);
}
void waitall(std::vector<MPI_Request>& reqs) { wait_all(int(reqs.size()), reqs.data(), "MPI_Waitall"); }

}  // namespace

void note_sent(size_t bytes, int peer) {
  if (t_links) (crosses_nodes(peer) ? t_sent.inter : t_sent.intra) += bytes;
}

bool crosses_nodes(int peer) { return t_links && t_links->between(peer); }

Sent take_sent_bytes() {
  Sent b = t_sent;
  t_sent = Sent{};
  return b;
}

Links::Links(const NodeLayout& layout) : layout_(&layout), outer_(t_links) { t_links = this; }
Links::Links(bool between_nodes) : between_(between_nodes), outer_(t_links) { t_links = this; }
Links::~Links() { t_links = outer_; }

Layout equal_layout(int size, size_t k, size_t seg) {
  Layout L{std::vector<size_t>(size + 1), std::max<size_t>(seg, 1)};
  for (int j = 0; j <= size; ++j) L.off[j] = k * size_t(j);
  return L;
}

Layout balanced_layout(int size, size_t n, size_t granule, size_t seg) {
  Layout L{std::vector<size_t>(size + 1), std::max<size_t>(seg, 1)};
  size_t blocks = (n + granule - 1) / granule;
  for (int j = 0; j <= size; ++j) L.off[j] = std::min(n, blocks * size_t(j) / size_t(size) * granule);
  return L;
}

size_t segment_elems(Spec s, DType t, size_t segment_bytes) {
  size_t g = is_blockwise(s.id) ? s.block : is_lossless(s.id) ? kChunkBytes / dtype_size(t) : kLanes;
  size_t n = std::max(g, segment_bytes / dtype_size(t) / g * g);
  if (is_lossless(s.id)) return n;
  // A codec that compresses more than kWireFraction-fold takes longer segments, so that each
  // message still carries segment_bytes / kWireFraction on the wire: a message costs a
  // latency whatever its size, and sign's 18 KiB from 512 KiB paid it once per tile (10
  // Gbit/s, 2 ranks, 16 MiB allreduce: 2.4 ms in tiles of 512 KiB, 1.8-2.0 ms of 2 MiB;
  // docs/measurements.md). int8, int4 and the 16-bit codecs keep segment_bytes.
  size_t min_wire = segment_bytes / kWireFraction, per_g = encoded_bytes(s, t, g);
  return std::max(n, (min_wire + per_g - 1) / per_g * g);
}

ReducedPart reduced_part(Engine& e, Spec wire, DType t, DType sum_t, void* acc, size_t len, float* res, void* mine,
                         double scale) {
  ReducedPart p{wire, sum_t, acc, res, float(scale)};
  if (wire.id == CodecId::none && t == DType::f16) p.out = Spec{CodecId::fp16, 0};
  if (wire.id == CodecId::none && t == DType::bf16) p.out = Spec{CodecId::bf16, 0};
  if (is_lossless(wire.id)) {
    e.store(sum_t, acc, len, scale, t, mine);
    p.st = t, p.src = mine, p.res = nullptr, p.scale = 1.f;
  } else if (p.out.id != wire.id && scale != 1.0) {
    // Divide before the one rounding to the output dtype, or an average is rounded twice
    // (the sum to fp16/bf16, then the quotient).
    e.store(sum_t, acc, len, scale, sum_t, acc);
    p.scale = 1.f;
  }
  return p;
}

void check_frames(MPI_Comm c, const CommInfo& ci, const FrameDamage& d) {
  // The highest rank that met damage, + 1 (0: none).
  const int first = allreduce_one(c, d.source < 0 ? 0 : ci.rank + 1, MPI_INT, MPI_MAX);
  if (!first) return;
  if (d.source >= 0)
    throw Error(ErrorKind::codec, "rank " + std::to_string(ci.rank) + " received a corrupt frame from rank " +
                                      std::to_string(d.source) + " (" + d.what + "); the call failed on every rank");
  throw Error(ErrorKind::codec, "rank " + std::to_string(first - 1) +
                                    " received a corrupt lossless frame; the call failed on every rank");
}

ReduceScatterStage::ReduceScatterStage(MPI_Comm c, const CommInfo& ci, Engine& e, Spec s, DType t, const Layout& L,
                                       const void* x, float* res, DType sum_t, void* acc, FrameDamage& damage, int slot)
    : r_(ci.rank), p_(ci.size), e_(e), s_(s), t_(t), L_(L), sum_t_(sum_t), acc_(static_cast<char*>(acc)),
      damage_(damage), my_len_(L.len(ci.rank)),
      my_enc_(part_bytes(s, t, my_len_, L.seg)) {
  const int r = r_, p = p_;
  const size_t dts = dtype_size(t), nin = nsegs(my_len_, L.seg);

  // Receives, posted in the order they are consumed: segment by segment, peers r-1, r-2, ...
  rbuf_ = e.wire(slot, my_enc_ * size_t(p - 1));
  rreq_.resize(nin * size_t(p - 1));
  for (size_t k = 0; k < nin; ++k)
    for (int d = 1; d < p; ++d)
      irecv(rbuf_ + size_t(d - 1) * my_enc_ + segment_offset(s, t, L.seg, k),
            encoded_bytes(s, t, seg_len(my_len_, L.seg, k)), (r - d + p) % p, kTagRS, c, &rreq_[k * (p - 1) + d - 1]);

  // Input of the sums' own dtype (float32; float64 on an exact wire) without a residual is
  // not copied into acc first: the first peer's decode adds its part onto x's (x + decoded,
  // the same sum in one pass less). Alone (a node of one rank in a two-level call) there is
  // no peer to do it.
  const char* mine = at<char>(x, L.pos(r) * dts);
  own_ = t == sum_t && !res && p > 1 ? mine : nullptr;
  if (!own_ && my_len_) e.load(t, mine, my_len_, res ? res + L.pos(r) : nullptr, sum_t, acc);  // none: a rank past the lanes

  // Exact parts that MPI can read where they lie are sent from x (Engine::mpi_takes_buffers).
  const bool raw = s.id == CodecId::none && !res && e.mpi_takes_buffers();
  size_t send_bytes = 0;
  for (int d = 1; d < p && !raw; ++d) send_bytes += part_bytes(s, t, L.len((r + d) % p), L.seg);
  uint8_t* sbuf = raw ? nullptr : e.wire(slot + 1, send_bytes);
  size_t spos = 0;
  for (int d = 1; d < p; ++d) {
    int dst = (r + d) % p;
    size_t len = L.len(dst);
    for (size_t k = 0; k < nsegs(len, L.seg); ++k) {
      size_t n = seg_len(len, L.seg, k), first = L.pos(dst) + k * L.seg;
      const char* from = at<char>(x, first * dts);
      if (raw) {
        isend(from, n * dts, dst, kTagRS, c, sreq_);
      } else {
        uint8_t* w = sbuf + spos + segment_offset(s, t, L.seg, k);
        isend(w, e.encode(s, t, from, n, res ? res + first : nullptr, w), dst, kTagRS, c, sreq_);
      }
      consume(false);
    }
    spos += part_bytes(s, t, len, L.seg);
  }
}

void ReduceScatterStage::consume(bool block) {
  while (next_ < rreq_.size()) {
    int done = 1;
    if (block)
      wait_all(1, &rreq_[next_], "MPI_Wait");
    else
      mpi_check(PMPI_Test(&rreq_[next_], &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (!done) return;
    size_t k = next_ / (p_ - 1), d = next_ % (p_ - 1);
    damage_.guard((r_ - int(d) - 1 + p_) % p_, [&] {
      const size_t skip = k * L_.seg * dtype_size(sum_t_);  // segment k's place in acc and in own
      e_.decode_accumulate(s_, t_, rbuf_ + d * my_enc_ + segment_offset(s_, t_, L_.seg, k), seg_len(my_len_, L_.seg, k),
                           sum_t_, acc_ + skip, own_ && d == 0 ? own_ + skip : nullptr);
    });
    ++next_;
  }
}

void ReduceScatterStage::finish() {
  consume(true);
  waitall(sreq_);
}

AllgatherStage::AllgatherStage(MPI_Comm c, const CommInfo& ci, Engine& e, Spec s, DType st, const Layout& L,
                               const void* src, float* res, DType yt, void* y, float scale, bool stream,
                               FrameDamage& damage, int slot)
    : r_(ci.rank), p_(ci.size), e_(e), s_(s), st_(st), yt_(yt), L_(L), y_(y), scale_(scale), stream_(stream),
      damage_(damage), raw_(s.id == CodecId::none && st == yt && scale == 1.f && !res && e.mpi_takes_buffers()),
      src_(src), rpos_(ci.size + 1, 0) {
  const int r = r_, p = p_;
  const size_t sts = dtype_size(st);

  // One receive per (peer, segment); exact parts that MPI can write where they belong
  // (Engine::mpi_takes_buffers) land there, with nothing to decode.
  for (int j = 0; j < p && !raw_; ++j) rpos_[j + 1] = rpos_[j] + (j == r ? 0 : part_bytes(s, st, L.len(j), L.seg));
  rbuf_ = raw_ ? nullptr : e.wire(slot, rpos_[p]);
  for (int j = 0; j < p; ++j) {
    if (j == r) continue;
    for (size_t k = 0; k < nsegs(L.len(j), L.seg); ++k) {
      rreq_.emplace_back();
      which_.emplace_back(j, k);
      const size_t n = seg_len(L.len(j), L.seg, k);
      void* into = raw_ ? at<char>(y, (L.pos(j) + k * L.seg) * sts)
                        : static_cast<void*>(rbuf_ + rpos_[j] + segment_offset(s, st, L.seg, k));
      irecv(into, encoded_bytes(s, st, n), j, kTagAG, c, &rreq_.back());
    }
  }
  idx_.resize(rreq_.size());
  left_ = rreq_.size();

  const size_t my_len = L.len(r);
  sbuf_ = raw_ ? nullptr : e.wire(slot + 1, part_bytes(s, st, my_len, L.seg));
  for (size_t k = 0; k < nsegs(my_len, L.seg); ++k) {
    size_t n = seg_len(my_len, L.seg, k), o = segment_offset(s, st, L.seg, k);
    const char* from = at<char>(src, k * L.seg * sts);
    const void* w = raw_ ? static_cast<const void*>(from) : sbuf_ + o;
    size_t bytes = raw_ ? n * sts : e.encode(s, st, from, n, res ? res + k * L.seg : nullptr, sbuf_ + o);
    for (int d = 1; d < p; ++d) isend(w, bytes, (r + d) % p, kTagAG, c, sreq_);
    consume(false);
  }
}

void AllgatherStage::decode_part(const uint8_t* part, int j, size_t k) {
  size_t first = L_.pos(j) + k * L_.seg;
  damage_.guard(j, [&] {
    e_.decode(s_, yt_, part + segment_offset(s_, st_, L_.seg, k), seg_len(L_.len(j), L_.seg, k), scale_,
              at<char>(y_, first * dtype_size(yt_)), stream_);
  });
}

void AllgatherStage::consume(bool block) {
  while (left_ > 0) {
    int count = 0;
    if (block)
      count = wait_some(int(rreq_.size()), rreq_.data(), idx_.data(), "MPI_Waitsome");
    else
      mpi_check(PMPI_Testsome(int(rreq_.size()), rreq_.data(), &count, idx_.data(), MPI_STATUSES_IGNORE),
                "MPI_Testsome");
    if (count == MPI_UNDEFINED || count == 0) return;
    for (int i = 0; i < count && !raw_; ++i) {
      auto [j, k] = which_[idx_[i]];
      decode_part(rbuf_ + rpos_[j], j, k);
    }
    left_ -= size_t(count);
  }
}

void AllgatherStage::finish() {
  // The own part is decoded here, not when it is sent: an allreduce has started the next
  // tile's reduce-scatter by now, whose messages travel meanwhile.
  char* own = at<char>(y_, L_.pos(r_) * dtype_size(yt_));
  if (!raw_)
    for (size_t k = 0; k < nsegs(L_.len(r_), L_.seg); ++k) decode_part(sbuf_, r_, k);
  else if (src_ != own)
    std::memcpy(own, src_, L_.len(r_) * dtype_size(yt_));
  consume(true);
  waitall(sreq_);
}

}  // namespace mpicomp
