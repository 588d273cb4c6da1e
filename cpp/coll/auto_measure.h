// Layer 2: codec "auto"'s timings (adaptive.h): the collective itself, called each way on
// each hierarchy at a size, in batches, the slowest rank's time agreed; and the probe, which
// times it so at sizes from 1 KiB up within a budget.
#pragma once
#include <mpi.h>

#include <array>
#include <utility>
#include <vector>

#include "adaptive.h"

namespace mpicomp {

// A probe's expected time stays below kProbeBudget; a batch is kMinBatch calls at least.
constexpr double kProbeBudget = 0.5;
constexpr int kMinBatch = 2;

// v, elementwise, the same on every rank: op's reduction over ranks (MPI_MAX, MPI_MIN).
void agree_values(MPI_Comm comm, double* v, int n, MPI_Op op);

// The collective's time per call each way (uncompressed, compressed) on each hierarchy
// (Config::hierarchy's, and flat where `differs` says that is another path, flat_differs: else
// infinity; above its size there, the other hierarchy's time, untimed) at about s bytes_in,
// on x's bytes tiled to size (x itself at its own size), and that size: the faster of 2
// batches of `batch` calls after a barrier, on the slowest rank. in, out: reused buffers.
using Times = std::array<std::array<double, 2>, 2>;  // [compressed][flat]
std::pair<Times, size_t> time_size(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in,
                                   size_t s, int batch, const ProbeRun& run, std::array<size_t, 2> differs,
                                   std::vector<char>& in, std::vector<char>& out);
// Keeps what time_size measured at b bytes in the model.
void keep(AutoModel& m, double b, const Times& t);
// What measuring at a size every way with batches of `batch` costs, by one call's time each way.
double cost(int batch, double one_each);
// Times the collective every way at sizes from 1 KiB up, on x's bytes tiled to size.
AutoModel measure(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in, const ProbeRun& run,
                  std::array<size_t, 2> differs);

}  // namespace mpicomp
