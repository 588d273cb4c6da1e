#include "adaptive.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

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
constexpr double kBatchSeconds = 2e-3, kProbeBudget = 0.5;
constexpr int kMinBatch = 2, kMaxBatch = 32;
// A size class whose calls all went one way goes both ways in turn for a window, to time the
// other way beside it: at most every kExploreNear checks when the model puts that way within
// kExplore of the way taken, else every kExploreFar; and before its calls turn to a way whose
// time an older window measured (the machine or the link may have been faster or slower then:
// on 2 shared cores a 1 KiB call's time doubles for seconds at a time).
constexpr double kExplore = 1.25;
constexpr int kExploreNear = 16, kExploreFar = 256;

// The calls since the last check, by size class (log2 of bytes_in from 1 KiB) and way
// (uncompressed, compressed): what the check judges drift by and refines the model with.
constexpr int kFirstClass = 10, kClasses = 28, kRecent = 15;
static_assert(kCheckValues == 4 + 2 * kClasses);
struct Window {
  int calls = 0;
  double due = 0;             // the model's time for them
  double lo = kInf, hi = 0;   // the fastest and slowest, as a ratio of the model's time (judged ones)
  double bytes[2][kClasses] = {}, count[2][kClasses] = {};
  double recent[2][kClasses][kRecent] = {};  // the latest calls' seconds, a ring
  // The median of the latest calls of one class one way: a stalled call (a retransmission,
  // a preempted rank) does not move it.
  double median(int way, int c) const {
    const int n = int(std::min<double>(count[way][c], kRecent));
    double t[kRecent];
    std::copy(recent[way][c], recent[way][c] + n, t);
    std::nth_element(t, t + n / 2, t + n);
    return t[n / 2];
  }
};

// What a communicator knows of one kind of call: a model, measured (or installed) at
// `measured`, and what the calls since have taught.
struct Entry {
  AutoModel model;
  int probes = 0;
  Clock::time_point measured;
  double probed_to;  // the largest size measured both ways at once
  Window w;
  int checks = 0;
  bool alternate[kClasses];  // per class: its calls go both ways in turn until the next check
  int explored[kClasses];    // per class: the check that last sent it both ways, or first saw it; -1: none yet
  Entry(AutoModel m, int probes)
      : model(std::move(m)), probes(probes), measured(Clock::now()), probed_to(model.bytes.back()) {
    std::fill(std::begin(alternate), std::end(alternate), false);
    std::fill(std::begin(explored), std::end(explored), -1);
    changed();
  }
  // What the model says of a call of b bytes, kept for the next call: a training loop repeats
  // its sizes, and a small call takes a few microseconds (auto's own work was 5% of one).
  struct Said {
    double b = -1;
    std::optional<Skip> skip;
    double predicted[2];  // uncompressed, compressed
  };
  const Said& at(double b) {
    if (b != said_.b) said_ = {b, model.decide(b), {model.predict(false, b), model.predict(true, b)}};
    return said_;
  }
  // The calls' predicted time a check waits for: kCheckCost times its own exchange's.
  double check_due;
  // After the model changed.
  void changed() {
    said_ = Said{};
    check_due = kCheckCost * model.predict(false, sizeof(double) * kCheckValues);
  }

 private:
  Said said_;
};

int size_class(double bytes) {  // floor(log2), by the bits: std::log2 was a fifth of auto's instructions per call
  return std::clamp(63 - __builtin_clzll(std::max<uint64_t>(uint64_t(bytes), 1)) - kFirstClass, 0, kClasses - 1);
}
using Key = std::tuple<int, int, int, uint32_t>;  // coll, dtype, codec, block
using Cache = std::map<Key, Entry>;

std::atomic<uint64_t> g_generation{0};  // bumped when a communicator's cache is freed

int free_cache(MPI_Comm, int, void* value, void*) {
  g_generation.fetch_add(1, std::memory_order_release);
  delete static_cast<Cache*>(value);
  return MPI_SUCCESS;
}

Cache& cache_of(MPI_Comm comm) {
  static Keyval key(free_cache);
  void* value = nullptr;
  int found = 0;
  mpi_check(PMPI_Comm_get_attr(comm, key.get(), &value, &found), "MPI_Comm_get_attr");
  if (found) return *static_cast<Cache*>(value);
  auto* c = new Cache;
  mpi_check(PMPI_Comm_set_attr(comm, key.get(), c), "MPI_Comm_set_attr");
  return *c;
}

Key key_of(Coll coll, DType t, Spec s) { return {int(coll), int(t), int(s.id), s.block}; }

// v, elementwise, the same on every rank: op's reduction over ranks (MPI_MAX, MPI_MIN).
void agree_values(MPI_Comm comm, double* v, int n, MPI_Op op) {
  CallScope scope(config(), comm);
  mpi_collective("MPI_Allreduce",
                 [&](mpic::Requests* rs) { mpic::allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, op, comm, rs); });
}

// The model after a measurement, on rank 0 with MPICOMP_VERBOSE: `how` it was measured.
void announce(MPI_Comm comm, Coll coll, const CollArgs& a, const AutoModel& m, const std::string& how) {
  const CommInfo ci(comm);
  if (!verbose() || ci.rank != 0) return;
  std::fprintf(stderr, "mpicomp: auto, %s of %s on %d ranks: %s (%s)\n", coll_name(coll), dtype_name(a.dtype), ci.size,
               m.describe(codec_name(a.spec.id)).c_str(), how.c_str());
  std::fflush(stderr);
}

std::string seconds_text(double s) {
  char t[32];
  std::snprintf(t, sizeof t, "%.2f s", s);
  return t;
}

// The collective's time per call both ways (uncompressed, compressed) at about s bytes_in, on
// x's bytes tiled to size (x itself at its own size), and that size: the faster of kRounds
// batches of `batch` calls after a barrier, on the slowest rank. in, out: reused buffers.
std::pair<std::array<double, 2>, size_t> time_size(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x,
                                                   size_t bytes_in, size_t s, int batch, const ProbeRun& run,
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
  std::array<double, 2> best = {kInf, kInf};
  for (int r = 0; r < kRounds; ++r)
    for (int packed = 0; packed < 2; ++packed) {
      p.spec = packed ? a.spec : Spec{};
      if (r == 0) run(p, data, out.data());  // its first call at this size allocates
      {
        CallScope scope(config(), comm);
        mpi_collective("MPI_Barrier", [&](mpic::Requests* rs) {
          mpi_check(rs ? PMPI_Ibarrier(comm, mpic::add(rs)) : PMPI_Barrier(comm), "MPI_Barrier");
        });
      }
      const auto t0 = Clock::now();
      for (int k = 0; k < batch; ++k) run(p, data, out.data());
      best[packed] = std::min(best[packed], std::chrono::duration<double>(Clock::now() - t0).count() / batch);
    }
  agree_values(comm, best.data(), 2, MPI_MAX);  // a collective ends with its slowest rank
  return {best, in_bytes};
}

// What measuring at b bytes both ways with batches of `batch` costs, by times t.
double cost(int batch, double plain, double packed) { return (kRounds * batch + 1) * (plain + packed); }

// Times the collective both ways at sizes from kFirstProbe up, on x's bytes tiled to size.
AutoModel measure(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in, const ProbeRun& run) {
  AutoModel m;
  std::vector<char> in, out;
  int batch = kMaxBatch;
  double spent = 0;  // the probe's time so far, by the agreed times
  for (size_t s = kFirstProbe; s <= kLastProbe; s *= 2) {
    const auto [best, in_bytes] = time_size(comm, coll, a, x, bytes_in, s, batch, run, in, out);
    m.bytes.push_back(double(in_bytes));
    m.plain.push_back(best[0]);
    m.packed.push_back(best[1]);
    spent += cost(batch, best[0], best[1]);
    const double next = 2 * (best[0] + best[1]);  // one call of each at twice the size
    batch = int(std::clamp(kBatchSeconds / next, double(kMinBatch), double(kMaxBatch)));
    if (m.bytes.size() >= 2 && spent + cost(batch, next, 0) > kProbeBudget) break;
  }
  return m;
}

// Measures (again: probes counts them) and keeps the model, with nothing of the old one.
void probe(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in, const ProbeRun& run,
           Cache& cache, int probes) {
  const auto t0 = Clock::now();
  Entry fresh(measure(comm, coll, a, x, bytes_in, run), probes + 1);
  const double seconds = std::chrono::duration<double>(fresh.measured - t0).count();
  stats_probe(coll, seconds);
  announce(comm, coll, a, fresh.model,
           std::string(fresh.probes > 1 ? "re-measured " : "measured ") + size_text(fresh.model.bytes.front()) +
               " to " + size_text(fresh.model.bytes.back()) + " both ways in " + seconds_text(seconds));
  cache.insert_or_assign(key_of(coll, a.dtype, a.spec), std::move(fresh));
}

// A call of bytes_in at twice the largest size measured both ways or more, measured at its
// size (on its own data) where that costs less than kProbeBudget by the model (kLastProbe).
void measure_further(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in,
                     const ProbeRun& run, Entry& e) {
  const double b = double(bytes_in);
  if (cost(kMinBatch, e.model.predict(false, b), e.model.predict(true, b)) > kProbeBudget) return;
  const auto t0 = Clock::now();
  std::vector<char> in, out;
  const auto [best, in_bytes] = time_size(comm, coll, a, x, bytes_in, bytes_in, kMinBatch, run, in, out);
  e.model.set(false, b, best[0]);
  e.model.set(true, b, best[1]);
  e.probed_to = b;
  e.changed();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  stats_probe(coll, seconds, false);
  announce(comm, coll, a, e.model, "measured at " + size_text(b) + " too, in " + seconds_text(seconds));
}

}  // namespace

namespace {

// The entry this thread found last: a training loop's calls find the same one, and a small
// call takes a few microseconds (a communicator attribute's look-up and a map's are not free).
// Valid while no communicator's cache was freed since (a handle is reused after MPI_Comm_free).
struct Found {
  MPI_Comm comm = MPI_COMM_NULL;
  Key key;
  Entry* entry = nullptr;
  uint64_t generation = 0;
};
thread_local Found t_found;

Entry* find(MPI_Comm comm, const Key& key) {
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (t_found.entry && t_found.comm == comm && t_found.key == key && t_found.generation == generation)
    return t_found.entry;
  Cache& c = cache_of(comm);
  auto it = c.find(key);
  if (it == c.end()) return nullptr;
  t_found = Found{comm, key, &it->second, generation};  // std::map keeps it in place until its cache goes
  return &it->second;
}

}  // namespace

std::optional<Skip> auto_decision(MPI_Comm comm, Coll coll, const CollArgs& a, size_t bytes_in) {
  Entry* e = find(comm, key_of(coll, a.dtype, a.spec));
  if (!e) return bytes_in ? std::optional<Skip>(Skip::auto_probe) : std::optional<Skip>(Skip::auto_small);
  const int c = size_class(double(bytes_in));
  if (e->alternate[c])  // every rank has counted the same calls: the same turn everywhere
    return int(e->w.count[0][c] + e->w.count[1][c]) % 2 ? std::optional<Skip>(Skip::auto_probe) : std::nullopt;
  return e->at(double(bytes_in)).skip;
}

void auto_after(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in, std::optional<Skip> skip,
                double seconds, const ProbeRun& run) {
  Entry* found = find(comm, key_of(coll, a.dtype, a.spec));
  if (!found) {
    if (skip == Skip::auto_probe) probe(comm, coll, a, x, bytes_in, run, cache_of(comm), 0);
    return;
  }
  if (skip && *skip != Skip::auto_small && *skip != Skip::auto_link && *skip != Skip::auto_probe)
    return;  // skip_local: no choice was made
  Entry& e = *found;
  if (double(bytes_in) >= 2 * e.probed_to) measure_further(comm, coll, a, x, bytes_in, run, e);
  Window& w = e.w;
  const int way = skip ? 0 : 1, k = size_class(double(bytes_in));
  const double predicted = e.at(double(bytes_in)).predicted[way];
  if (predicted >= kDriftFloor) {
    w.lo = std::min(w.lo, seconds / predicted);
    w.hi = std::max(w.hi, seconds / predicted);
  }
  w.recent[way][k][int(w.count[way][k]) % kRecent] = seconds;
  w.bytes[way][k] += double(bytes_in);
  w.count[way][k] += 1;
  w.due += predicted;
  // Every rank counts the same calls with the same model: all reach the check together.
  if (++w.calls < kMinCheckCalls || w.due < e.check_due) return;
  // Agreed: the least drift any rank saw either way (none without a call to judge by), the
  // longest time since the last probe, the longest re-probe interval any rank is configured
  // with (0: never), and each class's median time each way on the slowest rank, as a probe's.
  const bool judged = w.hi > 0;
  const double every = config().auto_reprobe_s;
  double v[kCheckValues] = {judged ? -w.lo : -1, judged ? w.hi : 1,
                            std::chrono::duration<double>(Clock::now() - e.measured).count(),
                            every > 0 ? every : kInf};
  for (int wy = 0; wy < 2; ++wy)
    for (int c = 0; c < kClasses; ++c) v[4 + wy * kClasses + c] = w.count[wy][c] > 0 ? w.median(wy, c) : 0;
  agree_values(comm, v, kCheckValues, MPI_MAX);
  const bool drift = -v[0] > kDrift || v[1] < 1 / kDrift;
  if (drift && v[2] >= v[3]) return probe(comm, coll, a, x, bytes_in, run, cache_of(comm), e.probes);
  // The calls' own times replace the model's at their sizes: a probe's short bursts miss what
  // a sustained stream of calls meets (a token bucket's credit, a switch's buffers, caches).
  for (int wy = 0; wy < 2; ++wy)
    for (int c = 0; c < kClasses; ++c)
      if (w.count[wy][c] > 0) e.model.set(wy, w.bytes[wy][c] / w.count[wy][c], v[4 + wy * kClasses + c]);
  e.changed();
  // A class whose calls all went one way has the other way's time from the probe or an older
  // window, perhaps a misleading one (a probe's noise, a credit since spent, a slower moment
  // of the machine): its calls go both ways in turn until the next check, to be timed side by
  // side as a stream. Before they turn to the other way by such a time; else at most every
  // kExploreNear checks when the model puts that way within kExplore of the way taken, else
  // every kExploreFar: what the slower way costs, spread over that many checks' calls.
  ++e.checks;
  for (int c = 0; c < kClasses; ++c) {
    e.alternate[c] = false;
    if (e.explored[c] < 0 && w.count[0][c] + w.count[1][c] > 0) e.explored[c] = e.checks;
    for (int wy = 0; wy < 2; ++wy)
      if (w.count[wy][c] > 0 && w.count[!wy][c] == 0) {
        const double b = w.bytes[wy][c] / w.count[wy][c];
        const Entry::Said& said = e.at(b);
        const bool turns = !said.skip != bool(wy);
        const bool near = said.predicted[!wy] < kExplore * said.predicted[wy];
        if (turns || e.checks - e.explored[c] >= (near ? kExploreNear : kExploreFar)) {
          e.alternate[c] = true;
          e.explored[c] = e.checks;
        }
      }
  }
  w = Window{};
}

std::optional<AutoModel> auto_model(MPI_Comm comm, Coll coll, DType t, Spec codec, int* probes) {
  Cache& c = cache_of(comm);
  auto it = c.find(key_of(coll, t, codec));
  if (it == c.end()) return std::nullopt;
  if (probes) *probes = it->second.probes;
  return it->second.model;
}

void auto_install(MPI_Comm comm, Coll coll, DType t, Spec codec, AutoModel mine) {
  // Every rank's count of sizes, -1 for a rank whose own model is malformed: all raise alike.
  const size_t n = mine.bytes.size();
  const double mine_n = n && mine.plain.size() == n && mine.packed.size() == n ? double(n) : -1;
  double len[2] = {mine_n, -mine_n};
  agree_values(comm, len, 2, MPI_MIN);
  if (len[0] != -len[1] || len[0] < 1)
    throw Error(ErrorKind::shape_mismatch, "an installed auto model needs the same number of sizes (at least one), "
                                           "with both times at each, on every rank");
  for (std::vector<double>* v : {&mine.bytes, &mine.plain, &mine.packed})
    agree_values(comm, v->data(), int(n), MPI_MAX);
  Cache& cache = cache_of(comm);
  const Key key = key_of(coll, t, codec);
  auto it = cache.find(key);
  cache.insert_or_assign(key, Entry(std::move(mine), it == cache.end() ? 0 : it->second.probes));
}

}  // namespace mpicomp
