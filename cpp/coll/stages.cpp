#include "stages.h"

#include <algorithm>

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

thread_local size_t t_sent = 0;

void isend(const void* buf, size_t bytes, int peer, int tag, MPI_Comm c, std::vector<MPI_Request>& reqs) {
  t_sent += bytes;
  reqs.emplace_back();
  mpic::isend_bytes(buf, bytes, peer, tag, c, &reqs.back());
}
void irecv(void* buf, size_t bytes, int peer, int tag, MPI_Comm c, MPI_Request* req) {
  mpic::irecv_bytes(buf, bytes, peer, tag, c, req);
}
void waitall(std::vector<MPI_Request>& reqs) { wait_all(int(reqs.size()), reqs.data(), "MPI_Waitall"); }

}  // namespace

size_t take_sent_bytes() {
  size_t b = t_sent;
  t_sent = 0;
  return b;
}

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
  return std::max(g, segment_bytes / dtype_size(t) / g * g);
}

void check_frames(MPI_Comm c, const CommInfo& ci, const FrameDamage& d) {
  int mine = d.source < 0 ? 0 : ci.rank + 1, first = 0;  // the highest rank that met damage, + 1
  mpic::allreduce(&mine, &first, 1, MPI_INT, MPI_MAX, c);
  if (!first) return;
  if (d.source >= 0)
    throw Error(ErrorKind::codec, "rank " + std::to_string(ci.rank) + " received a corrupt frame from rank " +
                                      std::to_string(d.source) + " (" + d.what + "); the call failed on every rank");
  throw Error(ErrorKind::codec, "rank " + std::to_string(first - 1) +
                                    " received a corrupt lossless frame; the call failed on every rank");
}

void reduce_scatter_stage(MPI_Comm c, const CommInfo& ci, Engine& e, Spec s, DType t, const Layout& L, const void* x,
                          float* res, float* acc, FrameDamage& damage) {
  const int r = ci.rank, p = ci.size;
  const size_t dts = dtype_size(t), my_len = L.len(r), my_enc = part_bytes(s, t, my_len, L.seg);
  const size_t nin = nsegs(my_len, L.seg);

  // Receives, posted in the order they are consumed: segment by segment, peers r-1, r-2, ...
  uint8_t* rbuf = e.wire(0, my_enc * size_t(p - 1));
  std::vector<MPI_Request> rreq(nin * size_t(p - 1));
  Posted posted_r(rreq);
  for (size_t k = 0; k < nin; ++k)
    for (int d = 1; d < p; ++d)
      irecv(rbuf + size_t(d - 1) * my_enc + segment_offset(s, t, L.seg, k),
            encoded_bytes(s, t, seg_len(my_len, L.seg, k)), (r - d + p) % p, kTagRS, c, &rreq[k * (p - 1) + d - 1]);

  // float32 input without a residual is not copied into acc first: the first peer's decode
  // adds its part onto x's (x + decoded, the same sum in one pass less).
  const char* mine = at<char>(x, L.off[r] * dts);
  const float* own = t == DType::f32 && !res ? reinterpret_cast<const float*>(mine) : nullptr;
  if (!own) e.load(t, mine, my_len, res ? res + L.off[r] : nullptr, acc);

  size_t next = 0;
  auto consume = [&](bool block) {
    while (next < rreq.size()) {
      int done = 1;
      if (block)
        wait_all(1, &rreq[next], "MPI_Wait");
      else
        mpi_check(PMPI_Test(&rreq[next], &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) return;
      size_t k = next / (p - 1), d = next % (p - 1);
      damage.guard((r - int(d) - 1 + p) % p, [&] {
        e.decode_accumulate(s, t, rbuf + d * my_enc + segment_offset(s, t, L.seg, k), seg_len(my_len, L.seg, k),
                            acc + k * L.seg, own && d == 0 ? own + k * L.seg : nullptr);
      });
      ++next;
    }
  };

  size_t send_bytes = 0;
  for (int d = 1; d < p; ++d) send_bytes += part_bytes(s, t, L.len((r + d) % p), L.seg);
  uint8_t* sbuf = e.wire(1, send_bytes);
  std::vector<MPI_Request> sreq;
  Posted posted_s(sreq);
  size_t spos = 0;
  for (int d = 1; d < p; ++d) {
    int dst = (r + d) % p;
    size_t len = L.len(dst);
    for (size_t k = 0; k < nsegs(len, L.seg); ++k) {
      size_t n = seg_len(len, L.seg, k), first = L.off[dst] + k * L.seg;
      uint8_t* w = sbuf + spos + segment_offset(s, t, L.seg, k);
      isend(w, e.encode(s, t, at<char>(x, first * dts), n, res ? res + first : nullptr, w), dst, kTagRS, c, sreq);
      consume(false);
    }
    spos += part_bytes(s, t, len, L.seg);
  }
  consume(true);
  waitall(sreq);
}

void allgather_stage(MPI_Comm c, const CommInfo& ci, Engine& e, Spec s, DType st, const Layout& L, const void* src,
                     float* res, DType yt, void* y, float scale, bool stream, FrameDamage& damage) {
  const int r = ci.rank, p = ci.size;
  const size_t sts = dtype_size(st), yts = dtype_size(yt);

  // One receive per (peer, segment); part j lands at rpos[j] in the receive buffer.
  std::vector<size_t> rpos(p + 1, 0);
  for (int j = 0; j < p; ++j) rpos[j + 1] = rpos[j] + (j == r ? 0 : part_bytes(s, st, L.len(j), L.seg));
  uint8_t* rbuf = e.wire(0, rpos[p]);
  std::vector<MPI_Request> rreq;
  Posted posted_r(rreq);
  std::vector<std::pair<int, size_t>> which;  // (part, segment) of each receive
  for (int j = 0; j < p; ++j) {
    if (j == r) continue;
    for (size_t k = 0; k < nsegs(L.len(j), L.seg); ++k) {
      rreq.emplace_back();
      which.emplace_back(j, k);
      irecv(rbuf + rpos[j] + segment_offset(s, st, L.seg, k), encoded_bytes(s, st, seg_len(L.len(j), L.seg, k)), j, kTagAG,
            c, &rreq.back());
    }
  }
  auto decode_part = [&](const uint8_t* part, int j, size_t k) {
    size_t first = L.off[j] + k * L.seg;
    damage.guard(j, [&] {
      e.decode(s, yt, part + segment_offset(s, st, L.seg, k), seg_len(L.len(j), L.seg, k), scale,
               at<char>(y, first * yts), stream);
    });
  };
  std::vector<int> idx(rreq.size());
  size_t left = rreq.size();
  auto consume = [&](bool block) {
    while (left > 0) {
      int count = 0;
      if (block)
        count = wait_some(int(rreq.size()), rreq.data(), idx.data(), "MPI_Waitsome");
      else
        mpi_check(PMPI_Testsome(int(rreq.size()), rreq.data(), &count, idx.data(), MPI_STATUSES_IGNORE), "MPI_Testsome");
      if (count == MPI_UNDEFINED || count == 0) return;
      for (int i = 0; i < count; ++i) decode_part(rbuf + rpos[which[idx[i]].first], which[idx[i]].first, which[idx[i]].second);
      left -= size_t(count);
    }
  };

  const size_t my_len = L.len(r);
  uint8_t* sbuf = e.wire(1, part_bytes(s, st, my_len, L.seg));
  std::vector<MPI_Request> sreq;
  Posted posted_s(sreq);
  for (size_t k = 0; k < nsegs(my_len, L.seg); ++k) {
    size_t n = seg_len(my_len, L.seg, k), o = segment_offset(s, st, L.seg, k);
    size_t bytes = e.encode(s, st, at<char>(src, k * L.seg * sts), n, res ? res + k * L.seg : nullptr, sbuf + o);
    for (int d = 1; d < p; ++d) isend(sbuf + o, bytes, (r + d) % p, kTagAG, c, sreq);
    consume(false);
  }
  for (size_t k = 0; k < nsegs(my_len, L.seg); ++k) decode_part(sbuf, r, k);
  consume(true);
  waitall(sreq);
}

}  // namespace mpicomp
