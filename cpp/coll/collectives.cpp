#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "coll.h"
#include "config.h"
#include "deadline.h"
#include "mpi_count.h"
#include "scratch.h"
#include "stages.h"
#include "adaptive.h"
#include "algorithms.h"
#include "../codecs/bound.h"
#include "budget.h"
#include "stats.h"

namespace mpicomp {
namespace {

std::mutex g_config_mutex;
Config g_config;
std::atomic<bool> g_verbose{Config{}.verbose};

Engine& engine_of(const CollArgs& a) { return a.engine ? *a.engine : cpu_engine(); }

thread_local bool t_inner = false;  // inside via_host: the outer call is the one counted
thread_local bool t_probe = false;  // codec "auto" measuring (adaptive.h): compressed as asked, not counted
// The last call counted on this thread (Recorder): what codec "auto" judges it by. A small call
// takes microseconds: timed and sized once.
struct Counted {
  double seconds = 0;
  size_t bytes_in = 0;
};
thread_local Counted t_counted;

// Sets one of those flags for its lifetime, whether the calls inside return or throw.
// (Nested: an allreduce in pieces, each of which may go via_host.)
class Inside {
 public:
  explicit Inside(bool& flag) : flag_(flag), was_(flag) { flag_ = true; }
  ~Inside() { flag_ = was_; }
  Inside(const Inside&) = delete;
  Inside& operator=(const Inside&) = delete;

 private:
  bool& flag_;
  bool was_;
};

// What travels: the codec asked for, except where a policy says compression cannot pay
// (below min_bytes, nobody to talk to, skip_local on one node, codec "auto"'s measurements);
// `skip` says which.
Signature signature(Coll coll, const CollArgs& a, const CommInfo& ci, const Config& cfg, MPI_Comm comm,
                    std::optional<Skip>& skip) {
  Signature s;
  s.coll = coll;
  s.count = a.count;
  s.codec = a.spec.id;
  s.adaptive = a.adaptive;
  s.block = is_blockwise(a.spec.id) || a.spec.id == CodecId::bound ? a.spec.block : 0;
  s.dtype = a.dtype;
  s.avg = a.avg;
  // Asked on every call, whatever the rest decides: on a communicator's first use it is a
  // collective, which every rank must reach (reject() asks too).
  bool local = ci.size > 1 && node_local(comm);
  Route route;
  if (a.spec.id == CodecId::none)
    skip = Skip::codec_none;
  else if (ci.size == 1)
    skip = Skip::single_rank;
  else if (!a.adaptive && !t_probe && a.count * dtype_size(a.dtype) < cfg.min_bytes)
    skip = Skip::small;
  else if (local && cfg.skip_local)
    skip = Skip::local;
  else if (a.adaptive)  // from a model all ranks hold alike: the same decision everywhere
    skip = auto_decision(comm, coll, a, bytes_in(coll, a, ci.size), route);
  s.wire = skip ? CodecId::none : a.spec.id;
  // Every setting that shapes the wire is agreed: the thresholds and skip_local through
  // `wire` and `eager`, the segment size here (ranks whose environments differ would post
  // messages of different sizes: truncation on one rank, a hang on another).
  // (A reduction codec bound skips may run compressed still, where MPI's sums would miss its
  // bound: budget.h.)
  s.segment = s.wire == CodecId::none && s.codec != CodecId::bound ? 0 : cfg.segment_bytes;
  s.gpu_segment = s.segment ? cfg.gpu_segment_bytes : 0;
  s.device = a.engine != nullptr;
  s.flat = a.flat || route.flat || cfg.hierarchy == Hierarchy::flat;
  s.mpi_own = (a.flat || route.flat) && s.wire == CodecId::none;
  return s;
}

// Counts one call in the statistics when it returns (not when it fails), under the algorithm
// the call set.
class Recorder {
 public:
  // A call inside another (t_inner) leaves the bytes it sends to the outer one's count.
  Recorder(Coll coll, const CommInfo& ci, size_t bytes_in, const std::optional<Skip>& skip)
      : coll_(coll), size_(ci.size), bytes_in_(bytes_in), skip_(skip), t0_(std::chrono::steady_clock::now()) {
    if (!t_inner) take_sent_bytes();
  }
  ~Recorder() {
    if (t_inner) return;
    Sent sent = take_sent_bytes();
    if (t_probe || std::uncaught_exceptions()) return;
    t_counted = {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(), bytes_in_};
    stats_record(coll_, size_, bytes_in_, sent, algo, t_counted.seconds, skip_ ? &*skip_ : nullptr);
  }
  Algo algo = Algo::mpi;

 private:
  Coll coll_;
  int size_;
  size_t bytes_in_;
  const std::optional<Skip>& skip_;  // the call's, which may still change its mind (bounded)
  std::chrono::steady_clock::time_point t0_;
};

// The mean from the sum, for results the MPI library (or the eager exchange) summed.
void divide(void* y, DType t, size_t n, int size) {
  if (t == DType::f64) {
    double* d = static_cast<double*>(y);
    for (size_t i = 0; i < n; ++i) d[i] /= size;
  } else {  // float32, as the compressed paths do it
    cpu_engine().store(DType::f32, y, n, 1.0 / size, DType::f32, y);
  }
}

// Whether an uncompressed collective travels inside the agreement: when it fits
// eager_bytes (`small`) or when two ranks make that MPI's own exchange (`pair`); eager_bytes
// 0 turns it off.
bool rides_agreement(const Signature& sig, const Config& cfg, bool small, bool pair) {
  return sig.wire == CodecId::none && cfg.eager_bytes && (small || pair);
}

// Codec bound needs the largest finite input over the ranks (budget.h), which rides the
// agreement: this rank's, in top, and where to agree it; null where it is not needed.
double* largest_input(const CollArgs& a, const Signature& sig, const void* x, size_t n, double& top) {
  if (a.spec.id != CodecId::bound || a.engine || (sig.coll == Coll::allgather && sig.wire == CodecId::none))
    return nullptr;
  top = finite_absmax(a.dtype, x, n);
  return &top;
}

// x, or a copy of it where an uncompressed reduction that rides the agreement writes its
// result over it: codec bound may have to run the call again, compressed (budget.h). Not
// for an absolute bound on 2 ranks: the sum's one rounding is within any bound the codec
// accepts (a relative one may still find the result smaller than it estimated).
const void* kept(const CollArgs& a, int size, const void* x, const void* y, size_t bytes) {
  if (x != y || !(bound_relative(a.spec.block) || size > 2)) return x;
  thread_local Scratch copy;
  return std::memcpy(copy.get(bytes), x, bytes);
}

// Uncompressed data that MPI moves itself (as the agreement's payload, or in MPI's own
// collective) is in host memory on every rank: a rank with GPU buffers copies them there and
// takes the host's path, so that ranks with GPU and with host buffers meet in the same
// messages, and a small GPU collective costs two copies rather than a pipeline of launches.
// The engine's staging memory (pinned, for a GPU) is kept for calls within cache_bytes;
// larger ones take the thread's scratch, freed after the call as all scratch beyond it is.
void via_host(Coll coll, MPI_Comm comm, const void* x, size_t x_bytes, void* y, size_t y_bytes, const CollArgs& a,
              const Config& cfg) {
  thread_local Scratch sx, sy;
  Engine& e = *a.engine;
  char* hx = static_cast<char*>(x_bytes + y_bytes <= cfg.cache_bytes ? e.staging(0, x_bytes) : nullptr);
  const bool kept = hx != nullptr;
  if (!kept) hx = sx.get(x_bytes);
  char* hy = static_cast<char*>(kept ? e.staging(1, y_bytes) : sy.get(y_bytes));
  e.copy(hx, x, x_bytes, true);
  CollArgs h = a;
  h.engine = nullptr;
  try {
    Inside inner(t_inner);
    collective(coll, comm, hx, hy, h);
  } catch (const Error& err) {
    // A timeout leaves MPI's requests to complete into the buffers (deadline.h abandons the
    // scratch likewise)
    if (kept && err.kind == ErrorKind::timeout) e.abandon_staging();
    throw;
  }
  e.copy(y, hy, y_bytes, false);
}

// An uncompressed allreduce whose data MPI moves (`by_host`) and that is larger than what an
// engine keeps staged for it (cache_bytes, input and output) goes in pieces that fit: a GPU
// rank's copies then run between device and pinned memory, rather than through pageable
// memory allocated for the call and freed after it (one H100, 2 ranks, codec none at
// 256 MiB: 0.31x MPI's allreduce staged through pinned memory). Host ranks cut alike, so that
// ranks with GPU and with host buffers still meet in every message. Elements per piece, or
// 0: the call goes whole (also where cache_bytes leaves pieces under kMinPiece).
constexpr size_t kMinPiece = size_t(1) << 20;
size_t piece_count(const CollArgs& a, const Signature& sig, const Config& cfg, bool by_host) {
  const size_t half = cfg.cache_bytes / 2, elem = dtype_size(a.dtype);
  // (Codec auto runs on host buffers only; codec bound's sums may run again, compressed.)
  if (!by_host || a.adaptive || sig.codec == CodecId::bound || half < kMinPiece || a.count * elem <= half) return 0;
  return half / elem;
}

void allreduce_call(MPI_Comm comm, const void* x, void* y, const CollArgs& a, std::optional<Skip>& skip);

// The pieces, each a call of its own (counted as part of this one): agreed first as a whole,
// piece size included, so that ranks that disagree on the call (or on cache_bytes) learn it
// with its own counts rather than meet in pieces on some ranks and one call on others.
void in_pieces(MPI_Comm comm, Signature sig, const void* x, void* y, const CollArgs& a, size_t piece) {
  const size_t elem = dtype_size(a.dtype);
  sig.eager = false;
  sig.segment = piece * elem;
  agree(comm, sig);
  Inside inner(t_inner);
  CollArgs p = a;
  for (size_t first = 0; first < a.count; first += piece) {
    p.count = std::min(piece, a.count - first);
    if (a.residual) p.residual = a.residual + first;
    std::optional<Skip> skip;
    allreduce_call(comm, static_cast<const char*>(x) + first * elem, static_cast<char*>(y) + first * elem, p, skip);
  }
}

// Sums n elements of x (dtype t) over all ranks inside the agreement (sig.eager), and stores
// elements [first, first + len) of the sum (the mean with avg) into y as t; kind is sum or
// halve (handshake.h: eager_collective; most: agreed with it). The sum goes straight into y
// when y takes all of it and t is summed as itself (no 16-bit widening).
void eager_sum(MPI_Comm comm, const Signature& sig, Engine& e, Payload::Kind kind, DType t, const void* x, size_t n,
               size_t first, size_t len, bool avg, int size, void* y, double* most) {
  thread_local Scratch whole;
  const size_t a = accum_size(t);
  if (a != dtype_size(t)) {  // 16-bit floats: summed as float32
    float* wide = whole.get<float>(n);
    e.load(t, x, n, nullptr, DType::f32, wide);
    eager_collective(comm, sig, Payload{kind, wide, wide, n}, most);
    e.store(DType::f32, wide + first, len, avg ? 1.0 / size : 1.0, t, y);
    return;
  }
  void* sum = y;
  if (len != n) sum = whole.get(n * a);
  eager_collective(comm, sig, Payload{kind, x, sum, n}, most);
  if (sum != y && len) std::memcpy(y, static_cast<char*>(sum) + first * a, len * a);
  if (avg) divide(y, t, len, size);
}

// The cut of a call's buffers; `blocks`: the output holds that many times count elements.
// Where any rank's buffers are on a GPU (agreed), the segments are gpu_segment_bytes long on
// every rank: each costs the GPU engine kernel launches and a stream synchronisation.
Tiling tiling(const Signature& sig, const CollArgs& a, const Config& cfg, int blocks = 1) {
  Spec wire{sig.wire, a.spec.block};
  const size_t seg = sig.device && sig.gpu_segment ? sig.gpu_segment : cfg.segment_bytes;
  return Tiling{wire,
                a.dtype,
                acc_dtype(wire.id, a.dtype),
                segment_elems(wire, a.dtype, seg),
                segment_elems(Spec{}, a.dtype, seg),
                is_blockwise(wire.id) ? wire.block : kLanes,
                a.count * dtype_size(a.dtype) * size_t(blocks) >= kStreamBytes};
}

// The error feedback a call keeps: none for exact calls and for codec bound, whose error
// is bounded in every call (its residual stays zero).
float* residual_of(const Tiling& T, const CollArgs& a) {
  return T.wire.id == CodecId::none || T.wire.id == CodecId::bound ? nullptr : a.residual;
}

// Runs once(T, x), T the call's tiling: as it is, or for codec bound with the share of the
// bound each of the `encodings` a value goes through may take (budget.h; top: the largest
// input over ranks); x has nx elements, y ny. A reduction codec bound sends uncompressed
// (below min_bytes, codec auto's choice) keeps MPI's sums only where they keep the bound,
// and else runs as codec bound (`skip` then cleared: counted as compressed); done: its sums
// rode the agreement, y holds them and x is intact. Returns the codec that ran last.
CodecId bounded(MPI_Comm comm, const CommInfo& ci, const Signature& sig, const Config& cfg, const CollArgs& a,
                double top, const void* x, size_t nx, void* y, size_t ny, double scale, int encodings, bool reduction,
                bool done, std::optional<Skip>& skip, const std::function<void(const Tiling&, const void*)>& once) {
  const Tiling T = tiling(sig, a, cfg, reduction ? 1 : ci.size);
  const bool uncompressed = T.wire.id == CodecId::none;
  if (a.spec.id != CodecId::bound || (uncompressed && (!reduction || ci.size == 1))) {
    if (!done) once(T, x);
    return T.wire.id;
  }
  if (a.engine) throw Error(ErrorKind::backend, "codec bound runs on host buffers only");
  Signature compressed = sig;
  compressed.wire = CodecId::bound;
  const Tiling B = tiling(compressed, a, cfg, reduction ? 1 : ci.size);
  CodecId ran = CodecId::none;
  run_bounded(comm, ci, B.wire, a.dtype, top, x, nx, y, ny, scale, encodings, reduction, uncompressed, done,
              [&](Spec stage, const void* in) {
                ran = stage.id;
                if (stage.id == CodecId::none) return once(T, in);
                skip.reset();
                Tiling U = B;
                U.wire = stage;
                once(U, in);
              });
  return ran;
}

}  // namespace

Config config() {
  std::lock_guard<std::mutex> g(g_config_mutex);
  return g_config;
}
void set_config(const Config& c) {
  std::lock_guard<std::mutex> g(g_config_mutex);
  g_config = c;
  g_verbose.store(c.verbose, std::memory_order_relaxed);
}
bool verbose() { return g_verbose.load(std::memory_order_relaxed); }

void reject(MPI_Comm comm, Coll coll) {
  CallScope scope(config(), comm);
  // The others may be finding out whether the communicator is node-local (a collective on
  // its first use): take part, as their call would have.
  if (CommInfo(comm).size > 1) node_local(comm);
  Signature s;
  s.coll = coll;
  s.invalid = 1;
  agree(comm, s);
}

namespace {

// Whether an uncompressed call's data is moved (and summed) by the MPI library's own
// collective: where its datatype has an MPI type; for allreduce, whose own is node-aware,
// except float32 on two levels of nodes that only config.ranks_per_node knows of (MPI does
// not): there the two-level path sends what a node-aware MPI would.
bool uncompressed_by_mpi(Coll coll, const NodeLayout& nodes, DType t, bool two_level) {
  if (coll == Coll::allgather) return true;  // moves bytes, whatever the dtype
  return mpi_type(t) != MPI_DATATYPE_NULL &&
         !(coll == Coll::allreduce && two_level && nodes.ranks_per_node && t == DType::f32);
}

void allreduce_call(MPI_Comm comm, const void* x, void* y, const CollArgs& a, std::optional<Skip>& skip) {
  CommInfo ci(comm);
  const Config cfg = config();
  CallScope scope(cfg, comm);
  Signature sig = signature(Coll::allreduce, a, ci, cfg, comm, skip);
  Recorder rec(Coll::allreduce, ci, bytes_in(Coll::allreduce, a, ci.size), skip);
  const double scale = a.avg ? 1.0 / ci.size : 1.0;
  Engine& e = engine_of(a);
  const size_t bytes = a.count * dtype_size(a.dtype);

  // The data rides along with the agreement, summed at each recursive-doubling step (16-bit
  // floats as float32, everything else in its own type): when small, and on two ranks at any
  // size, since there recursive doubling moves no more data than MPI's reduce-scatter +
  // allgather and saves a round of latency (codec auto's flat path, the MPI library's own
  // allreduce, excepted above eager_bytes).
  MPI_Datatype mt = mpi_type(a.dtype);
  const bool small = bytes <= cfg.eager_bytes;
  sig.eager = (small || !sig.mpi_own) && rides_agreement(sig, cfg, small, ci.size == 2 && mt != MPI_DATATYPE_NULL);
  const bool by_host = sig.wire == CodecId::none && (sig.eager || mt != MPI_DATATYPE_NULL);
  if (const size_t piece = piece_count(a, sig, cfg, by_host)) {
    rec.algo = sig.eager ? Algo::eager : Algo::mpi;
    return in_pieces(comm, sig, x, y, a, piece);
  }
  if (a.engine && by_host) return via_host(Coll::allreduce, comm, x, bytes, y, bytes, a, cfg);
  rec.algo = sig.eager ? Algo::eager : Algo::mpi;
  double top = 0;
  double* most = largest_input(a, sig, x, a.count, top);
  const void* in = x;
  if (sig.eager) {
    if (most) in = kept(a, ci.size, x, y, bytes);
    eager_sum(comm, sig, e, Payload::sum, a.dtype, x, a.count, 0, a.count, a.avg, ci.size, y, most);
    if (!most) return;
  } else {
    agree(comm, sig, most);
  }
  if (a.count == 0) return;
  const NodeLayout& nodes = node_layout(comm);
  const bool two_level = !sig.flat && nodes.hierarchical();
  const bool by_mpi = uncompressed_by_mpi(Coll::allreduce, nodes, a.dtype, two_level);
  auto mpi_sum = [&](const void* from) {
    rec.algo = Algo::mpi;
    mpi_collective("MPI_Allreduce", [&](mpic::Requests* rs) {
      mpic::allreduce(from == y ? MPI_IN_PLACE : from, y, a.count, mt, MPI_SUM, comm, rs);
    });
    if (a.avg) divide(y, a.dtype, a.count, ci.size);
  };
  // (Codec bound's sums first learn whether MPI's keep its bound: bounded.)
  if (sig.wire == CodecId::none && by_mpi && !most) return mpi_sum(x);
  FrameDamage damage;
  const CodecId ran = bounded(
      comm, ci, sig, cfg, a, top, in, a.count, y, a.count, scale, two_level ? nodes.nodes : ci.size, true, sig.eager,
      skip, [&](const Tiling& U, const void* from) {
        if (U.wire.id == CodecId::none && by_mpi) return mpi_sum(from);
        float* res = residual_of(U, a);
        rec.algo = two_level ? Algo::two_level : Algo::flat;
        if (two_level) return two_level_allreduce(nodes, e, U, from, y, a.count, res, scale, damage);
        Links links(nodes);
        flat_allreduce(comm, ci, e, U, from, y, a.count, res, scale, damage);
      });
  if (is_framed(ran)) check_frames(comm, ci, damage);
}

void reduce_scatter_call(MPI_Comm comm, const void* x, void* y, const CollArgs& a, std::optional<Skip>& skip) {
  CommInfo ci(comm);
  const Config cfg = config();
  CallScope scope(cfg, comm);
  Signature sig = signature(Coll::reduce_scatter, a, ci, cfg, comm, skip);
  Recorder rec(Coll::reduce_scatter, ci, bytes_in(Coll::reduce_scatter, a, ci.size), skip);
  const double scale = a.avg ? 1.0 / ci.size : 1.0;
  Engine& e = engine_of(a);
  // The data rides along with the agreement when small, and on two ranks at any size (each
  // sends the half the other keeps, as MPI does; 16-bit floats would travel widened, so
  // large ones take the path below).
  const size_t total = a.count * ci.size;
  MPI_Datatype mt = mpi_type(a.dtype);
  sig.eager = rides_agreement(sig, cfg, total * dtype_size(a.dtype) <= cfg.eager_bytes,
                              ci.size == 2 && mt != MPI_DATATYPE_NULL);
  if (a.engine && sig.wire == CodecId::none && (sig.eager || mt != MPI_DATATYPE_NULL))
    return via_host(Coll::reduce_scatter, comm, x, total * dtype_size(a.dtype), y, a.count * dtype_size(a.dtype), a,
                    cfg);
  rec.algo = sig.eager ? Algo::eager : Algo::mpi;
  double top = 0;
  double* most = largest_input(a, sig, x, total, top);
  if (sig.eager) {  // x is left as it is
    eager_sum(comm, sig, e, Payload::halve, a.dtype, x, total, a.count * ci.rank, a.count, a.avg, ci.size, y, most);
    if (!most) return;
  } else {
    agree(comm, sig, most);
  }
  if (a.count == 0) return;
  auto mpi_sum = [&](const void* from) {
    rec.algo = Algo::mpi;
    mpi_collective("MPI_Reduce_scatter_block",
                   [&](mpic::Requests* rs) { mpic::reduce_scatter_block(from, y, a.count, mt, MPI_SUM, comm, rs); });
    if (a.avg) divide(y, a.dtype, a.count, ci.size);
  };
  const NodeLayout& nodes = node_layout(comm);
  const bool two_level = !sig.flat && two_level_blocks(nodes);
  const bool by_mpi = uncompressed_by_mpi(Coll::reduce_scatter, nodes, a.dtype, two_level);
  // (Codec bound's sums first learn whether MPI's keep its bound: bounded.)
  if (sig.wire == CodecId::none && by_mpi && !most) return mpi_sum(x);
  FrameDamage damage;
  const CodecId ran = bounded(
      comm, ci, sig, cfg, a, top, x, total, y, a.count, scale, (two_level ? nodes.nodes : ci.size) - 1, true, sig.eager,
      skip, [&](const Tiling& U, const void* in) {
        if (U.wire.id == CodecId::none && by_mpi) return mpi_sum(in);
        float* res = residual_of(U, a);
        rec.algo = two_level ? Algo::two_level : Algo::flat;
        if (two_level) return two_level_reduce_scatter(nodes, e, U, in, y, a.count, res, scale, damage);
        // Output of the sums' own dtype (float32, float64) is their accumulator: the sums
        // are written once, where a scratch accumulator took them through memory twice
        // more, out and back for the store (10 Gbit/s, 2 ranks, 64 MiB int4:
        // docs/measurements.md).
        const bool into_y = U.sum_t == a.dtype;
        void* acc = into_y ? y : e.scratch(0, a.count * dtype_size(U.sum_t));
        Links links(nodes);
        ReduceScatterStage(comm, ci, e, U.wire, a.dtype, equal_layout(ci.size, a.count, U.seg), in, res, U.sum_t, acc,
                           damage)
            .finish();
        if (!into_y || scale != 1.0) e.store(U.sum_t, acc, a.count, scale, a.dtype, y);
      });
  if (is_framed(ran)) check_frames(comm, ci, damage);
}

void allgather_call(MPI_Comm comm, const void* x, void* y, const CollArgs& a, std::optional<Skip>& skip) {
  CommInfo ci(comm);
  const Config cfg = config();
  CallScope scope(cfg, comm);
  Signature sig = signature(Coll::allgather, a, ci, cfg, comm, skip);
  Recorder rec(Coll::allgather, ci, bytes_in(Coll::allgather, a, ci.size), skip);
  // The blocks ride along with the agreement, each received straight into place, when small
  // and on two ranks at any size (there it is MPI's own exchange). Bytes, whatever the dtype.
  const size_t block = a.count * dtype_size(a.dtype);
  sig.eager = rides_agreement(sig, cfg, block * ci.size <= cfg.eager_bytes, ci.size == 2);
  if (a.engine && sig.wire == CodecId::none)
    return via_host(Coll::allgather, comm, x, block, y, block * ci.size, a, cfg);
  rec.algo = sig.eager ? Algo::eager : Algo::mpi;
  if (sig.eager) return eager_collective(comm, sig, Payload{Payload::gather, x, y, block});
  double top = 0;
  agree(comm, sig, largest_input(a, sig, x, a.count, top));
  if (a.count == 0) return;
  MPI_Datatype mt = mpi_type(a.dtype);
  if (sig.wire == CodecId::none) {
    // Any dtype: gathering moves bytes without arithmetic.
    MPI_Datatype bt = mt != MPI_DATATYPE_NULL ? mt : MPI_UINT16_T;
    mpi_collective("MPI_Allgather", [&](mpic::Requests* rs) { mpic::allgather(x, y, a.count, bt, comm, rs); });
    return;
  }
  Engine& e = engine_of(a);
  FrameDamage damage;
  const NodeLayout& nodes = node_layout(comm);
  const bool two_level = !sig.flat && two_level_blocks(nodes);
  rec.algo = two_level ? Algo::two_level : Algo::flat;
  const CodecId ran = bounded(comm, ci, sig, cfg, a, top, x, a.count, y, a.count * ci.size, 1.0, 1, false, false, skip,
                              [&](const Tiling& U, const void*) {
                                float* res = residual_of(U, a);
                                if (two_level) return two_level_allgather(nodes, e, U, x, y, a.count, res, damage);
                                Links links(nodes);
                                AllgatherStage(comm, ci, e, U.wire, a.dtype, equal_layout(ci.size, a.count, U.seg), x,
                                               res, a.dtype, y, 1.f, U.stream, damage)
                                    .finish();
                              });
  if (is_framed(ran)) check_frames(comm, ci, damage);
}

using Call = void (*)(MPI_Comm, const void*, void*, const CollArgs&, std::optional<Skip>&);

Call call_of(Coll coll) {
  return coll == Coll::allreduce ? allreduce_call : coll == Coll::reduce_scatter ? reduce_scatter_call : allgather_call;
}

// What codec "auto" follows a call with on every rank (adaptive.h): the measurement after a
// communicator's first call of its kind, the checks; its probes call `coll` as asked.
void after(Coll coll, MPI_Comm comm, const void* x, const CollArgs& a, std::optional<Skip> skip, size_t bytes_in,
           double seconds) {
  auto_after(comm, coll, a, x, bytes_in, skip, seconds,
             [&](const CollArgs& p, const void* px, void* py) {
               std::optional<Skip> unused;
               Inside probing(t_probe);
               call_of(coll)(comm, px, py, p, unused);
             });
}

void run(Coll coll, MPI_Comm comm, const void* x, void* y, const CollArgs& a) {
  std::optional<Skip> skip;
  if (!a.adaptive) return call_of(coll)(comm, x, y, a, skip);
  if (a.engine)  // the Python layer refuses it first (mpicomp.auto)
    throw Error(ErrorKind::backend, "codec 'auto' runs on host buffers only; name the codec for GPU buffers");
  call_of(coll)(comm, x, y, a, skip);
  after(coll, comm, x, a, skip, t_counted.bytes_in, t_counted.seconds);
}

}  // namespace

void allreduce(MPI_Comm comm, const void* x, void* y, const CollArgs& a) { run(Coll::allreduce, comm, x, y, a); }
void reduce_scatter(MPI_Comm comm, const void* x, void* y, const CollArgs& a) {
  run(Coll::reduce_scatter, comm, x, y, a);
}
void allgather(MPI_Comm comm, const void* x, void* y, const CollArgs& a) { run(Coll::allgather, comm, x, y, a); }

std::array<size_t, 2> flat_differs(Coll coll, MPI_Comm comm, const CollArgs& a) {
  const Config cfg = config();
  if (cfg.hierarchy == Hierarchy::flat) return {0, 0};
  const NodeLayout& nodes = node_layout(comm);
  const bool two = coll == Coll::allreduce ? nodes.hierarchical() : two_level_blocks(nodes);
  constexpr size_t all = SIZE_MAX;
  // Uncompressed data that rides the agreement crosses between nodes in one lane on two
  // levels and in every lane flat (handshake.h): another path wherever a node has two lanes,
  // also where MPI's own collective moves larger calls either way.
  const size_t rides = !nodes.hierarchical() || nodes.lanes < 2 ? 0
                       : coll == Coll::allgather      ? cfg.eager_bytes / nodes.node_of.size()
                                                      : cfg.eager_bytes;
  const bool plain = two && !(uncompressed_by_mpi(coll, nodes, a.dtype, true) &&
                              uncompressed_by_mpi(coll, nodes, a.dtype, false));
  return {plain ? all : rides, two ? all : 0};
}

void auto_passed(Coll coll, MPI_Comm comm, const void* x, const CollArgs& a, Skip why, double seconds) {
  after(coll, comm, x, a, why, bytes_in(coll, a, CommInfo(comm).size), seconds);
}

void collective(Coll coll, MPI_Comm comm, const void* x, void* y, const CollArgs& a) { run(coll, comm, x, y, a); }

}  // namespace mpicomp
