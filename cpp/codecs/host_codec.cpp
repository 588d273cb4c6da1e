#include "host_codec.h"

#include <vector>

#include "../core/errors.h"
#include "codec.h"
#include "lossless.h"

namespace mpicomp {

size_t host_encode(Spec s, DType t, const void* x, size_t n, float* residual, uint8_t* out) {
  if (is_lossless(s.id)) return host_frame_encode(s.id, static_cast<const uint8_t*>(x), n * dtype_size(t), out);
  cpu_kernels().encode(s, t, x, n, residual, out);
  return encoded_bytes(s, t, n);
}

void require_unscaled(float scale) {
  if (scale != 1.f) throw Error(ErrorKind::argument, "a lossless codec restores bytes: it cannot scale them");
}

void host_decode(Spec s, DType t, const uint8_t* in, size_t n, float scale, void* y) {
  if (!is_lossless(s.id)) return cpu_kernels().decode(s, t, in, n, scale, y);
  require_unscaled(scale);
  host_frame_decode(s.id, in, n * dtype_size(t), static_cast<uint8_t*>(y));
}

void host_decode_accumulate(Spec s, DType t, const uint8_t* in, size_t n, float* acc) {
  if (!is_lossless(s.id)) return cpu_kernels().decode_accumulate(s, t, in, n, acc);
  thread_local std::vector<uint8_t> raw;
  raw.resize(n * dtype_size(t));
  host_frame_decode(s.id, in, raw.size(), raw.data());
  cpu_kernels().decode_accumulate(Spec{}, t, raw.data(), n, acc);
}

}  // namespace mpicomp
