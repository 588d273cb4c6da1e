// The data movement of a compressed collective, after its agreement: flat (every rank
// exchanges with every other; flat.cpp) or two-level (two_level.cpp). Internal to
// the core; the public entry points are coll.h's.
#pragma once
#include <mpi.h>

#include "engine.h"
#include "stages.h"
#include "topology.h"

namespace mpicomp {

// How a buffer is cut: the codec on the wire, the dtype of the data and of its sums
// (format.h: acc_dtype); segments of `seg`
// elements for it (stages.h: segment_elems) and of `seg_none` for exact stages inside a
// node; parts whose boundaries fall on multiples of `granule` (the codec's block); stream:
// outputs written around the cache (coll.h: kStreamBytes).
struct Tiling {
  Spec wire;
  DType dtype, sum_t;
  size_t seg, seg_none, granule;
  bool stream;
};

// y (count elements) = the sum of every rank's x, times scale, through ranks' stages on
// comm, summed in T.sum_t. res: error feedback (count float32, or null).
void flat_allreduce(MPI_Comm comm, const CommInfo& ci, Engine& e, const Tiling& T, const void* x, void* y,
                    size_t count, float* res, double scale, FrameDamage& damage);
// The same on a layout with several nodes: an exact reduce-scatter inside each node, the
// compressed allreduce of each rank's part among the ranks with its index on the other
// nodes, an exact allgather inside the node. res: the residual of what this rank compresses.
void two_level_allreduce(const NodeLayout& nodes, Engine& e, const Tiling& T, const void* x, void* y, size_t count,
                         float* res, double scale, FrameDamage& damage);
// Where reduce_scatter and allgather go two-level: on nodes of equal size (each rank then
// carries its own block between nodes; elsewhere they run flat).
bool two_level_blocks(const NodeLayout& nodes);
// y (count elements) = the sum over ranks of their block `rank` of x, times scale: the node
// sums each block exactly, then each rank's index on every node exchanges those sums,
// compressed. res: the residual of what this rank compresses (nodes * count float32).
void two_level_reduce_scatter(const NodeLayout& nodes, Engine& e, const Tiling& T, const void* x, void* y,
                              size_t count, float* res, double scale, FrameDamage& damage);
// y = every rank's x (count elements each), in rank order: each rank's block crosses between
// nodes compressed once, then every node gathers its blocks exactly. res: error feedback of x.
void two_level_allgather(const NodeLayout& nodes, Engine& e, const Tiling& T, const void* x, void* y, size_t count,
                         float* res, FrameDamage& damage);

}  // namespace mpicomp
