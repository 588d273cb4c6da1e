// Codec bound in a collective: the bound the user gives holds on every element of the
// result, for any number of ranks. A value of a reduction is encoded once per rank whose
// contribution reaches it through the network and once more when its sum is gathered; the
// errors of those encodings add up, so each gets an equal share of the bound (flat
// allreduce: size encodings, two-level: one per node, reduce_scatter: size - 1, allgather
// and send: 1). The sums are taken in float64 (format.h: acc_dtype) and rounded once to the
// output dtype; that rounding is set aside from the bound first, and a bound it would use
// up is refused with a codec Error on every rank rather than missed.
//
// A relative bound (rel=, of the result's largest magnitude) is not known before the sum:
// it is estimated from the ranks' largest inputs (their mean), and checked on the result.
// Where cancellation made the result smaller than estimated, the call runs again with the
// bound the first result guarantees (a lower bound on the exact result's largest magnitude).
#pragma once
#include <mpi.h>

#include <functional>

#include "../codecs/format.h"
#include "mpi_util.h"

namespace mpicomp {

// The spec of one encoding (codec bound, an absolute bound) for data whose values, and
// whose partial sums, are at most `magnitude`, when `encodings` encodings together may err
// by `bound` (in the sums' units: the output's bound divided by scale) and the result is
// rounded once to dtype t after being multiplied by `scale`; a codec Error when rounding
// would use up half the bound (or the codes could not be exact).
Spec bound_stage(Spec user, DType t, double bound, double magnitude, double scale, int encodings);

// Runs once(stage, x) so that every element of y (ny elements of dtype t: the result, times
// scale) is within the bound of `user` of the exact result of x (nx elements of dtype t on
// every rank); top: the largest finite |x| over all ranks. reduction: the result is the sum
// over ranks (allreduce, reduce_scatter), else a copy of each rank's x (allgather).
// uncompressed: the call may keep MPI's own sums (stage codec none) where their rounding
// keeps the bound (a reduction the size threshold or codec auto sends uncompressed); done:
// it has run so already, its result in y and x intact (a copy, where y overwrote it). A
// bound no stage keeps is refused whether or not the call could keep MPI's sums, so that
// its size never decides whether it fails. Collective on comm; host memory.
void run_bounded(MPI_Comm comm, const CommInfo& ci, Spec user, DType t, double top, const void* x, size_t nx,
                 const void* y, size_t ny, double scale, int encodings, bool reduction, bool uncompressed, bool done,
                 const std::function<void(Spec stage, const void* x)>& once);

}  // namespace mpicomp
