// Layer 1: codec work of one call split over several threads (issue 20: nodes have more
// cores than ranks). Elements are cut into contiguous ranges on block boundaries, so every
// record is computed whole by one thread, exactly as one thread computes it: results are
// bit-identical whatever the thread count.
#pragma once
#include <cstddef>
#include <functional>

namespace mpicomp {

// Threads per codec call: n >= 1, or 0 for the default: the cores this process may run on
// (its affinity mask) divided by the ranks its launcher started on this node
// (MPI_LOCALNRANKS, OMPI_COMM_WORLD_LOCAL_SIZE), at least 1.
void set_codec_threads(int n);
// The cores this process may run on (its affinity mask), and the ranks its launcher started
// on this node (MPI_LOCALNRANKS, OMPI_COMM_WORLD_LOCAL_SIZE; 1 when it does not say).
int affinity_cores();
int local_ranks();
int codec_threads();  // the count in use (0 resolved)

// Runs f(begin, end) over [0, units) in up to codec_threads() contiguous ranges of at least
// min_units each, the calling thread taking one; returns when all have run. While another
// call holds the threads, this one runs on the calling thread alone.
void parallel_ranges(size_t units, size_t min_units, const std::function<void(size_t, size_t)>& f);

}  // namespace mpicomp
