// Two-level collectives for nodes of several ranks that share one network card (topology.h).
// A flat allreduce over N nodes of R ranks puts about R times the bytes of a two-level one
// on each node's card: every rank's compressed parts leave the node. Here, as in Horovod's
// hierarchical allreduce (reduce-scatter inside the node, allreduce across, allgather
// inside) and in CGX, the node first reduces exactly over its fast link, each of its ranks
// then exchanges one R-th of the data, compressed, with the ranks of the same index on the
// other nodes, and the node gathers the result exactly: each byte crosses the card once.
// Lossy compression happens only between nodes, so the error is that of an N-rank flat call.
// reduce_scatter and allgather follow the same pattern on nodes of equal size, where each rank
// carries its own block between nodes.
#include <algorithm>
#include <optional>
#include <vector>

#include "algorithms.h"

namespace mpicomp {
namespace {

// One tile's cut: `in`, the node's parts (one per lane, empty for ranks past the smallest
// node's size), and `x`, this rank's lane part cut over the nodes.
struct TileCut {
  size_t first;
  Layout in, x;
};

// `parts` parts of len elements, part j at at(j): the same tile of each rank's block.
template <class F>
Layout placed(int parts, size_t len, size_t seg, F&& at) {
  Layout L = equal_layout(parts, len, seg);
  L.at.resize(size_t(parts));
  for (int j = 0; j < parts; ++j) L.at[size_t(j)] = at(j);
  return L;
}

}  // namespace

void two_level_allreduce(const NodeLayout& N, Engine& e, const Tiling& T, const void* x, void* y, size_t count,
                         float* res, double scale, FrameDamage& damage) {
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
  void* node_sum = nullptr;  // (a)'s result: the node's sum of this rank's lane part
  auto start_a = [&](const TileCut& c) {
    Links links(false);
    node_sum = e.scratch(0, c.in.len(in_ci.rank) * dtype_size(T.sum_t));
    a.emplace(N.intra, in_ci, e, exact, T.dtype, c.in, xb + c.first * dts, nullptr, T.sum_t, node_sum, damage, 2);
  };
  auto start_b = [&](const TileCut& c) {
    a->finish();
    a.reset();
    if (!lane) return;
    Links links(true);
    b.emplace(N.inter, *x_ci, e, T.wire, T.sum_t, c.x, node_sum, res ? res + c.first + c.in.off[N.local] : nullptr,
              T.sum_t, e.scratch(1, c.x.len(x_ci->rank) * dtype_size(T.sum_t)), damage, 2);
  };
  TileCut cur = cut(0);
  start_a(cur);
  start_b(cur);
  for (;;) {
    char* mine = yb + (cur.first + cur.in.off[in_ci.rank]) * dts;  // this rank's lane part of the output
    std::optional<AllgatherStage> c;
    if (lane) {
      b->finish();
      void* acc = e.scratch(1, cur.x.len(x_ci->rank) * dtype_size(T.sum_t));
      const size_t at = cur.first + cur.in.off[N.local] + cur.x.off[x_ci->rank];
      ReducedPart p = reduced_part(e, T.wire, T.dtype, T.sum_t, acc, cur.x.len(x_ci->rank), res ? res + at : nullptr,
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

bool two_level_blocks(const NodeLayout& N) { return N.hierarchical() && size_t(N.lanes * N.nodes) == N.node_of.size(); }

void two_level_reduce_scatter(const NodeLayout& N, Engine& e, const Tiling& T, const void* x, void* y, size_t count,
                              float* res, double scale, FrameDamage& damage) {
  const CommInfo in_ci(N.intra), x_ci(N.inter);
  const size_t dts = dtype_size(T.dtype);
  const size_t as = dtype_size(T.sum_t);
  // The node's sums (dtype T.sum_t) of the blocks this rank carries, node by node: S[m * count
  // + i] is element i of the block of the rank with this rank's index on node m. The residual
  // is indexed as S is.
  char* S = static_cast<char*>(e.scratch(0, size_t(N.nodes) * count * as));
  const bool into_y = T.sum_t == T.dtype;  // output of the sums' own dtype is their accumulator
  void* acc = into_y ? nullptr : e.scratch(1, std::min(T.seg, count) * as);
  // Tile t (the same T.seg elements of every block): the node sums it inside the node (wire
  // slots 2-3) while tile t-1 crosses between nodes (slots 0-1).
  std::optional<ReduceScatterStage> b;
  size_t b_first = 0, b_len = 0;
  auto finish_b = [&] {
    b->finish();
    b.reset();
    void* a = into_y ? static_cast<char*>(y) + b_first * dts : acc;
    if (!into_y || scale != 1.0) e.store(T.sum_t, a, b_len, scale, T.dtype, static_cast<char*>(y) + b_first * dts);
  };
  for (size_t first = 0; first < count; first += T.seg) {
    const size_t len = std::min(T.seg, count - first);
    {
      Links links(false);
      for (int m = 0; m < N.nodes; ++m)
        ReduceScatterStage(N.intra, in_ci, e, Spec{}, T.dtype,
                           placed(N.lanes, len, T.seg_none,
                                  [&](int j) { return size_t(N.rank_at(m, j)) * count + first; }),
                           x, nullptr, T.sum_t, S + (size_t(m) * count + first) * as, damage, 2)
            .finish();
    }
    if (b) finish_b();
    Links links(true);
    b.emplace(N.inter, x_ci, e, T.wire, T.sum_t,
              placed(N.nodes, len, T.seg, [&](int m) { return size_t(m) * count + first; }), S, res, T.sum_t,
              into_y ? static_cast<char*>(y) + first * dts : acc, damage, 0);
    b_first = first, b_len = len;
  }
  if (b) finish_b();
}

void two_level_allgather(const NodeLayout& N, Engine& e, const Tiling& T, const void* x, void* y, size_t count,
                         float* res, FrameDamage& damage) {
  const CommInfo in_ci(N.intra), x_ci(N.inter);
  const size_t dts = dtype_size(T.dtype);
  char* yb = static_cast<char*>(y);
  // Tile t of the blocks of this rank's index on every node crosses between nodes (wire
  // slots 0-1) while tile t-1 of each node's blocks is gathered inside the node (2-3).
  auto spread = [&](size_t first, size_t len) {
    Links links(false);
    for (int m = 0; m < N.nodes; ++m)
      AllgatherStage(N.intra, in_ci, e, Spec{}, T.dtype,
                     placed(N.lanes, len, T.seg_none, [&](int j) { return size_t(N.rank_at(m, j)) * count + first; }),
                     yb + (size_t(N.rank_at(m, N.local)) * count + first) * dts, nullptr, T.dtype, y, 1.f, T.stream,
                     damage, 2)
          .finish();
  };
  std::optional<size_t> prev;
  for (size_t first = 0; first < count; first += T.seg) {
    const size_t len = std::min(T.seg, count - first);
    std::optional<AllgatherStage> b;
    {
      Links links(true);
      b.emplace(N.inter, x_ci, e, T.wire, T.dtype,
                placed(N.nodes, len, T.seg, [&](int m) { return size_t(N.rank_at(m, N.local)) * count + first; }),
                static_cast<const char*>(x) + first * dts, res ? res + first : nullptr, T.dtype, y, 1.f, T.stream,
                damage, 0);
    }
    if (prev) spread(*prev, std::min(T.seg, count - *prev));
    b->finish();
    prev = first;
  }
  if (prev) spread(*prev, std::min(T.seg, count - *prev));
}

}  // namespace mpicomp
