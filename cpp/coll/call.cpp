#include "call.h"

#include <cstring>
#include <exception>

#include "../codecs/bound.h"
#include "adaptive.h"
#include "budget.h"
#include "deadline.h"
#include "scratch.h"
#include "stages.h"

namespace mpicomp::call {

Engine& engine_of(const CollArgs& a) { return a.engine ? *a.engine : cpu_engine(); }

thread_local bool t_inner = false;
thread_local bool t_probe = false;
thread_local Counted t_counted;

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

Recorder::~Recorder() {
  if (t_inner) return;
  Sent sent = take_sent_bytes();
  if (t_probe || std::uncaught_exceptions()) return;
  t_counted = {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(), bytes_in_};
  stats_record(coll_, size_, bytes_in_, sent, algo, t_counted.seconds, skip_ ? &*skip_ : nullptr);
}

void divide(void* y, DType t, size_t n, int size) {
  if (t == DType::f64) {
    double* d = static_cast<double*>(y);
    for (size_t i = 0; i < n; ++i) d[i] /= size;
  } else {  // float32, as the compressed paths do it
    cpu_engine().store(DType::f32, y, n, 1.0 / size, DType::f32, y);
  }
}

bool rides_agreement(const Signature& sig, const Config& cfg, bool small, bool pair) {
  return sig.wire == CodecId::none && cfg.eager_bytes && (small || pair);
}

double* largest_input(const CollArgs& a, const Signature& sig, const void* x, size_t n, double& top) {
  if (a.spec.id != CodecId::bound || a.engine || (sig.coll == Coll::allgather && sig.wire == CodecId::none))
    return nullptr;
  top = finite_absmax(a.dtype, x, n);
  return &top;
}

const void* kept(const CollArgs& a, int size, const void* x, const void* y, size_t bytes) {
  if (x != y || !(bound_relative(a.spec.block) || size > 2)) return x;
  thread_local Scratch copy;
  return std::memcpy(copy.get(bytes), x, bytes);
}

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

Tiling tiling(const Signature& sig, const CollArgs& a, const Config& cfg, int blocks) {
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

float* residual_of(const Tiling& T, const CollArgs& a) {
  return T.wire.id == CodecId::none || T.wire.id == CodecId::bound ? nullptr : a.residual;
}

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

}  // namespace mpicomp::call
