// libmpicomp_pmpi.so: the MPI entry points that mpicomp compresses, for unmodified programs
// (LD_PRELOAD). Each call decides from its count, datatype, op and communicator alone (so all
// ranks decide alike) whether to run mpicomp's collective on a private duplicate of the
// communicator, or to hand the call to the PMPI_ function untouched. The core only calls
// PMPI_ names, so nothing here recurses into itself.
#include <mpi.h>

#include <chrono>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "../codecs/parallel.h"
#include "../coll/adaptive.h"
#include "../coll/coll.h"
#include "../coll/config.h"
#include "../coll/deadline.h"
#include "../coll/environment.h"
#include "../coll/mpi_util.h"
#include "../coll/stats.h"
#include "agree.h"
#include "async.h"
#include "residuals.h"
#include "settings.h"

#define MPICOMP_EXPORT extern "C" __attribute__((visibility("default")))

namespace mpicomp::pmpi {
namespace {

Settings g_settings;
bool g_active = false;  // MPI_Init ran through us and read the settings
// Non-blocking compressed calls run on a worker thread, which MPI allows only at
// MPI_THREAD_MULTIPLE. The interposer never raises the program's thread level (MPICH's
// locking at that level costs small pass-through calls several microseconds): below it,
// MPI_Iallreduce passes through uncompressed.
bool g_threads = false;

// ---- private duplicates, cached on the user's communicator ----
int free_dup(MPI_Comm comm, int, void* attr, void*) {
  forget_residuals(comm);  // a later communicator may get the same handle
  MPI_Comm* dup = static_cast<MPI_Comm*>(attr);
  if (!timed_out(*dup)) PMPI_Comm_free(dup);
  delete dup;
  return MPI_SUCCESS;
}

// Error feedback (residuals.h): a call holds its residual until it is done with it.
Residual residual(MPI_Comm comm, const void* key, MPI_Count count, size_t n) {
  if (!g_settings.error_feedback) return nullptr;
  return residual_for(comm, key, count, n, g_settings.residual_bytes);
}

bool float_type(MPI_Datatype t, DType& out) {
  if (t == MPI_FLOAT) out = DType::f32;
  else if (t == MPI_DOUBLE) out = DType::f64;
#ifdef MPIX_C_FLOAT16
  else if (t == MPIX_C_FLOAT16) out = DType::f16;
#endif
#ifdef MPIX_BFLOAT16
  else if (t == MPIX_BFLOAT16) out = DType::bf16;
#endif
  else return false;
  return true;
}

int comm_size(MPI_Comm comm) {
  int p = 1;
  PMPI_Comm_size(comm, &p);
  return p;
}

// What to do with one call: the core's collective with these arguments, or the MPI library's
// own function untouched, for the reason `why`, or neither: an error, because the ranks'
// settings differ (agree.h).
struct Decision {
  std::optional<CollArgs> args;
  Skip why = Skip::off;
  bool refused = false;
  std::optional<CollArgs> timed;  // codec "auto" sent it to MPI: its time goes to the model (auto_passed)
};

Decision pass(Skip why) { return Decision{std::nullopt, why}; }

Decision decide(Coll coll, MPI_Count count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm, bool nonblocking = false) {
  const auto& codec = g_settings.codec[int(coll)];
  DType t;
  int inter = 0;
  if (!g_active) return pass(Skip::off);
  if (comm == MPI_COMM_NULL || PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
    return pass(Skip::intercomm);
  // Before anything that a rank's settings decide: they must be the same on every rank.
  if (!settings_agree(comm, g_settings)) return Decision{std::nullopt, Skip::off, true};
  if (!codec) return pass(Skip::off);
  // Allgather has no op (its callers pass MPI_OP_NULL); a reduction with any op but MPI_SUM,
  // MPI_OP_NULL included, goes to MPI, which sums it or raises its own error.
  if (coll != Coll::allgather && op != MPI_SUM) return pass(Skip::op);
  if (!float_type(dt, t) || !(g_settings.dtypes & Settings::dtype_bit(t))) return pass(Skip::datatype);
  const bool adaptive = g_settings.adaptive[int(coll)];
  // MPI's sums may miss codec bound's bound: the core runs its reductions, uncompressed
  // where MPI's sums keep it (coll/budget.h).
  const bool passable = !(codec->id == CodecId::bound && coll != Coll::allgather);
  if (count <= 0 || (passable && !adaptive && size_t(count) * dtype_size(t) < g_settings.min_bytes))
    return pass(Skip::small);
  // Every rank reaches this with the same arguments, so all ask (a collective on the
  // communicator's first use) and all decide alike.
  if (passable && g_settings.skip_local && node_local(comm)) return pass(Skip::local);
  CollArgs a;
  a.spec = *codec;
  a.adaptive = adaptive;
  a.dtype = t;
  a.count = size_t(count);
  // Codec "auto" decides from a model every rank holds alike, kept with the private duplicate
  // the core runs on: where it says not to compress, on the flat hierarchy (MPI's own path),
  // the call is MPI's own, untouched, and timed for the model as the core times its own calls
  // (a communicator's first call of a kind measures it after; coll/adaptive.h); the core runs
  // the rest. Non-blocking calls decide on the worker, which owns their duplicate's model.
  Route route;
  if (passable && adaptive && !nonblocking)
    if (auto why = auto_decision(private_comm(comm, 0), coll, a, bytes_in(coll, a, comm_size(comm)), route);
        why && route.mpi)
      return Decision{std::nullopt, *why, false, a};
  return Decision{a, Skip::off};
}

// Runs one compressed call (the core counts it); failures reach the caller through the
// communicator's error handler, as any MPI error would.
template <class F>
int guarded(MPI_Comm comm, F&& body) {
  try {
    body();
  } catch (const Error& e) {
    std::fprintf(stderr, "mpicomp (LD_PRELOAD): %s\n", e.what());
    return PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER), MPI_ERR_OTHER;
  }
  return MPI_SUCCESS;
}

// A call on a communicator whose ranks' settings differ: an MPI error, as MPI reports its own.
int refuse(MPI_Comm comm) {
  PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

// Hands a call to the MPI library, counting it under its reason when anyone will look, and
// timing it for codec "auto" when d.timed (x: its input, for a probe's data).
template <class F>
int passthrough(Coll coll, const Decision& d, MPI_Comm comm, double in_bytes, F&& call, const void* x = nullptr) {
  // Two clock reads cost more than the rest of a pass-through (0.1 us of 1.5 on a VM):
  // only when the table at MPI_Finalize, the notice or the model will use them.
  if (!g_settings.stats && !g_settings.verbose && !d.timed) return call();
  auto t0 = std::chrono::steady_clock::now();
  int rc = call();
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (g_settings.stats || g_settings.verbose)
    stats_record(coll, d.why == Skip::intercomm ? 1 : comm_size(comm), size_t(in_bytes), Sent{}, Algo::mpi, dt,
                 &d.why);
  if (rc == MPI_SUCCESS && d.timed)
    rc = guarded(comm, [&] { auto_passed(coll, private_comm(comm, 0), x, *d.timed, d.why, dt); });
  return rc;
}

int type_size(MPI_Datatype t) {
  int s = 0;
  PMPI_Type_size(t, &s);
  return s;
}

// Each entry point hands its own PMPI_ call (`mpi`) for the calls that pass through: the
// int-count and the large-count forms alike, and only the forms the MPI library has.
template <class F>
int allreduce(const void* x, void* y, MPI_Count count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm, F&& mpi) {
  auto d = decide(Coll::allreduce, count, dt, op, comm);
  if (d.refused) return refuse(comm);
  if (!d.args)
    return passthrough(Coll::allreduce, d, comm, double(count) * type_size(dt), mpi, x == MPI_IN_PLACE ? y : x);
  if (x == MPI_IN_PLACE) x = y;
  return guarded(comm, [&] {
    Residual r = residual(comm, y, count, d.args->count);
    d.args->residual = r ? r->data() : nullptr;
    mpicomp::allreduce(private_comm(comm, 0), x, y, *d.args);
  });
}

template <class F>
int reduce_scatter_block(const void* x, void* y, MPI_Count count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm,
                         F&& mpi) {
  auto d = decide(Coll::reduce_scatter, count, dt, op, comm);
  if (d.refused) return refuse(comm);
  int p = comm_size(comm);
  if (!d.args)
    return passthrough(Coll::reduce_scatter, d, comm, double(count) * p * type_size(dt), mpi,
                       x == MPI_IN_PLACE ? y : x);
  // In place: the input is the receive buffer (size * count elements).
  std::vector<char> copy;
  if (x == MPI_IN_PLACE) {
    copy.assign(static_cast<char*>(y), static_cast<char*>(y) + size_t(count) * p * dtype_size(d.args->dtype));
    x = copy.data();
  }
  return guarded(comm, [&] {
    Residual r = residual(comm, y, count, d.args->count * p);
    d.args->residual = r ? r->data() : nullptr;
    mpicomp::reduce_scatter(private_comm(comm, 0), x, y, *d.args);
  });
}

template <class F>
int allgather(const void* x, MPI_Count sc, MPI_Datatype st, void* y, MPI_Count rc, MPI_Datatype rt, MPI_Comm comm,
              F&& mpi) {
  // Decided (and the settings agreed) whatever the types: another rank may pass equal ones.
  auto d = decide(Coll::allgather, rc, rt, MPI_OP_NULL, comm);
  if (d.refused) return refuse(comm);
  if (d.args && !(x == MPI_IN_PLACE || (sc == rc && st == rt))) d = pass(Skip::datatype);
  int p = comm_size(comm);
  if (!d.args) return passthrough(Coll::allgather, d, comm, double(rc) * type_size(rt), mpi, x == MPI_IN_PLACE ? y : x);
  std::vector<char> copy;
  if (x == MPI_IN_PLACE) {
    int r = 0;
    PMPI_Comm_rank(comm, &r);
    const char* own = static_cast<char*>(y) + size_t(r) * d.args->count * dtype_size(d.args->dtype);
    copy.assign(own, own + d.args->count * dtype_size(d.args->dtype));
    x = copy.data();
  }
  return guarded(comm, [&] {
    Residual r = residual(comm, y, rc, d.args->count);
    d.args->residual = r ? r->data() : nullptr;
    mpicomp::allgather(private_comm(comm, 0), x, y, *d.args);
  });
}

template <class F>
int iallreduce(const void* x, void* y, MPI_Count count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm, MPI_Request* req,
               F&& mpi) {
  auto d = decide(Coll::allreduce, count, dt, op, comm, true);
  if (d.refused) return refuse(comm);
  if (d.args && !g_threads) d = pass(Skip::threads);
  if (!d.args)  // the request completes later: counted at its start, without a time
    return passthrough(Coll::allreduce, d, comm, double(count) * type_size(dt), mpi);
  if (x == MPI_IN_PLACE) x = y;
  return guarded(comm, [&] {  // the worker's allreduce counts itself when it runs
    Residual r = residual(comm, y, count, d.args->count);
    d.args->residual = r ? r->data() : nullptr;
    start_async(async_comm(comm), x, y, *d.args, req, r);
  });
}

// Rank 0 says, once, that the interposer is loaded and what it compresses: a program that
// runs uncompressed because LD_PRELOAD was empty shows no such line.
void announce() {
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  std::string what, types;
  for (auto& [name, t] : kDtypeNames)
    if (g_settings.dtypes & Settings::dtype_bit(t)) types += std::string(types.empty() ? "" : "/") + name;
  const std::pair<Coll, const char*> colls[] = {{Coll::allreduce, "MPI_Allreduce/MPI_Iallreduce"},
                                                {Coll::reduce_scatter, "MPI_Reduce_scatter_block"},
                                                {Coll::allgather, "MPI_Allgather"}};
  for (auto& [c, name] : colls) {
    const auto& spec = g_settings.codec[int(c)];
    what += std::string(what.empty() ? "" : ", ") + name + " " + (g_settings.adaptive[int(c)] ? "auto:" : "") +
            (spec ? codec_name(spec->id) : "off");
  }
  std::fprintf(stderr,
               "mpicomp (LD_PRELOAD): %s; MPI_SUM of %s (MPICOMP_DTYPES) from %zu bytes; skip_local=%d, "
               "error_feedback=%d%s\n",
               what.c_str(), types.c_str(), g_settings.min_bytes, int(g_settings.skip_local), int(g_settings.error_feedback),
               g_settings.stats ? "; statistics at MPI_Finalize" : " (MPICOMP_STATS=1: statistics at MPI_Finalize)");
  for (const std::string& name : unknown_environment())
    std::fprintf(stderr, "mpicomp (LD_PRELOAD): unknown variable %s ignored (a misspelling? README: Configuration)\n",
                 name.c_str());
  std::fflush(stderr);
}

void on_init() {
  std::string error;
  read_settings(g_settings, error);
  int level = MPI_THREAD_SINGLE;
  PMPI_Query_thread(&level);
  g_threads = level == MPI_THREAD_MULTIPLE;
  if (!error.empty()) {
    // Every rank says it before aborting, and gives the launcher a moment to pass the line
    // on: the first MPI_Abort ends the job, and with it output still in the launcher's pipes
    // (seen with hydra: the message was lost in about one run in three without the pause).
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "mpicomp (LD_PRELOAD), rank %d: invalid setting %s\n", rank, error.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    PMPI_Abort(MPI_COMM_WORLD, 2);
    std::_Exit(2);  // MPICH's MPI_Abort may return on the rank that called it before the job ends
  }
  set_config(Config{g_settings.min_bytes, g_settings.eager_bytes, g_settings.segment_bytes, g_settings.skip_local,
                    g_settings.verbose, g_settings.timeout_s, g_settings.cache_bytes, g_settings.hierarchy,
                    g_settings.ranks_per_node, g_settings.auto_reprobe_s});
  set_codec_threads(int(g_settings.codec_threads));
  g_active = true;
  announce();
}

// Rank 0's table: its calls and reasons; bytes summed over ranks; the slowest rank's time.
void print_stats() {
  int rank = 0, size = 1;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &size);
  Stats s = stats();
  for (auto& c : s.coll) {
    double sums[3] = {c.bytes_in, c.bytes_wire, c.bytes_plain}, out[3], tmax = 0;
    PMPI_Reduce(sums, out, 3, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    PMPI_Reduce(&c.seconds, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    c.bytes_in = out[0], c.bytes_wire = out[1], c.bytes_plain = out[2], c.seconds = tmax;
  }
  if (rank != 0) return;
  std::string title = "mpicomp interposer: " + std::to_string(size) +
                      " ranks; calls and reasons as seen by rank 0, bytes summed over ranks, time of the slowest rank";
  std::fputs(stats_table(s, title).c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

MPI_Comm private_comm(MPI_Comm comm, int slot) {
  static Keyval keys[2] = {Keyval(free_dup), Keyval(free_dup)};  // the collectives' duplicate, the worker's
  const int keyval = keys[slot].get();
  void* attr = nullptr;
  int found = 0;
  mpi_check(PMPI_Comm_get_attr(comm, keyval, &attr, &found), "MPI_Comm_get_attr");
  if (found) return *static_cast<MPI_Comm*>(attr);
  MPI_Comm* dup = new MPI_Comm;
  mpi_check(PMPI_Comm_dup(comm, dup), "MPI_Comm_dup");
  mpi_check(PMPI_Comm_set_errhandler(*dup, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  mpi_check(PMPI_Comm_set_attr(comm, keyval, dup), "MPI_Comm_set_attr");
  return *dup;
}

}  // namespace mpicomp::pmpi

using namespace mpicomp::pmpi;

MPICOMP_EXPORT int MPI_Init(int* argc, char*** argv) {
  int rc = PMPI_Init(argc, argv);
  if (rc == MPI_SUCCESS) on_init();
  return rc;
}
MPICOMP_EXPORT int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  int rc = PMPI_Init_thread(argc, argv, required, provided);
  if (rc == MPI_SUCCESS) on_init();
  return rc;
}
MPICOMP_EXPORT int MPI_Finalize() {
  if (g_active) {
    stop_async();
    if (g_settings.stats) print_stats();
    clear_residuals();
  }
  return PMPI_Finalize();
}

MPICOMP_EXPORT int MPI_Allreduce(const void* x, void* y, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  return allreduce(x, y, n, t, op, c, [&] { return PMPI_Allreduce(x, y, n, t, op, c); });
}
MPICOMP_EXPORT int MPI_Reduce_scatter_block(const void* x, void* y, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  return reduce_scatter_block(x, y, n, t, op, c, [&] { return PMPI_Reduce_scatter_block(x, y, n, t, op, c); });
}
MPICOMP_EXPORT int MPI_Allgather(const void* x, int sc, MPI_Datatype st, void* y, int rc, MPI_Datatype rt,
                                 MPI_Comm c) {
  return allgather(x, sc, st, y, rc, rt, c, [&] { return PMPI_Allgather(x, sc, st, y, rc, rt, c); });
}
MPICOMP_EXPORT int MPI_Iallreduce(const void* x, void* y, int n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                                  MPI_Request* r) {
  return iallreduce(x, y, n, t, op, c, r, [&] { return PMPI_Iallreduce(x, y, n, t, op, c, r); });
}

// The large-count forms exist only where the MPI library has them (MPI-4: MPICH, not Open
// MPI 5); mpi4py calls these when they are there.
#if MPICOMP_MPI_LARGE_COUNT
MPICOMP_EXPORT int MPI_Allreduce_c(const void* x, void* y, MPI_Count n, MPI_Datatype t, MPI_Op op, MPI_Comm c) {
  return allreduce(x, y, n, t, op, c, [&] { return PMPI_Allreduce_c(x, y, n, t, op, c); });
}
MPICOMP_EXPORT int MPI_Reduce_scatter_block_c(const void* x, void* y, MPI_Count n, MPI_Datatype t, MPI_Op op,
                                              MPI_Comm c) {
  return reduce_scatter_block(x, y, n, t, op, c, [&] { return PMPI_Reduce_scatter_block_c(x, y, n, t, op, c); });
}
MPICOMP_EXPORT int MPI_Allgather_c(const void* x, MPI_Count sc, MPI_Datatype st, void* y, MPI_Count rc,
                                   MPI_Datatype rt, MPI_Comm c) {
  return allgather(x, sc, st, y, rc, rt, c, [&] { return PMPI_Allgather_c(x, sc, st, y, rc, rt, c); });
}
MPICOMP_EXPORT int MPI_Iallreduce_c(const void* x, void* y, MPI_Count n, MPI_Datatype t, MPI_Op op, MPI_Comm c,
                                    MPI_Request* r) {
  return iallreduce(x, y, n, t, op, c, r, [&] { return PMPI_Iallreduce_c(x, y, n, t, op, c, r); });
}
#endif
