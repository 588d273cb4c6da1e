#include "stats.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "config.h"
#include "mpi_util.h"

namespace mpicomp {
namespace {

std::mutex g_mutex;
Stats g_stats;
std::atomic<uint64_t> g_noticed{0};  // bit coll * kSkips + skip: notice already printed

const char* why(Skip s) {
  switch (s) {
    case Skip::codec_none: return "the codec is none";
    case Skip::small: return "input below min_bytes (mpicomp.config.min_bytes, MPICOMP_MIN_BYTES";
    case Skip::single_rank: return "the communicator has one rank";
    case Skip::local: return "all ranks share one node and skip_local is set (mpicomp.config.skip_local, "
                             "MPICOMP_SKIP_LOCAL)";
    case Skip::auto_probe: return "auto: measuring (a communicator's first call of its kind, or a call sent "
                                  "uncompressed to time it)";
    case Skip::auto_small: return "auto: below break-even";
    case Skip::auto_link: return "auto: link faster than codec";
    case Skip::off: return "no codec set for this collective (MPICOMP_CODEC)";
    case Skip::datatype: return "the datatype is not a floating-point type mpicomp compresses";
    case Skip::op: return "the op is not MPI_SUM";
    case Skip::intercomm: return "an inter-communicator";
    case Skip::threads: return "non-blocking calls need MPI_THREAD_MULTIPLE";
    default: return "?";
  }
}

}  // namespace

const char* skip_name(Skip s) {
  static const char* names[kSkips] = {"none",      "small", "one_rank", "local", "auto_probe", "auto_small",
                                      "auto_link", "off",   "datatype", "op",    "intercomm",  "threads"};
  return int(s) < kSkips ? names[int(s)] : "?";
}

const char* algo_name(Algo a) {
  static const char* names[kAlgos] = {"eager", "mpi", "flat", "two_level"};
  return int(a) < kAlgos ? names[int(a)] : "?";
}

size_t uncompressed_wire_bytes(Coll coll, int size, size_t bytes_in) {
  if (size <= 1) return 0;
  const size_t p = size_t(size);
  switch (coll) {
    case Coll::allreduce: return 2 * (p - 1) * bytes_in / p;  // reduce-scatter + allgather
    case Coll::reduce_scatter: return (p - 1) * bytes_in / p;  // all parts but one's own
    case Coll::allgather: return (p - 1) * bytes_in;           // own part to each of the others
    default: return bytes_in;
  }
}

namespace {
thread_local double t_wire = 0, t_plain = 0;
}  // namespace

std::pair<double, double> thread_bytes() { return {t_wire, t_plain}; }

void stats_record(Coll coll, int size, size_t bytes_in, Sent sent, Algo algo, double seconds, const Skip* skip) {
  {
    const double plain = double(uncompressed_wire_bytes(coll, size, bytes_in));
    t_wire += skip ? plain : double(sent.bytes);
    t_plain += plain;
    std::lock_guard<std::mutex> g(g_mutex);
    CollStats& c = g_stats.coll[int(coll)];
    c.calls += 1;
    c.bytes_in += double(bytes_in);
    c.seconds += seconds;
    c.algorithm[int(algo)] += 1;
    c.bytes_inter += double(sent.inter);
    c.bytes_intra += double(sent.intra);
    c.bytes_plain += plain;
    if (skip) {
      c.skipped[int(*skip)] += 1;
      c.bytes_wire += plain;
    } else {
      c.compressed += 1;
      c.bytes_wire += double(sent.bytes);
    }
  }
  if (skip && *skip != Skip::codec_none) notice_skip(coll, *skip, bytes_in);
}

void stats_probe(Coll coll, double seconds, bool probe) {
  std::lock_guard<std::mutex> g(g_mutex);
  g_stats.coll[int(coll)].probes += probe;
  g_stats.coll[int(coll)].probe_seconds += seconds;
}

Stats stats() {
  std::lock_guard<std::mutex> g(g_mutex);
  return g_stats;
}

void stats_reset() {
  std::lock_guard<std::mutex> g(g_mutex);
  g_stats = Stats{};
}

namespace {

// "name=count,..." of the non-zero counts, for a column of the table.
template <class E>
std::string counts(const double* n, int size, const char* (*name)(E)) {
  std::string out;
  for (int k = 0; k < size; ++k)
    if (n[k] > 0) out += std::string(out.empty() ? "" : ",") + name(E(k)) + "=" + std::to_string(static_cast<long long>(n[k]));
  return out;
}

}  // namespace

std::string stats_table(const Stats& s, const std::string& title) {
  std::string out = "# " + title + "\n";
  char line[512];
  std::snprintf(line, sizeof line, "# %-15s %9s %11s %14s %14s %7s %10s  %-34s %s\n", "collective", "calls",
                "compressed", "bytes in", "bytes wire", "saved", "time (s)", "uncompressed calls: reason=count",
                "algorithm=calls");
  out += line;
  for (int i = 1; i < kStatColls; ++i) {
    const CollStats& c = s.coll[i];
    if (c.calls == 0) continue;
    const std::string reasons = counts(c.skipped, kSkips, skip_name), algos = counts(c.algorithm, kAlgos, algo_name);
    double ratio = c.bytes_wire > 0 ? c.bytes_plain / c.bytes_wire : 1;
    std::snprintf(line, sizeof line, "  %-15s %9.0f %11.0f %14.0f %14.0f %6.2fx %10.3f  %-34s %s\n", coll_name(Coll(i)),
                  c.calls, c.compressed, c.bytes_in, c.bytes_wire, ratio, c.seconds,
                  reasons.empty() ? "-" : reasons.c_str(), algos.c_str());
    out += line;
  }
  return out;
}

void notice_skip(Coll coll, Skip skip, size_t bytes_in) {
  if (!verbose()) return;
  const uint64_t bit = uint64_t(1) << (int(coll) * kSkips + int(skip));
  if (g_noticed.fetch_or(bit) & bit) return;
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return;
  std::string reason = why(skip);
  if (skip == Skip::small) reason += " = " + std::to_string(config().min_bytes) + ")";
  std::fprintf(stderr, "mpicomp: %s of %zu bytes sent uncompressed: %s (counted in the statistics; no further "
               "notice for this reason)\n", coll_name(coll), bytes_in, reason.c_str());
  std::fflush(stderr);
}

}  // namespace mpicomp
