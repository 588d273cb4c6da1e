// Two-level collectives for nodes of several ranks that share one network card (topology.h).
// A flat allreduce over N nodes of R ranks puts about R times the bytes of a two-level one
// on each node's card: every rank's compressed parts leave the node. Here, as in Horovod's
// hierarchical allreduce (reduce-scatter inside the node, allreduce across, allgather
// inside) and in CGX, the node first reduces exactly over its fast link, each of its ranks
// then exchanges one R-th of the data, compressed, with the ranks of the same index on the
// other nodes, and the node gathers the result exactly: each byte crosses the card once.
// Lossy compression happens only between nodes, so the error is that of an N-rank flat call.
#include <algorithm>
#include <optional>

#include "algorithms.h"

namespace mpicomp {
namespace {

// One tile's cut: `in`, the node's parts (one per lane, empty for ranks past the smallest
// node's size), and `x`, this rank's lane part cut over the nodes.
struct TileCut {
  size_t first;
  Layout in, x;
};

}  // namespace

void two_level_allreduce(const NodeLayout& N, Engine& e, const Tiling& T, const void* x, void* y, size_t count,
                         float* res, float scale, FrameDamage& damage) {
  const CommInfo in_ci(N.intra);
  const bool lane = N.local < N.lanes;
  std::optional<CommInfo> x_ci;
  if (lane) x_ci.emplace(N.inter);
  const size_t dts = dtype_size(T.dtype), tile = T.seg * size_t(N.lanes) * size_t(N.nodes);
  const Spec exact{};
  auto cut = [&](size_t first) {
    const size_t len = std::min(tile, count - first);
    TileCut c{first, balanced_layout(N.lanes, len, T.granule, T.seg_none), {}};
    c.in.off.resize(size_t(in_ci.size) + 1, len);
    if (lane) c.x = balanced_layout(N.nodes, c.in.len(N.local), T.granule, T.seg);
    return c;
  };
  const char* xb = static_cast<const char*>(x);
  char* yb = static_cast<char*>(y);
  // Stages: (a) exact reduce-scatter inside the node into acc slot 0, (b) compressed
  // reduce-scatter of the lane part between nodes into acc slot 1, (c) its compressed
  // allgather into the output, (d) exact allgather inside the node. The next tile's (a) runs
  // while this tile's (c) is on the network card, and its (b) while this tile's (d) moves
  // inside the node; (a, b) use wire slots 2-3, (c, d) 0-1.
  std::optional<ReduceScatterStage> a, b;
  float* node_sum = nullptr;  // (a)'s result: the node's sum of this rank's lane part
  auto start_a = [&](const TileCut& c) {
    Links links(false);
    node_sum = e.scratch_f32(0, c.in.len(in_ci.rank));
    a.emplace(N.intra, in_ci, e, exact, T.dtype, c.in, xb + c.first * dts, nullptr, node_sum, damage, 2);
  };
  auto start_b = [&](const TileCut& c) {
    a->finish();
    a.reset();
    if (!lane) return;
    Links links(true);
    b.emplace(N.inter, *x_ci, e, T.wire, DType::f32, c.x, node_sum, res ? res + c.first + c.in.off[N.local] : nullptr,
              e.scratch_f32(1, c.x.len(x_ci->rank)), damage, 2);
  };
  TileCut cur = cut(0);
  start_a(cur);
  start_b(cur);
  for (;;) {
    char* mine = yb + (cur.first + cur.in.off[in_ci.rank]) * dts;  // this rank's lane part of the output
    std::optional<AllgatherStage> c;
    if (lane) {
      b->finish();
      float* acc = e.scratch_f32(1, cur.x.len(x_ci->rank));
      const size_t at = cur.first + cur.in.off[N.local] + cur.x.off[x_ci->rank];
      ReducedPart p = reduced_part(e, T.wire, T.dtype, acc, cur.x.len(x_ci->rank), res ? res + at : nullptr,
                                   yb + at * dts, scale);
      Links links(true);
      c.emplace(N.inter, *x_ci, e, p.out, p.st, cur.x, p.src, p.res, T.dtype, mine, p.scale, T.stream, damage);
      b.reset();
    }
    std::optional<TileCut> next;
    if (cur.first + tile < count) {
      next = cut(cur.first + tile);
      start_a(*next);
    }
    if (c) c->finish();
    c.reset();
    std::optional<AllgatherStage> d;
    {
      Links links(false);
      d.emplace(N.intra, in_ci, e, exact, T.dtype, cur.in, mine, nullptr, T.dtype, yb + cur.first * dts, 1.f,
                T.stream, damage);
    }
    if (next) start_b(*next);
    d->finish();
    if (!next) break;
    cur = std::move(*next);
  }
}

}  // namespace mpicomp
