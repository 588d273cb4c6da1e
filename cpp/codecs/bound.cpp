#include "bound.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "blosc.h"
#include "errors.h"
#include "lossless.h"
#include "parallel.h"

namespace mpicomp {
namespace {

// The loops below are compiled for AVX2 too, chosen at load time (GCC's and Clang's function
// multiversioning; the rest of the codecs dispatch by hand, cpu_dispatch.cpp): 4 doubles per
// instruction instead of 2.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MPICOMP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MPICOMP_CLONES
#endif

// The step is 2 e / kMargin rather than 2 e: x / step is rounded to its code in float64
// (relative error 2^-52, at most 2^-12 of a step for codes up to kWide) and the code times
// the step is rounded again (2^-13 of a step), so a value decodes within
// step * (1/2 + 2^-12 + 2^-13) < e of what it was.
constexpr double kMargin = 1.0 + 1.0 / 256;
constexpr double kWide = 1099511627776.0;  // 2^40: the largest code
constexpr double kNarrow = 536870912.0;    // 2^29: codes (and their differences) fit 4 bytes

double load(DType t, const void* x, size_t i) {
  return t == DType::f64 ? static_cast<const double*>(x)[i] : double(load_f32(x, t, i));
}

// The codes' lossless frame: Blosc2, bit shuffle, lz4 (or zstd) at level 1.
Spec codes_spec(uint32_t block) { return Spec{CodecId::blosc, blosc_options(block & kBoundLz4 ? 1 : 5, 2, 1)}; }

// NaN, +Inf and -Inf take the three most negative codes, which no finite value reaches.
template <class C>
constexpr C kNaNCode = std::numeric_limits<C>::min();

// d + kRound - kRound is d rounded to the nearest integer, ties to even, for |d| < 2^51: two
// additions that vectorise on every x86-64 (nearbyint is a library call without SSE4.1). The
// build keeps it (-ffp-contract=off, no -ffast-math).
constexpr double kRound = 6755399441055744.0;  // 1.5 * 2^52

// Bits of a float or double, and those of its exponent field: all set for NaN and +/-Inf.
template <class S>
using Bits = std::conditional_t<sizeof(S) == 4, uint32_t, uint64_t>;
template <class S>
constexpr Bits<S> kExponent = sizeof(S) == 4 ? Bits<S>(0x7f800000u) : Bits<S>(0x7ff0000000000000ull);

// How many of x are NaN or Inf, from their bits: integer compares vectorise where a float
// compare with NaN in play does not.
template <class S>
size_t nonfinite(const S* x, size_t len) {
  size_t bad = 0;
  for (size_t i = 0; i < len; ++i) {
    Bits<S> b;
    std::memcpy(&b, x + i, sizeof b);
    bad += (b & kExponent<S>) == kExponent<S>;
  }
  return bad;
}

// Codes of len elements of x (float or double) into q, zigzag-coded; true when they are the
// differences of neighbours' codes (never for a chunk holding NaN or Inf, whose codes do not
// subtract).
template <class S, class C>
MPICOMP_CLONES bool quantize_chunk(const S* x, size_t len, double inv, C* q) {
  using U = std::make_unsigned_t<C>;
  const bool special = nonfinite(x, len) > 0;
  for (size_t i = 0; i < len; ++i) q[i] = C((double(x[i]) * inv + kRound) - kRound);
  if (special)
    for (size_t i = 0; i < len; ++i) {
      const double v = double(x[i]);
      if (!(std::fabs(v) <= DBL_MAX)) q[i] = v != v ? kNaNCode<C> : C(kNaNCode<C> + (v > 0 ? 1 : 2));
    }
  // Codes or differences: whichever has the smaller sum of magnitudes, judged on every
  // fourth element (the choice only costs ratio, never accuracy).
  uint64_t plain = 0, diff = 0;
  for (size_t i = 4; i < len && !special; i += 4) {
    const int64_t a = int64_t(q[i]), d = a - int64_t(q[i - 1]);
    plain += uint64_t(a < 0 ? -a : a), diff += uint64_t(d < 0 ? -d : d);
  }
  const bool delta = !special && diff < plain;
  if (delta)
    for (size_t i = len; i-- > 1;) q[i] = C(U(q[i]) - U(q[i - 1]));
  for (size_t i = 0; i < len; ++i) q[i] = C(U(U(q[i]) << 1) ^ U(q[i] >> (8 * sizeof(C) - 1)));
  return delta;
}

// Codes of elements [first, first + len) of x (dtype t): 16-bit floats widened to float first.
template <class C>
bool quantize_range(DType t, const void* x, size_t first, size_t len, double inv, C* q) {
  if (t == DType::f64) return quantize_chunk(static_cast<const double*>(x) + first, len, inv, q);
  if (t == DType::f32) return quantize_chunk(static_cast<const float*>(x) + first, len, inv, q);
  thread_local std::vector<float> wide;
  wide.resize(len);
  for (size_t i = 0; i < len; ++i) wide[i] = load_f32(x, t, first + i);
  return quantize_chunk(wide.data(), len, inv, q);
}

// The values of len codes (zigzag-coded, of type C) at bytes.
template <class C>
MPICOMP_CLONES void dequantize_chunk(const uint8_t* bytes, size_t len, bool delta, double step, double* v) {
  using U = std::make_unsigned_t<C>;
  thread_local std::vector<C> codes;
  codes.resize(len);
  C* q = codes.data();
  std::memcpy(q, bytes, len * sizeof(C));
  for (size_t i = 0; i < len; ++i) q[i] = C((U(q[i]) >> 1) ^ (U(0) - (U(q[i]) & 1)));
  if (delta) {
    U run = 0;
    for (size_t i = 0; i < len; ++i) q[i] = C(run += U(q[i]));
  }
  C low = 0;
  for (size_t i = 0; i < len; ++i) low = std::min(low, q[i]);
  for (size_t i = 0; i < len; ++i) v[i] = double(q[i]) * step;
  if (delta || low > C(kNaNCode<C> + 2)) return;
  for (size_t i = 0; i < len; ++i)
    if (q[i] <= C(kNaNCode<C> + 2))
      v[i] = q[i] == kNaNCode<C> ? std::numeric_limits<double>::quiet_NaN()
                                 : (q[i] == C(kNaNCode<C> + 1) ? 1 : -1) * std::numeric_limits<double>::infinity();
}

// Calls emit(first, values, len) for every chunk of decoded values (on several threads).
template <class Emit>
void decode_values(const uint8_t* in, size_t n, const Emit& emit) {
  if (!n) return;
  double step;
  std::memcpy(&step, in, sizeof step);
  const size_t w = in[8];
  if (!(w == 4 || w == 8) || !(step > 0 && step <= DBL_MAX))
    throw Error(ErrorKind::codec, "corrupt bound frame: its head names " + std::to_string(w) + "-byte codes and step " +
                                      shown(step));
  const size_t code_bytes = n * w, per = kChunkBytes / w;
  host_frame_decode(codes_spec(0), in + bound_head_bytes(code_bytes), code_bytes,
                    [&](size_t i, const uint8_t* bytes, size_t len) {
                      thread_local std::vector<double> v;
                      v.resize(per);
                      const bool delta = (in[kBoundHead + i / 8] >> (i % 8)) & 1;
                      if (w == 4)
                        dequantize_chunk<int32_t>(bytes, len / w, delta, step, v.data());
                      else
                        dequantize_chunk<int64_t>(bytes, len / w, delta, step, v.data());
                      emit(i * per, v.data(), len / w);
                    });
}

// The largest finite |x|, from the bits: for non-negative floats integer order is float order,
// and NaN and Inf (exponent all ones) are left out.
template <class T>
MPICOMP_CLONES T absmax_of(const T* x, size_t n) {
  using B = std::make_signed_t<Bits<T>>;
  B m = 0;
  for (size_t i = 0; i < n; ++i) {
    Bits<T> b;
    std::memcpy(&b, x + i, sizeof b);
    const B a = B(b & ~(Bits<T>(1) << (8 * sizeof(T) - 1)));  // |x|
    m = std::max(m, a < B(kExponent<T>) ? a : B(0));
  }
  T v;
  std::memcpy(&v, &m, sizeof v);
  return v;
}

}  // namespace

std::string shown(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", v);
  return b;
}

uint32_t bound_options(double bound, bool relative, bool lz4, bool stage) {
  uint64_t bits;
  std::memcpy(&bits, &bound, sizeof bits);
  return (uint32_t(bits >> 32) & kBoundBits) | (relative ? kBoundRel : 0u) | (lz4 ? kBoundLz4 : 0u) |
         (stage ? kBoundStage : 0u);
}

double finite_absmax(DType t, const void* x, size_t n) {
  std::mutex m;
  double best = 0;
  parallel_ranges((n + 4095) / 4096, 64, [&](size_t a, size_t b) {
    const size_t first = a * 4096, len = std::min(n, b * 4096) - first;
    double v = 0;
    if (t == DType::f64)
      v = absmax_of(static_cast<const double*>(x) + first, len);
    else if (t == DType::f32)
      v = absmax_of(static_cast<const float*>(x) + first, len);
    else
      for (size_t i = first; i < first + len; ++i) {
        const double a = std::fabs(load(t, x, i));
        v = std::max(v, a <= DBL_MAX ? a : 0.0);
      }
    std::lock_guard<std::mutex> g(m);
    best = std::max(best, v);
  });
  return best;
}

size_t bound_encode(Spec s, DType t, const void* x, size_t n, uint8_t* out) {
  if (!n) return 0;
  const double m = finite_absmax(t, x, n);
  const double asked = bound_value(s.block) * (bound_relative(s.block) ? m : 1.0);
  // What rounding the decoded values back to t may add is set aside (a collective's budget
  // set aside its output's rounding already).
  const double rounding = s.block & kBoundStage ? 0 : bound_rounding(t) * (m + asked) + bound_underflow(t);
  const double e = asked - rounding;
  if (m > 0 && !(rounding <= asked / 2))
    throw Error(ErrorKind::codec, "codec bound: a bound of " + shown(asked) + " cannot be kept on " + dtype_name(t) +
                                      " values of magnitude up to " + shown(m) + " (rounding to " + dtype_name(t) +
                                      " alone errs by up to " + shown(rounding) + "); ask for at least " +
                                      shown(2.02 * bound_rounding(t) * m + 2 * bound_underflow(t)));
  // No finite value but zeros: any step is exact. A bound near float64's largest: the largest step.
  const double step = m > 0 && e > 0 ? std::min(2 * (e / kMargin), DBL_MAX) : 1.0;
  if (m / step > kWide)
    throw Error(ErrorKind::codec, "codec bound: a bound of " + shown(asked) + " on values of magnitude up to " +
                                      shown(m) + " takes more than 2^40 quantisation steps; ask for at least " +
                                      shown(1.01 * m / kWide) + ", or use a lossless codec");
  const size_t w = m / step <= kNarrow ? 4 : 8, code_bytes = n * w, per = kChunkBytes / w;
  const size_t head = bound_head_bytes(code_bytes), chunks = frame_chunks(code_bytes);
  std::memset(out, 0, head);
  std::memcpy(out, &step, sizeof step);
  out[8] = uint8_t(w);
  std::vector<uint8_t> delta(chunks);
  const double inv = 1 / step;
  const size_t frame = host_frame_encode(codes_spec(s.block), w, code_bytes, out + head, [&](size_t i, size_t len) {
    thread_local std::vector<int64_t> codes;
    codes.resize(kChunkBytes / 8);
    if (w == 4)
      delta[i] = quantize_range(t, x, i * per, len / w, inv, reinterpret_cast<int32_t*>(codes.data()));
    else
      delta[i] = quantize_range(t, x, i * per, len / w, inv, codes.data());
    return reinterpret_cast<const uint8_t*>(codes.data());
  });
  for (size_t i = 0; i < chunks; ++i) out[kBoundHead + i / 8] |= uint8_t(delta[i] << (i % 8));
  return head + frame;
}

void bound_decode(const uint8_t* in, size_t n, double scale, DType t, void* y) {
  decode_values(in, n, [&](size_t first, const double* v, size_t len) {
    if (t == DType::f64)
      for (size_t i = 0; i < len; ++i) static_cast<double*>(y)[first + i] = v[i] * scale;
    else if (t == DType::f32)
      for (size_t i = 0; i < len; ++i) static_cast<float*>(y)[first + i] = float(saturated(v[i] * scale, t));
    else
      for (size_t i = 0; i < len; ++i) store_f32(y, t, first + i, float(saturated(v[i] * scale, t)));
  });
}

void bound_decode_accumulate(const uint8_t* in, size_t n, DType sum_t, void* acc, const void* base) {
  if (!base) base = acc;
  decode_values(in, n, [&](size_t first, const double* v, size_t len) {
    if (sum_t == DType::f64) {
      const double* b = static_cast<const double*>(base) + first;
      double* a = static_cast<double*>(acc) + first;
      for (size_t i = 0; i < len; ++i) a[i] = b[i] + v[i];
    } else {
      const float* b = static_cast<const float*>(base) + first;
      float* a = static_cast<float*>(acc) + first;
      for (size_t i = 0; i < len; ++i) a[i] = b[i] + float(v[i]);
    }
  });
}

}  // namespace mpicomp
