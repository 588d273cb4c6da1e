// The three collectives: each call agrees with the other ranks on what it sends, then takes
// the path that moves it (MPI's own collective, the agreement's eager exchange, the flat or
// two-level pipelines); call.h holds the parts they share.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>

#include "adaptive.h"
#include "algorithms.h"
#include "call.h"
#include "coll.h"
#include "config.h"
#include "deadline.h"
#include "mpi_count.h"
#include "stages.h"
#include "stats.h"

namespace mpicomp {
namespace {

using namespace call;

std::mutex g_config_mutex;
Config g_config;
std::atomic<bool> g_verbose{Config{}.verbose};

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
