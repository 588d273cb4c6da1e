#include "host_codec.h"

#include <algorithm>
#include <cstdint>
#include <vector>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "bound.h"
#include "errors.h"
#include "codec.h"
#include "lossless.h"
#include "parallel.h"

namespace mpicomp {

namespace {

// Lossy codecs' work over codec_threads() threads: elements cut into ranges on block
// boundaries (records are whole, in place: the bytes of one range start at the encoded size
// of the elements before it), at least kMinElems each. Lossless frames share their chunks
// out themselves (lossless.cpp).
constexpr size_t kMinElems = size_t(1) << 16;

template <class F>
void in_ranges(Spec s, size_t n, F&& f) {
  const size_t g = is_blockwise(s.id) ? s.block : kLanes;
  const size_t units = (n + g - 1) / g;
  parallel_ranges(units, kMinElems / g, [&](size_t a, size_t b) {
    const size_t first = a * g, last = std::min(n, b * g);
    if (last > first) f(first, last - first);
  });
}

// Copies n floats to y with streaming (non-temporal) stores: y's lines are written without
// first being read into the cache (write-allocate). Other threads see them after a fence().
void stream_floats(const float* src, size_t n, float* y) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i < n && (reinterpret_cast<uintptr_t>(y + i) & 15); ++i) y[i] = src[i];
  for (; i + 4 <= n; i += 4) _mm_stream_ps(y + i, _mm_loadu_ps(src + i));
#endif
  for (; i < n; ++i) y[i] = src[i];
}
void fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

const uint8_t* at(const void* p, size_t bytes) { return static_cast<const uint8_t*>(p) + bytes; }
uint8_t* at(void* p, size_t bytes) { return static_cast<uint8_t*>(p) + bytes; }

}  // namespace

size_t host_encode(Spec s, DType t, const void* x, size_t n, float* residual, uint8_t* out) {
  // Codec bound keeps its bound in every call: error feedback does not apply (its residual
  // is left as it is).
  if (s.id == CodecId::bound) return bound_encode(s, t, x, n, out);
  if (is_lossless(s.id)) return host_frame_encode(s, dtype_size(t), static_cast<const uint8_t*>(x), n * dtype_size(t), out);
  const CpuKernels& k = cpu_kernels();
  in_ranges(s, n, [&](size_t first, size_t len) {
    k.encode(s, t, at(x, first * dtype_size(t)), len, residual ? residual + first : nullptr,
             at(out, encoded_bytes(s, t, first)));
  });
  return encoded_bytes(s, t, n);
}

void require_unscaled(float scale) {
  if (scale != 1.f) throw Error(ErrorKind::argument, "a lossless codec restores bytes: it cannot scale them");
}

void host_decode(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y, bool stream) {
  if (s.id == CodecId::bound) return bound_decode(in, n, scale, t, y);
  if (!is_lossless(s.id)) {
    const CpuKernels& k = cpu_kernels();
    if (stream && t == DType::f32) {
      // Decoded a few blocks at a time into a buffer that stays in L1, then streamed out.
      const size_t step = is_blockwise(s.id) ? std::max<size_t>(1, 4096 / s.block) * s.block : 4096;
      return in_ranges(s, n, [&](size_t first, size_t len) {
        thread_local std::vector<float> buf;
        buf.resize(step);
        for (size_t i = 0; i < len; i += step) {
          const size_t m = std::min(step, len - i);
          k.decode(s, t, in + encoded_bytes(s, t, first + i), m, scale, buf.data());
          stream_floats(buf.data(), m, static_cast<float*>(y) + first + i);
        }
        fence();  // once per range: a fence waits for the streamed lines to reach memory
      });
    }
    return in_ranges(s, n, [&](size_t first, size_t len) {
      k.decode(s, t, in + encoded_bytes(s, t, first), len, scale, at(y, first * dtype_size(t)));
    });
  }
  require_unscaled(scale);
  host_frame_decode(s, in, n * dtype_size(t), static_cast<uint8_t*>(y));
}

namespace {

// acc = base + x in float64: float64 elements as they were sent, or as a lossless frame
// restored them, or (t other than float64: codec bound's sums) any float dtype, widened.
void add_f64(const double* base, DType t, const void* x, size_t n, double* acc) {
  in_ranges(Spec{}, n, [&](size_t first, size_t len) {
    if (t == DType::f64)
      for (size_t i = first; i < first + len; ++i) acc[i] = base[i] + static_cast<const double*>(x)[i];
    else
      for (size_t i = first; i < first + len; ++i) acc[i] = base[i] + double(load_f32(x, t, i));
  });
}

}  // namespace

void host_decode_accumulate(Spec s, DType t, const uint8_t* in, size_t n, DType sum_t, void* acc_, const void* base_) {
  if (!base_) base_ = acc_;
  if (s.id == CodecId::bound) return bound_decode_accumulate(in, n, sum_t, acc_, base_);
  // Exact input of any float dtype adds to float64 sums (codec bound's).
  if (sum_t == DType::f64 && s.id == CodecId::none && is_float(t))
    return add_f64(static_cast<const double*>(base_), t, in, n, static_cast<double*>(acc_));
  if (sum_t != acc_dtype(s.id, t) && sum_t != DType::f32)
    throw Error(ErrorKind::argument, std::string("codec '") + codec_name(s.id) + "' cannot sum " + dtype_name(t) +
                                         " in " + dtype_name(sum_t));
  float* acc = static_cast<float*>(acc_);
  const float* base = static_cast<const float*>(base_);
  if (!is_lossless(s.id)) {
    const CpuKernels& k = cpu_kernels();
    return in_ranges(s, n, [&](size_t first, size_t len) {
      k.decode_accumulate(s, t, in + encoded_bytes(s, t, first), len, base + first, acc + first);
    });
  }
  thread_local std::vector<uint8_t> raw;
  raw.resize(n * dtype_size(t));
  host_frame_decode(s, in, raw.size(), raw.data());
  const uint8_t* bytes = raw.data();  // not `raw` in the lambda: that names each worker's own
  if (sum_t == DType::f64)
    return add_f64(static_cast<const double*>(base_), t, bytes, n, static_cast<double*>(acc_));
  const CpuKernels& k = cpu_kernels();
  in_ranges(Spec{}, n, [&](size_t first, size_t len) {
    k.decode_accumulate(Spec{}, t, bytes + first * dtype_size(t), len, base + first, acc + first);
  });
}

void host_store(DType sum_t, const void* acc, size_t n, double scale, DType t, void* y) {
  if (sum_t == DType::f32) return cpu_kernels().store(static_cast<const float*>(acc), n, float(scale), t, y);
  // float64 sums: of float64 data, or codec bound's of any float dtype, rounded once to it.
  const double* a = static_cast<const double*>(acc);
  in_ranges(Spec{}, n, [&](size_t first, size_t len) {
    if (t == DType::f64)
      for (size_t i = first; i < first + len; ++i) static_cast<double*>(y)[i] = scale == 1.0 ? a[i] : a[i] * scale;
    else
      for (size_t i = first; i < first + len; ++i) store_f32(y, t, i, float(saturated(a[i] * scale, t)));
  });
}

}  // namespace mpicomp
