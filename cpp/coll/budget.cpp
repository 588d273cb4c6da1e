#include "budget.h"

#include <algorithm>
#include <string>

#include "../codecs/bound.h"
#include "../codecs/errors.h"
#include "deadline.h"
#include "scratch.h"

namespace mpicomp {

Spec bound_stage(Spec user, DType t, double bound, double magnitude, double scale, int encodings) {
  encodings = std::max(encodings, 1);
  // No finite value but zeros: they and their sums are exact at any step.
  if (!(magnitude > 0)) return Spec{CodecId::bound, bound_options(kBoundMax, false, user.block & kBoundLz4, true)};
  // The float64 sums and codes err by a few units of 2^-53 per step (bound.cpp: kMargin
  // covers the quantisation's own).
  const double r = bound_rounding(t) + (2.0 * encodings + 8) * 0x1p-53;
  const double slack = r * (magnitude + bound) + bound_underflow(t) / scale;
  const double each = (bound - slack) / encodings;
  // Codes stay below 2^40 steps (bound.cpp: kWide) for values up to magnitude plus the bound.
  const double finest = (magnitude + bound) / 0x1p38;
  if (!(slack <= bound / 2) || !(each >= finest) || !(each >= kBoundMin)) {
    const double need = std::max(2 * (r * magnitude + bound_underflow(t) / scale) / (1 - 2 * r),
                                 2 * encodings * std::max(magnitude / 0x1p38, kBoundMin));
    throw Error(ErrorKind::codec, "codec bound: an error bound of " + shown(bound * scale) + " cannot be kept on " +
                                      dtype_name(t) + " data of magnitude up to " + shown(magnitude * scale) +
                                      " (rounding to " + dtype_name(t) + " alone errs by up to " +
                                      shown(slack * scale) + "); ask for at least " + shown(need * scale * 1.01) +
                                      ", or use a lossless codec");
  }
  return Spec{CodecId::bound, bound_options(std::min(each, kBoundMax), false, user.block & kBoundLz4, true)};
}

void run_bounded(MPI_Comm comm, const CommInfo& ci, Spec user, DType t, double top, const void* x, size_t nx,
                 const void* y, size_t ny, double scale, int encodings, bool reduction, bool uncompressed, bool done,
                 const std::function<void(Spec stage, const void* x)>& once) {
  const bool rel = bound_relative(user.block);
  const double asked = bound_value(user.block);
  // Partial sums stay within size times the largest input, and a relative bound takes that
  // input as the estimate of the result's largest magnitude (a sum of size gradients that
  // agree is larger, one whose terms cancel smaller: checked below).
  const double magnitude = reduction ? top * ci.size : top;
  const double bound = rel ? asked * top : asked / scale;  // in the sums' units
  // MPI's sums round each of the size - 1 additions a value goes through, a partial sum of at
  // most `magnitude` (16-bit floats: in float32, then once to the dtype, within the dtype's
  // bound_rounding, which includes float32's); a mean by a size not a power of two rounds
  // twice more (1 / size, the product).
  const bool pow2 = (ci.size & (ci.size - 1)) == 0;
  const int roundings = ci.size - 1 + (scale != 1.0 && !pow2 ? 2 : 0);
  const double by_mpi = roundings * bound_rounding(t) * magnitude + (roundings + 1) * bound_underflow(t) / scale;
  double bound_now = bound;
  Spec now = bound_stage(user, t, bound, magnitude, scale, encodings);
  if (uncompressed && by_mpi <= bound && saturated(magnitude, t) == magnitude) {  // no partial sum overflows
    bound_now = by_mpi;
    now = Spec{};
  }
  const bool ran = done && now.id == CodecId::none;
  if (!rel || !reduction) {
    if (!ran) once(now, x);
    return;
  }
  // x is read again if the check fails: kept where the result overwrites it.
  thread_local Scratch saved;
  const void* input = x;
  if (x == y) input = std::memcpy(saved.get(nx * dtype_size(t)), x, nx * dtype_size(t));
  // Every element of a result is within the bound it ran with of the exact one, so the exact
  // result's largest magnitude is at least `low`. Where the estimate was too large (terms
  // that cancel), the bound the result shows is used; a result the bound swamped shows
  // none, and the next run takes at most rel / 2 of the bound before, a few times at most.
  for (int run = 0;; ++run) {
    if (run || !ran) once(now, input);
    const double largest = allreduce_one(comm, finite_absmax(t, y, ny), MPI_DOUBLE, MPI_MAX) / scale;
    const double low = largest * (1 - 2 * bound_rounding(t)) - bound_now;
    if (asked * low >= bound_now) return;
    if (low > 0) return once(bound_stage(user, t, asked * low, magnitude, scale, encodings), input);
    const Error too_fine(ErrorKind::codec, "codec bound: rel=" + shown(asked) + " of a result far smaller than its " +
                                               "inputs (largest magnitude at most " +
                                               shown((largest + bound_now) * scale) + ", inputs up to " + shown(top) +
                                               ") is too fine to keep; use abs=");
    if (run == 5) throw too_fine;
    bound_now *= std::min(asked, 0.125) / 2;  // the result is at most about bound_now: its share, or less
    try {
      now = bound_stage(user, t, bound_now, magnitude, scale, encodings);
    } catch (const Error&) {
      throw too_fine;
    }
  }
}

}  // namespace mpicomp
