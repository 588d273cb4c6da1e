// The flat allreduce: every rank exchanges with every other, a reduce-scatter stage then an
// allgather stage (stages.h), tile by tile.
#include <optional>

#include "algorithms.h"

namespace mpicomp {

void flat_allreduce(MPI_Comm comm, const CommInfo& ci, Engine& e, const Tiling& T, const void* x, void* y, size_t count,
                    float* res, double scale, FrameDamage& damage) {
  // The buffer is reduced a tile at a time, a tile being one segment per rank: each rank's
  // float32 accumulator and wire buffers then stay in its core's cache from the load to the
  // allgather's encoding, where whole-buffer stages took each pass through main memory (on
  // a 10 Gbit/s link, 16 MiB int4: 3.5 ms instead of 5.3; docs/measurements.md). Tile k+1's
  // reduce-scatter starts while tile k's allgather is on the wire (its accumulator k % 2,
  // wire slots 2 and 3), so that neither the link nor the core waits for the other.
  const size_t tile = T.seg * size_t(ci.size), dts = dtype_size(T.dtype);
  Layout L;
  void* acc = nullptr;
  std::optional<ReduceScatterStage> rs;
  auto start_tile = [&](size_t first, size_t k) {
    L = balanced_layout(ci.size, std::min(tile, count - first), T.granule, T.seg);
    acc = e.scratch(int(k % 2), L.len(ci.rank) * dtype_size(T.sum_t));
    rs.emplace(comm, ci, e, T.wire, T.dtype, L, static_cast<const char*>(x) + first * dts, res ? res + first : nullptr,
               T.sum_t, acc, damage, 2);
  };
  start_tile(0, 0);
  for (size_t first = 0, k = 0; first < count; first += tile, ++k) {
    rs->finish();
    char* yt = static_cast<char*>(y) + first * dts;
    ReducedPart part = reduced_part(e, T.wire, T.dtype, T.sum_t, acc, L.len(ci.rank),
                                    res ? res + first + L.off[ci.rank] : nullptr, yt + L.off[ci.rank] * dts, scale);
    AllgatherStage ag(comm, ci, e, part.out, part.st, L, part.src, part.res, T.dtype, yt, part.scale, T.stream, damage);
    rs.reset();
    if (first + tile < count) start_tile(first + tile, k + 1);
    ag.finish();
  }
}

}  // namespace mpicomp
