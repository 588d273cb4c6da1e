#include "auto_measure.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>

#include "config.h"
#include "deadline.h"
#include "mpi_util.h"

namespace mpicomp {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Sizes probed, by 2x (a break-even falls between two neighbours, and the model is linear
// between them): from where every path is latency bound to where the wire's bandwidth sets
// the time on any link (1 Gbit/s: a few ms). A call of twice the largest size measured both
// ways or more is measured at its own size too where that costs less than kProbeBudget by
// the model: beyond the caches, extrapolation misleads (shared memory, 2 ranks: int8 took
// 0.74x none's time at 4 MiB, 1.19x at 64 MiB).
constexpr size_t kFirstProbe = 1024, kLastProbe = size_t(4) << 20;
// Each size's time per call is that of a batch of calls back to back, as OSU's benchmarks and
// a training loop run them (one call timed alone would count the previous call's tail on a
// slower rank), after a barrier; the faster of kRounds batches (another process's burst, a
// first call's allocations do not count).
constexpr int kRounds = 2;
// A batch lasts about kBatchSeconds by the last size's times (more calls where they are
// short and noisy), within [kMinBatch, kMaxBatch]; larger sizes are probed while the whole
// probe's expected time stays below kProbeBudget. Both follow from agreed times, so every
// rank makes the same calls.
constexpr double kBatchSeconds = 2e-3;
constexpr int kMaxBatch = 32;

// The time of one call each way measured at once (kInf: not measured).
double total(const Times& t) {
  double sum = 0;
  for (const auto& way : t)
    for (double v : way)
      if (v < kInf) sum += v;
  return sum;
}

}  // namespace

void agree_values(MPI_Comm comm, double* v, int n, MPI_Op op) {
  CallScope scope(config(), comm);
  mpi_collective("MPI_Allreduce",
                 [&](mpic::Requests* rs) { mpic::allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, op, comm, rs); });
}

std::pair<Times, size_t> time_size(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in,
                                   size_t s, int batch, const ProbeRun& run, std::array<size_t, 2> differs,
                                   std::vector<char>& in, std::vector<char>& out) {
  const CommInfo ci(comm);
  const size_t dts = dtype_size(a.dtype);
  const size_t unit = dts * (coll == Coll::reduce_scatter ? size_t(ci.size) : 1);  // bytes_in per count
  CollArgs p = a;
  p.adaptive = false;
  p.avg = false;
  p.residual = nullptr;
  p.count = std::max<size_t>(1, s / unit);
  const size_t in_bytes = p.count * unit;
  const void* data = x;
  if (in_bytes != bytes_in) {
    in.resize(in_bytes);
    for (size_t at = 0; at < in_bytes && bytes_in; at += bytes_in)
      std::memcpy(in.data() + at, x, std::min(bytes_in, in_bytes - at));
    data = in.data();
  }
  out.resize(p.count * dts * (coll == Coll::allgather ? size_t(ci.size) : 1));
  Times best = {{{kInf, kInf}, {kInf, kInf}}};
  for (int r = 0; r < kRounds; ++r)
    for (int packed = 0; packed < 2; ++packed)
      for (int flat = 0; flat <= int(differs[packed] > 0); ++flat) {
        if (flat && in_bytes > differs[packed]) continue;  // the same path as two levels
        p.spec = packed ? a.spec : Spec{};
        p.flat = flat;
        if (r == 0) run(p, data, out.data());  // its first call at this size allocates
        {
          CallScope scope(config(), comm);
          mpi_collective("MPI_Barrier", [&](mpic::Requests* rs) {
            mpi_check(rs ? PMPI_Ibarrier(comm, mpic::add(rs)) : PMPI_Barrier(comm), "MPI_Barrier");
          });
        }
        const auto t0 = Clock::now();
        for (int k = 0; k < batch; ++k) run(p, data, out.data());
        best[packed][flat] =
            std::min(best[packed][flat], std::chrono::duration<double>(Clock::now() - t0).count() / batch);
      }
  for (int packed = 0; packed < 2; ++packed)
    if (differs[packed] && in_bytes > differs[packed]) best[packed][1] = best[packed][0];
  agree_values(comm, best[0].data(), 4, MPI_MAX);  // a collective ends with its slowest rank
  return {best, in_bytes};
}

void keep(AutoModel& m, double b, const Times& t) {
  for (int packed = 0; packed < 2; ++packed)
    for (int flat = 0; flat < 2; ++flat)
      if (t[packed][flat] < kInf) m.set(packed, flat, b, t[packed][flat]);
}

double cost(int batch, double one_each) { return (kRounds * batch + 1) * one_each; }

AutoModel measure(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in, const ProbeRun& run,
                  std::array<size_t, 2> differs) {
  AutoModel m;
  if (differs[0] && differs[0] != SIZE_MAX) m.plain_same = double(differs[0]);
  std::vector<char> in, out;
  int batch = kMaxBatch;
  double spent = 0;  // the probe's time so far, by the agreed times
  for (size_t s = kFirstProbe; s <= kLastProbe; s *= 2) {
    const auto [best, in_bytes] = time_size(comm, coll, a, x, bytes_in, s, batch, run, differs, in, out);
    m.bytes.push_back(double(in_bytes));
    for (int packed = 0; packed < 2; ++packed)
      for (int flat = 0; flat <= int(differs[packed] > 0); ++flat)
        m.times(packed, flat).push_back(best[packed][flat]);
    spent += cost(batch, total(best));
    const double next = 2 * total(best);  // one call each way at twice the size
    batch = int(std::clamp(kBatchSeconds / next, double(kMinBatch), double(kMaxBatch)));
    if (m.bytes.size() >= 2 && spent + cost(batch, next) > kProbeBudget) break;
  }
  return m;
}

}  // namespace mpicomp
