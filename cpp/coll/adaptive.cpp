#include "adaptive.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <tuple>
#include <utility>

#include "auto_measure.h"
#include "config.h"
#include "deadline.h"
#include "mpi_util.h"

namespace mpicomp {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A size class whose calls all took one path (a way, uncompressed or compressed, on one
// hierarchy) goes every path in turn for a window, to time the others beside it: at most
// every kExploreNear checks when the model puts one within kExplore of the path taken, else
// every kExploreFar; and before its calls turn to a path whose time an older window measured
// (the machine or the link may have been faster or slower then: on 2 shared cores a 1 KiB
// call's time doubles for seconds at a time).
// Each path takes one run of kRun calls in a row there, which the check waits for: calls in a
// stream meet what the ones before them left (a token bucket's credit, a queue); one call of a
// path between calls of others does not (2 nodes of 2, 1 Gbit/s, 32 KiB: 200 us alone among the
// others, 520 us in a stream of its own). The path the class's calls took comes first, where
// its run follows its own stream, and its calls go on after the runs until the check: a run
// that follows a lighter path's meets the credit that left (10 Gbit/s, 2 ranks, 64 KiB:
// uncompressed 45 us in runs of 4 after int8's, 72-89 us in a stream; int8 60 us either way),
// and windows that went every path in turn until the check kept the calls uncompressed, at
// 1.19x int8's time.
constexpr double kExplore = 1.25;
constexpr int kExploreNear = 16, kExploreFar = 256, kRun = 4;
// A window waits for its runs to end (a training loop's other sizes come between their calls),
// but not beyond kLongestWindow calls (a size no longer called).
constexpr int kLongestWindow = 256;

// A path: 2 * compressed + flat (AutoModel: flat where the model has that hierarchy's times).
constexpr int kPaths = 4;
constexpr bool compressed_path(int p) { return p >> 1; }
constexpr bool flat_path(int p) { return p & 1; }

// The calls since the last check, by size class (log2 of bytes_in from 1 KiB) and path: what
// the check judges drift by and refines the model with.
constexpr int kFirstClass = 10, kClasses = 28, kRecent = 15;
static_assert(kCheckValues == 4 + kPaths * kClasses);
struct Window {
  int calls = 0;
  double due = 0;             // the model's time for them
  double lo = kInf, hi = 0;   // the fastest and slowest, as a ratio of the model's time (judged ones)
  double bytes[kPaths][kClasses] = {}, count[kPaths][kClasses] = {};
  double recent[kPaths][kClasses][kRecent] = {};  // the latest calls' seconds, a ring
  // The median of the latest calls of one class on one path: a stalled call (a
  // retransmission, a preempted rank) does not move it.
  double median(int p, int c) const {
    const int n = int(std::min<double>(count[p][c], kRecent));
    double t[kRecent];
    std::copy(recent[p][c], recent[p][c] + n, t);
    std::nth_element(t, t + n / 2, t + n);
    return t[n / 2];
  }
  double calls_of(int c) const { return count[0][c] + count[1][c] + count[2][c] + count[3][c]; }
};

int size_class(double bytes) {  // floor(log2), by the bits: std::log2 was a fifth of auto's instructions per call
  return std::clamp(63 - __builtin_clzll(std::max<uint64_t>(uint64_t(bytes), 1)) - kFirstClass, 0, kClasses - 1);
}

// What a communicator knows of one kind of call: a model, measured (or installed) at
// `measured`, and what the calls since have taught.
struct Entry {
  AutoModel model;
  int probes = 0;
  Clock::time_point measured;
  double probed_to;  // the largest size measured both ways at once
  Window w;
  int checks = 0;
  bool alternate[kClasses];  // per class: its calls go every path in turn until the next check
  int explored[kClasses];    // per class: the check that last sent it every path, or first saw it; -1: none yet
  int order[kClasses][kPaths];  // per class in a window: its runs' paths, the one its calls took first
  int paths[kPaths], npaths = 0;  // the paths the model has, compressed first
  Entry(AutoModel m, int probes)
      : model(std::move(m)), probes(probes), measured(Clock::now()), probed_to(model.bytes.back()) {
    std::fill(std::begin(alternate), std::end(alternate), false);
    std::fill(std::begin(explored), std::end(explored), -1);
    for (int p : {2, 3, 0, 1})
      if (!flat_path(p) || model.has_flat(compressed_path(p))) paths[npaths++] = p;
    changed();
  }
  // What the model says of a call of b bytes, kept for the next call: a training loop repeats
  // its sizes, and a small call takes a few microseconds (auto's own work was 5% of one).
  struct Said {
    double b = -1;
    std::optional<Skip> skip;
    double predicted[kPaths];  // each path's time (a flat one the model lacks: its way's other)
    int best[2];               // the path each way takes, uncompressed and compressed
  };
  const Said& at(double b) {
    if (b != said_.b) {
      said_ = {b, model.decide(b), {}, {int(model.flat(false, b)), 2 + int(model.flat(true, b))}};
      for (int p = 0; p < kPaths; ++p) said_.predicted[p] = model.predict(compressed_path(p), flat_path(p), b);
    }
    return said_;
  }
  // The path a call of b bytes takes: the model's, or in a window that goes every path in
  // turn, the one whose run it is, after the runs the first again (every rank has counted the
  // same calls: the same everywhere).
  int path_of(double b) {
    const int c = size_class(b);
    if (alternate[c]) {
      const int run = int(w.calls_of(c)) / kRun;
      return order[c][run < npaths ? run : 0];
    }
    const Said& said = at(b);
    return said.best[!said.skip];
  }
  // Whether a class that goes every path in turn has begun its runs and not ended them.
  bool runs_pending() const {
    for (int c = 0; c < kClasses; ++c)
      if (alternate[c] && w.calls_of(c) > 0 && w.calls_of(c) < kRun * npaths) return true;
    return false;
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

// Measures (again: probes counts them) and keeps the model, with nothing of the old one.
void probe(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in, const ProbeRun& run,
           Cache& cache, int probes) {
  const auto t0 = Clock::now();
  Entry fresh(measure(comm, coll, a, x, bytes_in, run, flat_differs(coll, comm, a)), probes + 1);
  const double seconds = std::chrono::duration<double>(fresh.measured - t0).count();
  stats_probe(coll, seconds);
  announce(comm, coll, a, fresh.model,
           std::string(fresh.probes > 1 ? "re-measured " : "measured ") + size_text(fresh.model.bytes.front()) +
               " to " + size_text(fresh.model.bytes.back()) + " both ways" +
               (fresh.model.has_flat(true) ? ", on both hierarchies," : "") + " in " + seconds_text(seconds));
  cache.insert_or_assign(key_of(coll, a.dtype, a.spec), std::move(fresh));
}

// A call of bytes_in at twice the largest size measured both ways or more, measured at its
// size (on its own data) where that costs less than kProbeBudget by the model (kLastProbe).
void measure_further(MPI_Comm comm, Coll coll, const CollArgs& a, const void* x, size_t bytes_in,
                     const ProbeRun& run, Entry& e) {
  const double b = double(bytes_in);
  // The paths the model has, timed where they differ (a settings change since: all of them).
  std::array<size_t, 2> differs = flat_differs(coll, comm, a);
  for (int packed = 0; packed < 2; ++packed)
    differs[packed] = !e.model.has_flat(packed) ? 0 : differs[packed] ? differs[packed] : SIZE_MAX;
  const AutoModel& m = e.model;
  double one_each = 0;
  for (int packed = 0; packed < 2; ++packed)
    for (int flat = 0; flat <= int(differs[packed] > 0 && b <= double(differs[packed])); ++flat)
      one_each += m.predict(packed, flat, b);
  if (cost(kMinBatch, one_each) > kProbeBudget) return;
  const auto t0 = Clock::now();
  std::vector<char> in, out;
  const auto [best, in_bytes] = time_size(comm, coll, a, x, bytes_in, bytes_in, kMinBatch, run, differs, in, out);
  keep(e.model, b, best);
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

std::optional<Skip> auto_decision(MPI_Comm comm, Coll coll, const CollArgs& a, size_t bytes_in, Route& route) {
  Entry* e = find(comm, key_of(coll, a.dtype, a.spec));
  route = Route{false, true};
  if (!e) return bytes_in ? std::optional<Skip>(Skip::auto_probe) : std::optional<Skip>(Skip::auto_small);
  const double b = double(bytes_in);
  const int p = e->path_of(b);
  route = Route{flat_path(p), !compressed_path(p) && (flat_path(p) || !e->model.has_flat(false))};
  if (compressed_path(p)) return std::nullopt;
  return e->alternate[size_class(b)] ? Skip::auto_probe : *e->at(b).skip;
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
  Window& w = e.w;
  const double b = double(bytes_in);
  const int p = e.path_of(b), k = size_class(b);  // as auto_decision found it
  const double predicted = e.at(b).predicted[p];
  if (predicted >= kDriftFloor) {
    w.lo = std::min(w.lo, seconds / predicted);
    w.hi = std::max(w.hi, seconds / predicted);
  }
  w.recent[p][k][int(w.count[p][k]) % kRecent] = seconds;
  w.bytes[p][k] += b;
  w.count[p][k] += 1;
  w.due += predicted;
  if (b >= 2 * e.probed_to) measure_further(comm, coll, a, x, bytes_in, run, e);
  // Every rank counts the same calls with the same model: all reach the check together.
  if (++w.calls < kMinCheckCalls || w.due < e.check_due || (w.calls < kLongestWindow && e.runs_pending()))
    return;
  // Agreed: the least drift any rank saw either way (none without a call to judge by), the
  // longest time since the last probe, the longest re-probe interval any rank is configured
  // with (0: never), and each class's median time on each path on the slowest rank, as a probe's.
  const bool judged = w.hi > 0;
  const double every = config().auto_reprobe_s;
  double v[kCheckValues] = {judged ? -w.lo : -1, judged ? w.hi : 1,
                            std::chrono::duration<double>(Clock::now() - e.measured).count(),
                            every > 0 ? every : kInf};
  for (int q = 0; q < kPaths; ++q)
    for (int c = 0; c < kClasses; ++c) v[4 + q * kClasses + c] = w.count[q][c] > 0 ? w.median(q, c) : 0;
  agree_values(comm, v, kCheckValues, MPI_MAX);
  const bool drift = -v[0] > kDrift || v[1] < 1 / kDrift;
  if (drift && v[2] >= v[3]) return probe(comm, coll, a, x, bytes_in, run, cache_of(comm), e.probes);
  // The calls' own times replace the model's at their sizes: a probe's short bursts miss what
  // a sustained stream of calls meets (a token bucket's credit, a switch's buffers, caches).
  for (int q = 0; q < kPaths; ++q)
    for (int c = 0; c < kClasses; ++c)
      if (w.count[q][c] > 0)
        e.model.set(compressed_path(q), flat_path(q), w.bytes[q][c] / w.count[q][c], v[4 + q * kClasses + c]);
  e.changed();
  // A class whose calls all took one path has the other paths' times from the probe or an
  // older window, perhaps misleading ones (a probe's noise, a credit since spent, a slower
  // moment of the machine): its calls go every path in turn until the next check, to be timed
  // side by side as a stream. Before they turn to another path by such a time; else at most
  // every kExploreNear checks when the model puts one within kExplore of the path taken, else
  // every kExploreFar: what the slower paths cost, spread over that many checks' calls.
  ++e.checks;
  for (int c = 0; c < kClasses; ++c) {
    e.alternate[c] = false;
    if (e.explored[c] < 0 && w.calls_of(c) > 0) e.explored[c] = e.checks;
    int taken = -1;
    for (int i = 0; i < e.npaths; ++i)
      if (w.count[e.paths[i]][c] > 0) taken = taken < 0 ? e.paths[i] : kPaths;
    if (taken < 0 || taken == kPaths) continue;  // no calls, or several paths already
    const Entry::Said& said = e.at(w.bytes[taken][c] / w.count[taken][c]);
    const bool turns = said.best[!said.skip] != taken;
    bool near = false;
    for (int i = 0; i < e.npaths; ++i)
      near |= e.paths[i] != taken && said.predicted[e.paths[i]] < kExplore * said.predicted[taken];
    if (turns || e.checks - e.explored[c] >= (near ? kExploreNear : kExploreFar)) {
      e.alternate[c] = true;
      e.explored[c] = e.checks;
      int* order = e.order[c];
      *order++ = taken;
      for (int i = 0; i < e.npaths; ++i)
        if (e.paths[i] != taken) *order++ = e.paths[i];
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
  // Every rank's count of sizes (-1 for a rank whose own model is malformed) and which flat
  // curves it has, the least and (negated) the most over the ranks: all raise alike.
  const size_t n = mine.bytes.size();
  double shape[6] = {mine.well_formed() ? double(n) : -1, double(mine.has_flat(false)), double(mine.has_flat(true))};
  for (int i = 0; i < 3; ++i) shape[3 + i] = -shape[i];
  agree_values(comm, shape, 6, MPI_MIN);
  if (shape[0] < 1 || shape[0] != -shape[3] || shape[1] != -shape[4] || shape[2] != -shape[5])
    throw Error(ErrorKind::shape_mismatch, "an installed auto model needs the same number of sizes (at least one), "
                                           "with both times at each (and the same flat ones, if any), on every rank");
  for (std::vector<double>* v : {&mine.bytes, &mine.plain, &mine.packed, &mine.plain_flat, &mine.packed_flat})
    if (!v->empty()) agree_values(comm, v->data(), int(n), MPI_MAX);
  Cache& cache = cache_of(comm);
  const Key key = key_of(coll, t, codec);
  auto it = cache.find(key);
  cache.insert_or_assign(key, Entry(std::move(mine), it == cache.end() ? 0 : it->second.probes));
}

}  // namespace mpicomp
